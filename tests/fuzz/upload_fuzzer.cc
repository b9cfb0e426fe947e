// libFuzzer harness: the Upload protocol (server/rpc/upload.cc), through a real in-process
// FuseboxServer (CPU backend, loopback, a small store) and a gRPC client that sends a
// fuzzer-chosen sequence of UploadRequest messages, one call after another on one channel.
//
// The input is a script; each step is a command byte c and its operands:
//   c % 8 == 0  header message: a dtype byte (signed), a rank byte (% 70: past kMaxRank too),
//               one byte per dim (< 0xF0: the dim is b % 17; else 8 more bytes, any int64),
//               then a length byte and that many bytes of data
//   c % 8 == 1  data message of (2 bytes, little-endian) % 4097 bytes
//   c % 8 == 2  data message of 16 x that (up to 64 KiB)
//   c % 8 == 3  a length byte, then that many bytes parsed as an UploadRequest and sent as is
//               (skipped when they do not parse)
//   c % 8 == 4  an empty message
//   c % 8 == 5  close the call's sending side and wait for its status
//   c % 8 == 6  cancel the call
//   c % 8 == 7  a well-formed header: dtype 1 + b % 3, shape [b2 % 64, b3 % 64] (two bytes b2
//               b3 after b), no data
// The end of the input closes the last call. Data bytes come from a running counter, so what
// the server holds can be checked byte for byte.
//
// It fails (abort) when: a call's status is not what the protocol says (a model of it below:
// OK exactly for a valid header, no header fields later, and exactly the bytes it needs; else
// INVALID_ARGUMENT; RESOURCE_EXHAUSTED is always allowed, CANCELLED only after a cancel); an
// upload that succeeded does not download as the bytes sent, with the header's dtype and
// shape; or the store is not empty again (held bytes and tensors) within 10 s of a call's end.
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

constexpr int kMaxCalls = 4;
constexpr int kMaxMessages = 64;
constexpr char kFuzzerName[] = "upload_fuzzer";
constexpr char kTenant[] = "anonymous";

// What the protocol says about one call, message by message (upload.cc's rules).
struct Model {
  bool started = false;  // the first message has been seen
  bool failed = false;   // a message broke a rule: INVALID_ARGUMENT
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int64_t need = 0;
  std::string sent;  // the data, in order

  void See(const v1::UploadRequest& m) {
    if (failed) return;
    if (!started) {
      started = true;
      auto dt = CheckedDType(m.dtype(), "upload");
      if (!dt.ok()) return Fail();
      auto bytes = CheckedBytes(*dt, m.shape(), "upload");
      if (!bytes.ok()) return Fail();
      dtype = m.dtype();
      shape.assign(m.shape().begin(), m.shape().end());
      need = *bytes;
    } else if (m.dtype() != v1::DTYPE_UNSPECIFIED || m.shape_size() > 0) {
      return Fail();
    }
    if (static_cast<int64_t>(sent.size() + m.data().size()) > need) return Fail();
    sent += m.data();
  }
  void Fail() { failed = true; }
  bool Ok() const { return started && !failed && static_cast<int64_t>(sent.size()) == need; }
};

void CheckUploaded(FuzzServer& w, const Model& m, const v1::UploadResponse& resp) {
  const v1::TensorInfo& t = resp.tensor();
  FUZZ_CHECK(t.dtype() == m.dtype && t.size_bytes() == m.need &&
                 std::vector<int64_t>(t.shape().begin(), t.shape().end()) == m.shape,
             "uploaded tensor: dtype %d, %lld bytes", static_cast<int>(t.dtype()),
             static_cast<long long>(t.size_bytes()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DownloadRequest req;
  req.set_handle(t.handle());
  auto reader = w.stub->Download(&ctx, req);
  std::string got;
  v1::DownloadResponse part;
  while (reader->Read(&part)) got += part.data();
  const grpc::Status s = reader->Finish();
  FUZZ_CHECK(s.ok(), "Download: %s", s.error_message().c_str());
  FUZZ_CHECK(got == m.sent, "downloaded %zu bytes, sent %zu (or other bytes)", got.size(),
             m.sent.size());
  grpc::ClientContext fctx;
  v1::FreeTensorRequest freq;
  freq.set_handle(t.handle());
  v1::FreeTensorResponse fresp;
  const grpc::Status fs = w.stub->FreeTensor(&fctx, freq, &fresp);
  FUZZ_CHECK(fs.ok() && fresp.freed_bytes() == m.need, "FreeTensor: %s",
             fs.error_message().c_str());
}

// Runs one call from the script; returns when the call has ended.
void OneCall(FuzzServer& w, FuzzReader& in) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::UploadResponse resp;
  auto writer = w.stub->Upload(&ctx, &resp);
  Model model;
  bool open = true;  // Write still succeeds
  bool cancelled = false;
  uint32_t counter = 0;
  auto fill = [&counter](size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(counter++ * 131 + 7);
    return s;
  };
  auto send = [&](const v1::UploadRequest& m) {
    if (!open) return;
    model.See(m);
    open = writer->Write(m);
  };
  for (int messages = 0; messages < kMaxMessages && !in.empty(); ++messages) {
    const uint8_t c = in.Byte();
    v1::UploadRequest m;
    switch (c % 8) {
      case 0: {
        m.set_dtype(static_cast<v1::DType>(static_cast<int8_t>(in.Byte())));
        const int rank = in.Byte() % 70;
        for (int i = 0; i < rank; ++i) {
          const uint8_t b = in.Byte();
          m.add_shape(b < 0xF0 ? b % 17 : static_cast<int64_t>(in.Bytes(8)));
        }
        m.set_data(fill(in.Byte()));
        send(m);
        break;
      }
      case 1:
      case 2:
        m.set_data(fill((in.Bytes(2) % 4097) * (c % 8 == 2 ? 16 : 1)));
        send(m);
        break;
      case 3:
        if (m.ParseFromString(in.Take(in.Byte()))) send(m);
        break;
      case 4:
        send(m);
        break;
      case 5:
        messages = kMaxMessages;  // ends the loop
        break;
      case 6:
        ctx.TryCancel();
        cancelled = true;
        messages = kMaxMessages;
        break;
      default: {
        m.set_dtype(static_cast<v1::DType>(1 + in.Byte() % 3));
        m.add_shape(in.Byte() % 64);
        m.add_shape(in.Byte() % 64);
        send(m);
        break;
      }
    }
  }
  if (!cancelled) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  const grpc::StatusCode code = s.error_code();
  if (code != grpc::RESOURCE_EXHAUSTED) {
    if (cancelled) {
      FUZZ_CHECK(code == grpc::CANCELLED, "a cancelled upload ended %s: %s", CodeName(code),
                 s.error_message().c_str());
    } else if (model.Ok()) {
      FUZZ_CHECK(code == grpc::OK, "a valid upload of %lld bytes ended %s: %s",
                 static_cast<long long>(model.need), CodeName(code), s.error_message().c_str());
    } else {
      FUZZ_CHECK(code == grpc::INVALID_ARGUMENT, "an invalid upload ended %s: %s",
                 CodeName(code), s.error_message().c_str());
    }
  }
  if (code != grpc::OK) {
    FUZZ_CHECK(!s.error_message().empty(), "%s with no message", CodeName(code));
  }
  if (code == grpc::OK) CheckUploaded(w, model, resp);
  CheckStoreEmpty(w, kTenant, "the call");
}

}  // namespace
}  // namespace fusebox

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusebox;
  FuzzServer& w = TheFuzzServer(kFuzzerName);
  FuzzReader in(data, size);
  for (int i = 0; i < kMaxCalls && !in.empty(); ++i) OneCall(w, in);
  return 0;
}
