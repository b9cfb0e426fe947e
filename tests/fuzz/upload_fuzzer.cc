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
#include <thread>
#include <vector>

#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/core/request.h"
#include "server/server.h"

namespace fusebox {
namespace {

constexpr int kMaxCalls = 4;
constexpr int kMaxMessages = 64;
constexpr char kTenant[] = "anonymous";

#define FUZZ_CHECK(cond, ...)                              \
  do {                                                     \
    if (!(cond)) {                                         \
      std::fprintf(stderr, "upload_fuzzer: %s: ", #cond);  \
      std::fprintf(stderr, __VA_ARGS__);                   \
      std::fprintf(stderr, "\n");                          \
      std::abort();                                        \
    }                                                      \
  } while (0)

struct World {
  std::unique_ptr<FuseboxServer> server;
  std::unique_ptr<v1::KernelService::Stub> stub;

  World() {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.backend.kind = "cpu";
    o.backend.cpu.workers = 2;
    o.cpu_threads = 1;
    o.max_message_bytes = 1 << 20;
    o.store_budget_bytes = 4 << 20;
    o.max_tensor_bytes = 1 << 20;
    o.inflight_bytes = 8 << 20;
    o.idle_expiry_seconds = 0;
    auto s = FuseboxServer::Start(o);
    FUZZ_CHECK(s.ok(), "%s", s.status().ToString().c_str());
    server = *std::move(s);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    stub = v1::KernelService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server->port()), grpc::InsecureChannelCredentials(), args));
  }
};

World& TheWorld() {
  static World* w = new World();  // never destroyed: the server's threads live on
  return *w;
}

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t Byte() { return i_ < n_ ? d_[i_++] : 0; }
  uint64_t Bytes(int k) {
    uint64_t v = 0;
    for (int j = 0; j < k; ++j) v |= uint64_t{Byte()} << (8 * j);
    return v;
  }
  std::string Take(size_t k) {
    k = std::min(k, n_ - std::min(i_, n_));
    std::string s(reinterpret_cast<const char*>(d_ + i_), k);
    i_ += k;
    return s;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

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

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    default: return "another code";
  }
}

void CheckStoreEmpty(World& w) {
  TensorStore& store = w.server->store();
  for (int i = 0; i < 1000; ++i) {
    if (store.stats().count == 0 && store.TenantUsedBytes(kTenant) == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FUZZ_CHECK(false, "the store still holds %lld tensors, %lld bytes, 10 s after the call",
             static_cast<long long>(store.stats().count),
             static_cast<long long>(store.TenantUsedBytes(kTenant)));
}

void CheckUploaded(World& w, const Model& m, const v1::UploadResponse& resp) {
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
void OneCall(World& w, Reader& in) {
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
  CheckStoreEmpty(w);
}

}  // namespace
}  // namespace fusebox

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusebox;
  World& w = TheWorld();
  Reader in(data, size);
  for (int i = 0; i < kMaxCalls && !in.empty(); ++i) OneCall(w, in);
  return 0;
}
