// libFuzzer harness: ranged uploads (server/rpc/ranged_upload.cc over PendingUploads) and ranged
// Downloads, through a real in-process FuseboxServer (CPU backend, loopback, a small store) and
// a gRPC client running a fuzzer-chosen script, one call after another on one channel.
//
// The input is a script; each step is a command byte c and its operands:
//   c % 8 == 0  CreateUpload: a dtype byte (signed), a rank byte (% 4), one byte per dim
//               (< 0xF0: b % 33; else 8 more bytes, any int64); an upload still open is
//               aborted first
//   c % 8 == 1  a WriteUpload stream of 1 + b % 4 ranges: each a flags byte (bit 0: offset -1;
//               bit 1: the message names another upload; bit 2: no upload_id on the first),
//               a 2-byte offset (% (size + 64)) and a 2-byte length (% 2049)
//   c % 8 == 2  the same stream, cancelled after its last message instead of closed
//   c % 8 == 3  CommitUpload; when it succeeds, a full Download and a ranged one (2-byte
//               offset and length, % (size + 64); a flags byte: bit 0 offset -1), then a free
//   c % 8 == 4  AbortUpload
//   c % 8 == 5  CommitUpload, AbortUpload and WriteUpload naming an id that never existed
//   c % 8 >= 6  a well-formed CreateUpload: float32 [1 + b % 64, 1 + b2 % 64]
// The end of the input aborts an upload still open. Data bytes are a function of their
// offset, so what the server holds can be checked byte for byte.
//
// It fails (abort) when a call's status is not what the protocol says (a model of it below:
// which ranges are written; a stream's ranges count only when it ends OK; an out-of-range
// write OUT_OF_RANGE, an overlapping or negative one or a stream naming no or two uploads
// INVALID_ARGUMENT, an unknown id NOT_FOUND, a commit with bytes missing FAILED_PRECONDITION;
// RESOURCE_EXHAUSTED is always allowed; a cancelled stream's claims may still refuse an
// overlapping write for a moment, since the client hears CANCELLED before the server's side
// of the call has ended), a committed tensor does not download as the bytes
// written, or the store is not empty again within 10 s of the script's end.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/core/request.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_server.h"

namespace fusebox {
namespace {

constexpr int kMaxSteps = 48;
constexpr char kFuzzerName[] = "ranged_upload_fuzzer";
constexpr char kTenant[] = "anonymous";
constexpr char kNever[] = "u00000000000000000000000000000000";

char ByteAt(int64_t offset) { return static_cast<char>(offset * 131 + 7); }
std::string Fill(int64_t offset, int64_t n) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = ByteAt(offset + i);
  return s;
}

void Expect(const grpc::Status& s, grpc::StatusCode want, const char* what) {
  if (s.error_code() == grpc::RESOURCE_EXHAUSTED) return;  // always allowed
  FUZZ_CHECK(s.error_code() == want, "%s ended %s, expected %s: %s", what,
             CodeName(s.error_code()), CodeName(want), s.error_message().c_str());
  if (!s.ok()) FUZZ_CHECK(!s.error_message().empty(), "%s: %s with no message", what, CodeName(want));
}

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return c;
}

// The upload open now, as the protocol says the server holds it.
struct Upload {
  std::string id;
  int64_t size = 0;
  std::vector<bool> written;        // per byte
  std::vector<bool> maybe_claimed;  // by a cancelled stream the server may not have ended
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
};

void Abort(FuzzServer& w, std::unique_ptr<Upload>* up, const std::string& id) {
  auto ctx = Ctx();
  v1::AbortUploadRequest req;
  req.set_upload_id(id);
  v1::AbortUploadResponse resp;
  const grpc::Status s = w.stub->AbortUpload(ctx.get(), req, &resp);
  Expect(s, *up ? grpc::OK : grpc::NOT_FOUND, "AbortUpload");
  if (s.ok()) FUZZ_CHECK(resp.freed_bytes() == (*up)->size, "AbortUpload freed the wrong size");
  up->reset();
}

void Create(FuzzServer& w, std::unique_ptr<Upload>* up, v1::DType dtype,
            const std::vector<int64_t>& shape) {
  if (*up) Abort(w, up, (*up)->id);
  auto ctx = Ctx();
  v1::CreateUploadRequest req;
  req.set_dtype(dtype);
  for (int64_t d : shape) req.add_shape(d);
  v1::CreateUploadResponse resp;
  const grpc::Status s = w.stub->CreateUpload(ctx.get(), req, &resp);
  auto dt = CheckedDType(dtype, "upload");
  auto bytes = dt.ok() ? CheckedBytes(*dt, req.shape(), "upload")
                       : absl::StatusOr<int64_t>(dt.status());
  Expect(s, bytes.ok() ? grpc::OK : grpc::INVALID_ARGUMENT, "CreateUpload");
  if (!s.ok()) return;
  FUZZ_CHECK(resp.size_bytes() == *bytes, "CreateUpload: %lld bytes, the shape makes %lld",
             static_cast<long long>(resp.size_bytes()), static_cast<long long>(*bytes));
  *up = std::make_unique<Upload>();
  (*up)->id = resp.upload_id();
  (*up)->size = *bytes;
  (*up)->written.assign(static_cast<size_t>(*bytes), false);
  (*up)->maybe_claimed.assign(static_cast<size_t>(*bytes), false);
  (*up)->dtype = dtype;
  (*up)->shape = shape;
}

// One message of a WriteUpload stream, as the script made it.
struct Range {
  uint8_t flags;
  int64_t offset, n;
};

// The status the protocol gives a stream of `ranges` (its first broken rule's), and the bytes it
// claims; `busy` bytes count as taken (written, or claimed by a cancelled stream the server may
// not have ended yet).
grpc::StatusCode Judge(const Upload* up, const std::vector<Range>& ranges,
                       const std::vector<bool>& busy, std::vector<bool>* mine) {
  const int64_t size = up ? up->size : 0;
  mine->assign(static_cast<size_t>(size), false);
  for (size_t r = 0; r < ranges.size(); ++r) {
    const Range& g = ranges[r];
    if (r == 0 && (g.flags & 4)) return grpc::INVALID_ARGUMENT;  // no upload_id
    if (r == 0 && !up) return grpc::NOT_FOUND;
    if (r > 0 && (g.flags & 2)) return grpc::INVALID_ARGUMENT;  // a second upload named
    if (g.offset < 0) return grpc::INVALID_ARGUMENT;
    if (g.offset > size || g.n > size - g.offset) return grpc::OUT_OF_RANGE;
    for (int64_t i = g.offset; i < g.offset + g.n; ++i) {
      if (busy[static_cast<size_t>(i)] || (*mine)[static_cast<size_t>(i)]) {
        return grpc::INVALID_ARGUMENT;  // overlaps
      }
    }
    for (int64_t i = g.offset; i < g.offset + g.n; ++i) (*mine)[static_cast<size_t>(i)] = true;
  }
  return grpc::OK;
}

void Write(FuzzServer& w, FuzzReader& in, Upload* up, bool cancel) {
  const int64_t size = up ? up->size : 0;
  std::vector<Range> ranges(1 + in.Byte() % 4);
  for (Range& g : ranges) {
    g.flags = in.Byte();
    g.offset = static_cast<int64_t>(in.Bytes(2) % static_cast<uint64_t>(size + 64));
    g.n = static_cast<int64_t>(in.Bytes(2) % 2049);
    if (g.flags & 1) g.offset = -1;
  }
  auto ctx = Ctx();
  v1::WriteUploadResponse resp;
  auto writer = w.stub->WriteUpload(ctx.get(), &resp);
  bool open = true;
  for (size_t r = 0; r < ranges.size() && open; ++r) {
    const Range& g = ranges[r];
    v1::WriteUploadRequest m;
    if (r == 0 && !(g.flags & 4)) m.set_upload_id(up ? up->id : kNever);
    if (r > 0 && (g.flags & 2)) m.set_upload_id(kNever);
    m.set_offset(g.offset);
    m.set_data(g.offset >= 0 ? Fill(g.offset, g.n) : std::string(static_cast<size_t>(g.n), 'x'));
    open = writer->Write(m);
  }
  if (cancel) {
    ctx->TryCancel();
  } else {
    writer->WritesDone();
  }
  const grpc::Status s = writer->Finish();
  std::vector<bool> mine;
  if (cancel) {
    // The stream never ended OK: whatever it claimed does not count (a broken rule may have
    // ended it before the cancel did). The client hears CANCELLED at once, and the server
    // takes the claims back when its side of the call ends, a moment later: until the next
    // commit or create, a write overlapping them may be refused.
    FUZZ_CHECK(!s.ok(), "a cancelled WriteUpload ended OK");
    // What it claimed before a broken rule ended it (Judge marks ranges up to the first
    // refused one) may be held a moment too.
    if (up) {
      Judge(up, ranges, up->written, &mine);
      for (size_t i = 0; i < mine.size(); ++i) {
        if (mine[i]) up->maybe_claimed[i] = true;
      }
    }
    return;
  }
  std::vector<bool> busy = up ? up->written : std::vector<bool>();
  for (size_t i = 0; i < busy.size(); ++i) busy[i] = busy[i] || up->maybe_claimed[i];
  std::vector<bool> mine_strict;
  const grpc::StatusCode strict = Judge(up, ranges, busy, &mine_strict);
  const grpc::StatusCode loose = Judge(up, ranges, up ? up->written : busy, &mine);
  Expect(s, s.error_code() == strict ? strict : loose, "WriteUpload");
  if (!s.ok() && up) {
    // A refused stream's earlier ranges were claimed; the server gives them back when its side
    // of the call ends, which may be after the client has the status.
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i]) up->maybe_claimed[i] = true;
    }
  }
  if (s.ok()) {
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i]) up->written[i] = true;
    }
    const int64_t missing = std::count(up->written.begin(), up->written.end(), false);
    FUZZ_CHECK(resp.missing_bytes() == missing, "WriteUpload says %lld bytes missing, not %lld",
               static_cast<long long>(resp.missing_bytes()), static_cast<long long>(missing));
  }
}

std::string Download(FuzzServer& w, const std::string& handle, int64_t offset, int64_t length,
                     grpc::Status* s) {
  auto ctx = Ctx();
  v1::DownloadRequest req;
  req.set_handle(handle);
  req.set_offset(offset);
  req.set_length(length);
  auto reader = w.stub->Download(ctx.get(), req);
  std::string got;
  v1::DownloadResponse part;
  while (reader->Read(&part)) got += part.data();
  *s = reader->Finish();
  return got;
}

void Commit(FuzzServer& w, FuzzReader& in, std::unique_ptr<Upload>* up) {
  auto ctx = Ctx();
  v1::CommitUploadRequest req;
  req.set_upload_id(*up ? (*up)->id : kNever);
  v1::CommitUploadResponse resp;
  const grpc::Status s = w.stub->CommitUpload(ctx.get(), req, &resp);
  const int64_t r_offset = static_cast<int64_t>(in.Bytes(2));
  const int64_t r_length = static_cast<int64_t>(in.Bytes(2));
  const uint8_t flags = in.Byte();
  if (!*up) return Expect(s, grpc::NOT_FOUND, "CommitUpload");
  const Upload& u = **up;
  const bool complete = std::find(u.written.begin(), u.written.end(), false) == u.written.end();
  Expect(s, complete ? grpc::OK : grpc::FAILED_PRECONDITION, "CommitUpload");
  if (!s.ok()) return;
  const v1::TensorInfo& t = resp.tensor();
  FUZZ_CHECK(t.dtype() == u.dtype && t.size_bytes() == u.size &&
                 std::vector<int64_t>(t.shape().begin(), t.shape().end()) == u.shape,
             "committed tensor: dtype %d, %lld bytes", static_cast<int>(t.dtype()),
             static_cast<long long>(t.size_bytes()));
  grpc::Status ds;
  const std::string all = Download(w, t.handle(), 0, 0, &ds);
  FUZZ_CHECK(ds.ok(), "Download: %s", ds.error_message().c_str());
  FUZZ_CHECK(all == Fill(0, u.size), "downloaded %zu bytes, wrote %lld (or other bytes)",
             all.size(), static_cast<long long>(u.size));
  const int64_t offset = flags & 1 ? -1 : r_offset % (u.size + 64);
  const int64_t length = r_length % (u.size + 64);
  const std::string part = Download(w, t.handle(), offset, length, &ds);
  if (offset < 0) {
    Expect(ds, grpc::INVALID_ARGUMENT, "a ranged Download at -1");
  } else if (offset > u.size || length > u.size - offset) {
    Expect(ds, grpc::OUT_OF_RANGE, "a ranged Download past the end");
  } else {
    Expect(ds, grpc::OK, "a ranged Download");
    if (ds.ok()) {
      FUZZ_CHECK(part == Fill(offset, length == 0 ? u.size - offset : length),
                 "a ranged Download at %lld of %lld came back wrong",
                 static_cast<long long>(offset), static_cast<long long>(length));
    }
  }
  auto fctx = Ctx();
  v1::FreeTensorRequest freq;
  freq.set_handle(t.handle());
  v1::FreeTensorResponse fresp;
  const grpc::Status fs = w.stub->FreeTensor(fctx.get(), freq, &fresp);
  FUZZ_CHECK(fs.ok() && fresp.freed_bytes() == u.size, "FreeTensor: %s",
             fs.error_message().c_str());
  up->reset();  // the id is spent
}

void Unknown(FuzzServer& w) {
  std::unique_ptr<Upload> none;
  auto ctx = Ctx();
  v1::CommitUploadRequest req;
  req.set_upload_id(kNever);
  v1::CommitUploadResponse resp;
  Expect(w.stub->CommitUpload(ctx.get(), req, &resp), grpc::NOT_FOUND, "CommitUpload of no id");
  Abort(w, &none, kNever);
}

}  // namespace
}  // namespace fusebox

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusebox;
  FuzzServer& w = TheFuzzServer(kFuzzerName);
  FuzzReader in(data, size);
  std::unique_ptr<Upload> up;
  for (int step = 0; step < kMaxSteps && !in.empty(); ++step) {
    const uint8_t c = in.Byte();
    switch (c % 8) {
      case 0: {
        const auto dtype = static_cast<v1::DType>(static_cast<int8_t>(in.Byte()));
        std::vector<int64_t> shape(in.Byte() % 4);
        for (auto& d : shape) {
          const uint8_t b = in.Byte();
          d = b < 0xF0 ? b % 33 : static_cast<int64_t>(in.Bytes(8));
        }
        Create(w, &up, dtype, shape);
        break;
      }
      case 1:
      case 2:
        Write(w, in, up.get(), c % 8 == 2);
        break;
      case 3:
        Commit(w, in, &up);
        break;
      case 4:
        Abort(w, &up, up ? up->id : kNever);
        break;
      case 5:
        Unknown(w);
        break;
      default:
        Create(w, &up, v1::FLOAT32, {1 + in.Byte() % 64, 1 + in.Byte() % 64});
        break;
    }
  }
  if (up) Abort(w, &up, up->id);
  CheckStoreEmpty(w, kTenant, "the script");
  return 0;
}
