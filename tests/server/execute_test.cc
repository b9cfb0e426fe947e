// The Execute stream in-process (real gRPC on a loopback port, the CPU backend, behind a gate
// where a test must hold ops): every id answered whatever the order, a bad request answered
// alone, the per-stream bound on requests read, a cancelled stream giving everything back,
// authentication, kept outputs, and the drain at shutdown. The clients are fusebox_client's
// ExecuteStream and, for what it cannot send, the generated stub.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <sstream>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "client/cpp/fusebox_client.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/core/tensor_store.h"
#include "server/rpc/auth.h"
#include "server/rpc/metrics.h"
#include "server/rpc/service.h"
#include "server/server.h"
#include "tests/server/held_backend.h"

namespace fusebox {
namespace {

namespace fc = fusebox::client;
using std::chrono::milliseconds;

// A KernelServiceImpl on `backend` served on a loopback port.
struct Served {
  Served(Backend* backend, RequestLimits limits, const Authenticator* auth = nullptr,
         Metrics* metrics = nullptr)
      : store(backend, StoreLimits{}),
        service(backend, metrics, &store, auth ? auth : &open, limits) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    target = "127.0.0.1:" + std::to_string(port);
  }
  ~Served() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  const Authenticator open;
  TensorStore store;
  KernelServiceImpl service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string target;
};

fc::HostTensor Floats(std::vector<int64_t> shape, float first) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = first + 0.25f * static_cast<float>(i % 16);
  return fc::HostTensor::FromFloats(DType::kFloat32, std::move(shape), v);
}

float Gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// Takes answers until the stream ends; by id.
std::map<uint64_t, fc::ExecuteResult> TakeAll(fc::ExecuteStream* s) {
  std::map<uint64_t, fc::ExecuteResult> by_id;
  fc::ExecuteResult r;
  while (s->Next(&r)) by_id[r.id] = r;
  return by_id;
}

TEST(ExecuteTest, EveryIdIsAnsweredInTheOrderTheOpsFinish) {
  HeldCpuBackend backend;
  Served s(&backend, RequestLimits{});
  auto client = fc::Client::Create(s.target);
  auto stream = client->Execute(/*window=*/8);
  // Each request's input starts with its own value, so the test can pick which op finishes.
  const std::map<uint64_t, float> first = {{7, -2.0f}, {3, -1.0f}, {11, 0.5f}};
  for (uint64_t id : {7, 3, 11}) {
    ASSERT_TRUE(stream->Submit(id, fc::Op::kGelu, {Floats({64}, first.at(id))}).ok());
  }
  ASSERT_TRUE(backend.WaitUntilSubmitted(3));
  std::vector<uint64_t> order;
  for (uint64_t id : {11, 7, 3}) {  // the last request's op first, then the first's, the second's
    ASSERT_TRUE(backend.ReleaseStartingWith(first.at(id)));
    fc::ExecuteResult r;
    ASSERT_TRUE(stream->Next(&r));
    ASSERT_TRUE(r.status.ok()) << r.status;
    order.push_back(r.id);
    const std::vector<float> y = r.result.output.ToFloats();
    ASSERT_EQ(y.size(), 64u);
    EXPECT_NEAR(y[5], Gelu(first.at(r.id) + 1.25f), 1e-5);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{11, 7, 3}));
  // Many more, of every op, all at once: every id answered exactly once, each right.
  backend.ReleaseAll(/*open=*/true);
  const fc::HostTensor m = Floats({4, 8}, -1.0f), b = Floats({8, 4}, 0.5f);
  std::thread sender([&] {
    for (uint64_t id = 100; id < 400; ++id) {
      const fc::Op op = static_cast<fc::Op>(id % 4);
      const absl::Status st =
          op == fc::Op::kMatmulRelu ? stream->Submit(id, op, {m, b}) : stream->Submit(id, op, {m});
      ASSERT_TRUE(st.ok()) << st;
    }
    stream->CloseSend();
  });
  const auto by_id = TakeAll(stream.get());
  sender.join();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(by_id.size(), 300u);
  for (const auto& [id, r] : by_id) {
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status;
    const std::vector<int64_t> want = id % 4 == 2 ? std::vector<int64_t>{4} : std::vector<int64_t>{4, id % 4 == 3 ? 4 : 8};
    EXPECT_EQ(r.result.output.shape, want) << id;
  }
}

TEST(ExecuteTest, ABadRequestGetsItsOwnErrorAndTheStreamGoesOn) {
  HeldCpuBackend backend;
  backend.ReleaseAll(/*open=*/true);
  Served s(&backend, RequestLimits{});
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Execute(&ctx);
  for (uint64_t id = 1; id <= 6; ++id) {
    v1::ExecuteRequest req;
    req.set_id(id);
    if (id != 4) {  // 4 names no op
      v1::Tensor* t = req.mutable_softmax()->mutable_input()->mutable_tensor();
      t->set_dtype(v1::FLOAT32);
      t->add_shape(2);
      t->add_shape(id == 2 ? 3 : 2);  // 2: 6 elements' shape, 4 elements' bytes
      t->set_data(std::string(16, '\0'));
    }
    ASSERT_TRUE(stream->Write(req));
  }
  stream->WritesDone();
  std::map<uint64_t, v1::ExecuteResponse> by_id;
  for (v1::ExecuteResponse r; stream->Read(&r);) by_id[r.id()] = r;
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(by_id.size(), 6u);
  for (uint64_t id : {1, 3, 5, 6}) {
    ASSERT_TRUE(by_id[id].has_softmax()) << id;
    EXPECT_EQ(by_id[id].softmax().output().tensor().data().size(), 16u);
  }
  EXPECT_EQ(by_id[2].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(by_id[2].error().message().find("shape [2,3]"), std::string::npos)
      << by_id[2].error().message();
  EXPECT_EQ(by_id[4].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(by_id[4].error().message().find("names no op"), std::string::npos);
}

TEST(ExecuteTest, AMessageThatIsNotAnExecuteRequestIsAnsweredWithItsId) {
  HeldCpuBackend backend;
  backend.ReleaseAll(/*open=*/true);
  Served s(&backend, RequestLimits{});
  grpc::GenericStub stub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  // Raw bytes: id 42, then field 2 (gelu) whose length runs past the end.
  const std::string bad = std::string("\x08\x2a\x12\x7f\x00", 5);
  v1::ExecuteRequest good;
  good.set_id(43);
  good.mutable_gelu()->mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
  good.mutable_gelu()->mutable_input()->mutable_tensor()->set_data(std::string(4, '\0'));
  auto call = stub.PrepareCall(&ctx, "/fusebox.v1.KernelService/Execute", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  for (const std::string& body : {bad, good.SerializeAsString()}) {
    grpc::Slice slice(body);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::map<uint64_t, fc::ExecuteResult> by_id;
  for (;;) {
    grpc::ByteBuffer bb;
    call->Read(&bb, reinterpret_cast<void*>(4));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    if (!ok) break;
    fc::ExecuteResult r;
    ASSERT_TRUE(fc::ParseExecuteResponseForTest(bb, &r).ok());
    by_id[r.id] = r;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(by_id.size(), 2u);
  EXPECT_EQ(by_id[42].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(by_id[42].status.message().find("not a well-formed protobuf message"), std::string::npos)
      << by_id[42].status;
  EXPECT_TRUE(by_id[43].status.ok()) << by_id[43].status;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(ExecuteTest, TheServerReadsNoFurtherAheadThanTheStreamBound) {
  HeldCpuBackend backend;
  RequestLimits limits;
  limits.stream_max_inflight = 3;
  Served s(&backend, limits);
  auto client = fc::Client::Create(s.target);
  auto stream = client->Execute(/*window=*/10);  // the client would send 10
  const fc::HostTensor x = Floats({16}, 0.0f);
  for (uint64_t id = 0; id < 10; ++id) ASSERT_TRUE(stream->Submit(id, fc::Op::kGelu, {x}).ok());
  stream->CloseSend();
  ASSERT_TRUE(backend.WaitUntilSubmitted(3));
  std::this_thread::sleep_for(milliseconds(300));  // time to read more, were it allowed
  EXPECT_EQ(backend.submitted(), 3);  // every request read reaches the backend at once
  backend.ReleaseAll();  // three answered: three more read
  ASSERT_TRUE(backend.WaitUntilSubmitted(6));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(backend.submitted(), 6);
  backend.ReleaseAll(/*open=*/true);
  const auto by_id = TakeAll(stream.get());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(by_id.size(), 10u);
}

TEST(ExecuteTest, ACancelledStreamGivesBackItsBytesAndKeepsNoTensor) {
  HeldCpuBackend backend;
  RequestLimits limits;
  limits.max_inflight_bytes = 64 << 20;
  Served s(&backend, limits);
  auto client = fc::Client::Create(s.target);
  auto stream = client->Execute(/*window=*/16);
  const fc::HostTensor x = Floats({1024}, 1.0f);
  fc::CallOptions keep;
  keep.keep_on_server = true;
  for (uint64_t id = 0; id < 8; ++id) {
    ASSERT_TRUE(stream->Submit(id, fc::Op::kGelu, {x}, id % 2 ? keep : fc::CallOptions{}).ok());
  }
  ASSERT_TRUE(backend.WaitUntilSubmitted(8));
  EXPECT_GT(s.service.InflightUsed(), 0);
  EXPECT_EQ(s.store.TenantUsedBytes("anonymous"), 4 * 4096);  // the kept outputs' room
  stream.reset();  // cancels the stream
  for (int i = 0; i < 250 && !backend.AllAbandoned(); ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(backend.AllAbandoned());
  backend.ReleaseAll(/*open=*/true);
  for (int i = 0; i < 250 && (s.service.InflightUsed() > 0 || s.store.TenantUsedBytes("anonymous") > 0); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(s.service.InflightUsed(), 0);
  EXPECT_EQ(s.store.TenantUsedBytes("anonymous"), 0);
  EXPECT_TRUE(s.store.List("anonymous").empty());
}

TEST(ExecuteTest, AStreamWithoutAKnownTokenIsUnauthenticated) {
  const std::string path = ::testing::TempDir() + "fusebox_exec_tokens_" + std::to_string(getpid());
  std::ofstream(path) << "secret-a alice\n";
  auto auth = Authenticator::FromFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(auth.ok()) << auth.status();
  HeldCpuBackend backend;
  backend.ReleaseAll(/*open=*/true);
  Served s(&backend, RequestLimits{}, &*auth);
  const fc::HostTensor x = Floats({4}, 0.0f);
  for (const char* token : {"", "secret-b"}) {
    fc::Client::Options o;
    o.auth_token = token;
    auto stream = fc::Client::Create(s.target, o)->Execute();
    (void)stream->Submit(1, fc::Op::kGelu, {x});  // may see the end already
    fc::ExecuteResult r;
    EXPECT_FALSE(stream->Next(&r));
    EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kUnauthenticated) << token;
  }
  fc::Client::Options o;
  o.auth_token = "secret-a";
  auto stream = fc::Client::Create(s.target, o)->Execute();
  ASSERT_TRUE(stream->Submit(1, fc::Op::kGelu, {x}).ok());
  fc::ExecuteResult r;
  ASSERT_TRUE(stream->Next(&r));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(ExecuteTest, KeptOutputsChainThroughTheStream) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.backend.kind = "cpu";
  auto server = FuseboxServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = fc::Client::Create("127.0.0.1:" + std::to_string((*server)->port()));
  const fc::HostTensor x = Floats({3, 5}, -1.0f);
  auto uploaded = client->Upload(x);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  auto stream = client->Execute();
  fc::CallOptions keep;
  keep.keep_on_server = true;
  ASSERT_TRUE(stream->Submit(1, fc::Op::kGelu, {fc::Arg::Handle(uploaded->handle)}, keep).ok());
  fc::ExecuteResult r;
  ASSERT_TRUE(stream->Next(&r));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_FALSE(r.result.handle.empty());
  EXPECT_TRUE(r.result.output.data.empty());
  ASSERT_TRUE(stream->Submit(2, fc::Op::kRowSum, {fc::Arg::Handle(r.result.handle)}).ok());
  ASSERT_TRUE(stream->Next(&r));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.result.output.shape, (std::vector<int64_t>{3}));
  const std::vector<float> in = x.ToFloats(), sums = r.result.output.ToFloats();
  for (int row = 0; row < 3; ++row) {
    float want = 0;
    for (int c = 0; c < 5; ++c) want += Gelu(in[static_cast<size_t>(row * 5 + c)]);
    EXPECT_NEAR(sums[static_cast<size_t>(row)], want, 1e-4);
  }
  EXPECT_TRUE(stream->Finish().ok());
  auto listed = client->ListTensors();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->tensors.size(), 2u);  // the upload and the kept GeLU
  (*server)->Shutdown(5);
}

TEST(ExecuteTest, ShutdownAnswersWhatTheStreamReadThenEndsItUnavailable) {
  HeldCpuBackend backend;
  auto s = std::make_unique<Served>(&backend, RequestLimits{});
  auto client = fc::Client::Create(s->target);
  auto stream = client->Execute(/*window=*/8);
  const fc::HostTensor x = Floats({32}, 0.5f);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(stream->Submit(id, fc::Op::kGelu, {x}).ok());
  ASSERT_TRUE(backend.WaitUntilSubmitted(3));
  // The stream stays open (no CloseSend): the drain must end it.
  const auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    s->service.Drain();
    s->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(20));
  });
  std::this_thread::sleep_for(milliseconds(200));
  backend.ReleaseAll(/*open=*/true);
  const auto by_id = TakeAll(stream.get());
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_EQ(by_id.size(), 3u);
  for (const auto& [id, r] : by_id) EXPECT_TRUE(r.status.ok()) << id << ": " << r.status;
  const absl::Status end = stream->Finish();
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  // A stream opened during the drain ends at once (gRPC refuses it, or the service does).
  s->server.reset();
}

// The server's own shutdown (SIGTERM's path) drains streams: an idle stream left open ends
// UNAVAILABLE at once instead of holding the drain for its whole grace.
TEST(ExecuteTest, ServerShutdownEndsAnIdleOpenStreamWithoutWaitingOutTheDrain) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.backend.kind = "cpu";
  auto server = FuseboxServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = fc::Client::Create("127.0.0.1:" + std::to_string((*server)->port()));
  auto stream = client->Execute();
  const fc::HostTensor x = Floats({16}, 0.0f);
  ASSERT_TRUE(stream->Submit(1, fc::Op::kGelu, {x}).ok());
  fc::ExecuteResult r;
  ASSERT_TRUE(stream->Next(&r));
  EXPECT_TRUE(r.status.ok()) << r.status;
  const auto start = std::chrono::steady_clock::now();
  (*server)->Shutdown(/*drain_seconds=*/30);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_FALSE(stream->Next(&r));
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kUnavailable);
}

// The body of GET http://127.0.0.1:port/metrics, as service_test.cc reads it.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const timeval wait{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

// fusebox_calls_total{method, code}; NaN when absent.
double Calls(const std::string& text, const std::string& method, const std::string& code) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("fusebox_calls_total{", 0) == 0 &&
        line.find("method=\"" + method + "\"") != std::string::npos &&
        line.find("code=\"" + code + "\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return NAN;
}

TEST(ExecuteTest, EachRequestCountsUnderItsOpAndTheStreamUnderExecute) {
  HeldCpuBackend backend;
  backend.ReleaseAll(/*open=*/true);
  auto metrics = Metrics::Start("127.0.0.1:0", &backend);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  Served s(&backend, RequestLimits{}, nullptr, metrics->get());
  auto stream = fc::Client::Create(s.target)->Execute();
  const fc::HostTensor x = Floats({8}, 0.0f), bad = Floats({}, 1.0f);
  ASSERT_TRUE(stream->Submit(1, fc::Op::kGelu, {x}).ok());
  ASSERT_TRUE(stream->Submit(2, fc::Op::kGelu, {x}).ok());
  ASSERT_TRUE(stream->Submit(3, fc::Op::kSoftmax, {bad}).ok());  // rank 0: INVALID_ARGUMENT
  stream->CloseSend();
  const auto by_id = TakeAll(stream.get());
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(by_id.size(), 3u);
  std::string text;
  for (int i = 0; i < 100; ++i) {  // the stream's own record follows its status
    text = Scrape((*metrics)->port());
    if (Calls(text, "Execute", "OK") == 1) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(Calls(text, "Gelu", "OK"), 2);
  EXPECT_EQ(Calls(text, "Softmax", "INVALID_ARGUMENT"), 1);
  EXPECT_EQ(Calls(text, "Execute", "OK"), 1);
}

TEST(ExecuteTest, AnswersTheClientDoesNotTakeEndTheStreamAndReturnTheirBytes) {
  HeldCpuBackend backend;
  backend.ReleaseAll(/*open=*/true);
  RequestLimits limits;
  limits.max_inflight_bytes = 256 << 20;
  limits.stall_timeout_seconds = 0.3;  // a 1 MiB answer may wait 0.3 s + 1 s
  Served s(&backend, limits);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // a 64 KiB window: answers wait for our reads
  args.SetMaxReceiveMessageSize(-1);
  auto stub = v1::KernelService::NewStub(
      grpc::CreateCustomChannel(s.target, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto stream = stub->Execute(&ctx);
  v1::ExecuteRequest req;
  v1::Tensor* t = req.mutable_gelu()->mutable_input()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_shape(1 << 18);
  t->set_data(std::string(1 << 20, '\0'));
  for (uint64_t id = 0; id < 4; ++id) {
    req.set_id(id);
    ASSERT_TRUE(stream->Write(req));
  }
  // Not a single answer is read: the first fills the window, the rest wait behind it.
  bool cancelled = false;
  for (int i = 0; i < 300 && !cancelled; ++i) {
    cancelled = s.service.CancelStalled() > 0;  // the server's sweeper does this
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(cancelled);
  for (int i = 0; i < 250 && s.service.InflightUsed() > 0; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(s.service.InflightUsed(), 0);
  stream->WritesDone();
  for (v1::ExecuteResponse r; stream->Read(&r);) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace fusebox
