// The service end to end in-process (real gRPC on a loopback port, CPU
// backend): resident tensors (upload, download, chaining, free, expiry,
// budget, quota, owners), bad requests, and that the server keeps serving.
#include <arpa/inet.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "client/cpp/fusebox_client.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/rpc/metrics.h"
#include "server/server.h"
#include "server/rpc/service.h"
#include "server/core/tensor_store.h"
#include "tests/reference.h"
#include "tests/server/held_backend.h"

namespace fusebox {
namespace {

using v1::KernelService;

int FreePort();  // a loopback port nobody listens on (below)

class ServiceTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions o) {
    o.address = "127.0.0.1:0";
    o.backend.kind = "cpu";
    auto s = FuseboxServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = KernelService::NewStub(channel_);
  }
  // StartServer with /metrics on a free loopback port; returns the port (0: none free).
  int StartServerWithMetrics() {
    const int port = FreePort();
    if (port <= 0) return 0;
    ServerOptions o;
    o.metrics_address = "127.0.0.1:" + std::to_string(port);
    StartServer(o);
    return port;
  }
  void SetUp() override {}
  void TearDown() override {
    if (server_) server_->Shutdown(5);
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    return c;
  }

  // Uploads `bytes` as float32 [n] in chunks; returns the status and handle.
  grpc::Status Upload(const std::vector<uint8_t>& bytes, std::vector<int64_t> shape,
                      v1::DType dtype, std::string* handle, const std::string& token = "",
                      size_t chunk = 1 << 20) {
    auto ctx = Ctx(token);
    v1::UploadResponse resp;
    auto w = stub_->Upload(ctx.get(), &resp);
    v1::UploadRequest first;
    first.set_dtype(dtype);
    for (int64_t d : shape) first.add_shape(d);
    size_t off = 0;
    bool wrote_first = false;
    do {
      v1::UploadRequest m = wrote_first ? v1::UploadRequest() : first;
      const size_t n = std::min(chunk, bytes.size() - off);
      m.set_data(bytes.data() + off, n);
      off += n;
      wrote_first = true;
      if (!w->Write(m)) break;
    } while (off < bytes.size());
    w->WritesDone();
    grpc::Status s = w->Finish();
    if (s.ok() && handle) *handle = resp.tensor().handle();
    return s;
  }

  grpc::Status Download(const std::string& handle, std::string* data,
                        const std::string& token = "", int64_t chunk = 0) {
    auto ctx = Ctx(token);
    v1::DownloadRequest req;
    req.set_handle(handle);
    req.set_chunk_bytes(chunk);
    auto r = stub_->Download(ctx.get(), req);
    v1::DownloadResponse m;
    data->clear();
    while (r->Read(&m)) data->append(m.data());
    return r->Finish();
  }

  // Uploads float32 [n], sends its first `sent` bytes in one message, waits `pause` and
  // cancels (no WritesDone); returns the call's status.
  grpc::Status UploadThenCancel(int64_t n, size_t sent, std::chrono::milliseconds pause) {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto w = stub_->Upload(&ctx, &resp);
    v1::UploadRequest m;
    m.set_dtype(v1::FLOAT32);
    m.add_shape(n);
    m.set_data(std::string(sent, 'x'));
    EXPECT_TRUE(w->Write(m));
    std::this_thread::sleep_for(pause);
    ctx.TryCancel();
    return w->Finish();
  }
  v1::ListTensorsResponse List(const std::string& token = "") {
    auto ctx = Ctx(token);
    v1::ListTensorsResponse resp;
    EXPECT_TRUE(stub_->ListTensors(ctx.get(), v1::ListTensorsRequest(), &resp).ok());
    return resp;
  }

  std::unique_ptr<FuseboxServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<KernelService::Stub> stub_;
};

std::vector<uint8_t> RandomFloats(int64_t n) {
  return ref::RandomTensor(DType::kFloat32, n, -3, 3, std::random_device{}());
}

// A channel whose flow-control window stays at 64 KiB (no BDP probing): the server writes
// only as fast as this client reads.
std::unique_ptr<KernelService::Stub> StubWithoutBdpProbing(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return KernelService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
}

// The CPU backend's default budget is half of this: inside a container, of its memory limit.
TEST(HostMemory, ACgroupLimitBelowTheRamIsTheHostMemory) {
  const std::string root = ::testing::TempDir() + "fusebox_cgroup_" + std::to_string(getpid());
  const std::string none = root + "/no-such-file";
  const int64_t ram = HostMemoryBytes(root, none);  // no such directory: the RAM
  EXPECT_GT(ram, 0);
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text << "\n";
  };
  mkdir(root.c_str(), 0700);
  write(root + "/memory.max", "max");  // v2, no limit
  EXPECT_EQ(HostMemoryBytes(root, none), ram);
  write(root + "/memory.max", "1073741824");  // v2, 1 GiB
  EXPECT_EQ(HostMemoryBytes(root, none), std::min<int64_t>(ram, int64_t{1} << 30));
  std::remove((root + "/memory.max").c_str());
  mkdir((root + "/memory").c_str(), 0700);
  write(root + "/memory/memory.limit_in_bytes", "9223372036854771712");  // v1, none
  EXPECT_EQ(HostMemoryBytes(root, none), ram);
  write(root + "/memory/memory.limit_in_bytes", "536870912");  // v1, 512 MiB
  EXPECT_EQ(HostMemoryBytes(root, none), std::min<int64_t>(ram, int64_t{512} << 20));
  std::remove((root + "/memory/memory.limit_in_bytes").c_str());
  // Without a cgroup namespace: this process's cgroup (v2 "0::/a/b"), and those above it.
  mkdir((root + "/a").c_str(), 0700);
  mkdir((root + "/a/b").c_str(), 0700);
  write(root + "/self", "0::/a/b");
  write(root + "/a/b/memory.max", "268435456");  // 256 MiB
  EXPECT_EQ(HostMemoryBytes(root, root + "/self"), std::min<int64_t>(ram, int64_t{256} << 20));
  write(root + "/a/memory.max", "134217728");  // the parent's 128 MiB binds
  EXPECT_EQ(HostMemoryBytes(root, root + "/self"), std::min<int64_t>(ram, int64_t{128} << 20));
  // v1: the memory controller's line.
  mkdir((root + "/memory/x").c_str(), 0700);
  write(root + "/self", "5:cpu,cpuacct:/y\n4:memory:/x");
  write(root + "/memory/x/memory.limit_in_bytes", "67108864");  // 64 MiB
  EXPECT_EQ(HostMemoryBytes(root, root + "/self"), std::min<int64_t>(ram, int64_t{64} << 20));
  for (const char* f : {"/a/b/memory.max", "/a/memory.max", "/self",
                        "/memory/x/memory.limit_in_bytes"}) {
    std::remove((root + f).c_str());
  }
  for (const char* d : {"/a/b", "/a", "/memory/x", "/memory", ""}) rmdir((root + d).c_str());
}

TEST_F(ServiceTest, UploadThenDownloadReturnsTheSameBytes) {
  StartServer({});
  const auto bytes = RandomFloats(1000003);  // ~4 MB: several odd-sized chunks
  std::string h;
  ASSERT_TRUE(Upload(bytes, {1000003}, v1::FLOAT32, &h, "", 1234567).ok());
  std::string back;
  ASSERT_TRUE(Download(h, &back, "", 999999).ok());
  ASSERT_EQ(back.size(), bytes.size());
  EXPECT_EQ(0, std::memcmp(back.data(), bytes.data(), bytes.size()));
  auto l = List();
  ASSERT_EQ(l.tensors_size(), 1);
  EXPECT_EQ(l.tensors(0).size_bytes(), 4000012);
  EXPECT_EQ(l.used_bytes(), 4000012);
}

// Download's chunks (the default, and larger ones asked for) shrink to fit a server
// started with a smaller message limit.
TEST_F(ServiceTest, DownloadChunksFitTheServersMessageLimit) {
  ServerOptions o;
  o.max_message_bytes = 1 << 20;
  StartServer(o);
  const auto bytes = RandomFloats(2 << 20);  // 8 MiB
  std::string h;
  ASSERT_TRUE(Upload(bytes, {2 << 20}, v1::FLOAT32, &h, "", 512 << 10).ok());
  for (int64_t chunk : {int64_t{0}, int64_t{4} << 20}) {
    std::string back;
    grpc::Status s = Download(h, &back, "", chunk);
    ASSERT_TRUE(s.ok()) << "chunk_bytes " << chunk << ": " << s.error_message();
    ASSERT_EQ(back.size(), bytes.size());
    EXPECT_EQ(0, std::memcmp(back.data(), bytes.data(), bytes.size()));
  }
  // A long shape (a header past the 4 KiB the limit leaves) is refused at upload: the rank
  // is at most kMaxRank.
  std::vector<int64_t> shape(4200, 1);
  shape.push_back(1 << 18);
  const grpc::Status s = Upload(RandomFloats(1 << 18), shape, v1::FLOAT32, &h, "", 256 << 10);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

TEST_F(ServiceTest, ConcurrentUploadsAllLand) {
  StartServer({});
  std::vector<std::thread> threads;
  std::vector<std::string> handles(6);
  std::vector<std::vector<uint8_t>> data(6);
  for (int i = 0; i < 6; ++i) data[i] = RandomFloats(300000 + i);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(Upload(data[i], {300000 + i}, v1::FLOAT32, &handles[i], "", 100000).ok());
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) {
    std::string back;
    ASSERT_TRUE(Download(handles[i], &back).ok());
    ASSERT_EQ(back.size(), data[i].size()) << i;
    EXPECT_EQ(0, std::memcmp(back.data(), data[i].data(), data[i].size())) << i;
  }
}

TEST_F(ServiceTest, CancelledUploadLeavesNothingBehind) {
  StartServer({});
  EXPECT_EQ(UploadThenCancel(1 << 20, 1 << 20, std::chrono::milliseconds(0)).error_code(),
            grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 100 && server_->store().TenantUsedBytes("anonymous") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
  EXPECT_EQ(List().tensors_size(), 0);
}

// A float32 GeLU of n zeros whose output stays on the server.
v1::GeluRequest KeptGelu(int64_t n) {
  v1::GeluRequest req;
  auto* t = req.mutable_input()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_shape(n);
  t->set_data(std::string(static_cast<size_t>(n) * 4, '\0'));
  req.mutable_output_options()->set_keep_on_server(true);
  return req;
}

// One Gelu call in flight (the client's callback API); Wait() returns its status.
class PendingGelu {
 public:
  PendingGelu(KernelService::Stub& stub, grpc::ClientContext* ctx, v1::GeluRequest req)
      : req_(std::move(req)) {
    stub.async()->Gelu(ctx, &req_, &resp_, [this](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_ = true;
      cv_.notify_all();
    });
  }
  grpc::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  const v1::GeluResponse& response() const { return resp_; }

 private:
  v1::GeluRequest req_;
  v1::GeluResponse resp_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

// The handles the store lists for the anonymous tenant.
std::set<std::string> ListedHandles(FuseboxServer& server) {
  std::set<std::string> out;
  for (const auto& t : server.store().List("anonymous")) out.insert(t->handle);
  return out;
}

// Cancelled after every byte was sent (no WritesDone): nothing is kept.
TEST_F(ServiceTest, UploadCancelledAfterItsLastByteLeavesNothingBehind) {
  StartServer({});
  // 200 ms: the server has every byte before the cancel.
  EXPECT_EQ(UploadThenCancel(256, 1024, std::chrono::milliseconds(200)).error_code(),
            grpc::StatusCode::CANCELLED);
  server_->Shutdown(30);  // every call has ended
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
  EXPECT_TRUE(ListedHandles(*server_).empty());
}

// Uploads and kept op outputs cancelled at random moments, around the commit: every tensor
// whose call answered OK with its handle is kept.
TEST_F(ServiceTest, CallsCancelledAroundTheirCommitNeverLoseAnAcknowledgedTensor) {
  StartServer({});
  std::mt19937 rng(std::random_device{}());
  std::set<std::string> acknowledged;
  int ok = 0, cancelled = 0;
  for (int i = 0; i < 120; ++i) {
    grpc::ClientContext ctx;
    grpc::Status s;
    std::string handle;
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 1500)(rng));
    if (i % 2 == 0) {
      v1::UploadResponse resp;
      auto w = stub_->Upload(&ctx, &resp);
      v1::UploadRequest m;
      m.set_dtype(v1::FLOAT32);
      m.add_shape(4096);
      m.set_data(std::string(4096 * 4, 'x'));
      w->Write(m);
      w->WritesDone();
      std::this_thread::sleep_for(delay);
      ctx.TryCancel();
      s = w->Finish();
      handle = resp.tensor().handle();
    } else {
      PendingGelu call(*stub_, &ctx, KeptGelu(65536));
      std::this_thread::sleep_for(delay);
      ctx.TryCancel();
      s = call.Wait();
      handle = call.response().output().handle();
    }
    if (s.ok()) {
      ++ok;
      ASSERT_FALSE(handle.empty());
      acknowledged.insert(handle);
    } else {
      ++cancelled;
      ASSERT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
    }
  }
  server_->Shutdown(30);  // every call has ended
  const std::set<std::string> listed = ListedHandles(*server_);
  for (const auto& h : acknowledged) {
    EXPECT_EQ(listed.count(h), 1u) << h << ": acknowledged, then lost";
  }
  // Other listed tensors belong to calls the client cancelled after the server had answered
  // (its TryCancel then reports CANCELLED). A cancel the server sees in time keeps nothing:
  // UploadCancelledAfterItsLastByteLeavesNothingBehind, OpCancelledWhileQueuedKeepsNoOutputAndIsNotComputed.
  std::fprintf(stderr, "%d OK, %d cancelled, %zu tensors kept\n", ok, cancelled, listed.size());
}

// Kept outputs of calls that run out of time around their commit. A reply that leaves just
// before the deadline can reach its caller after the caller gave up, and gRPC reports such a
// call complete: the server holds those outputs unclaimed until a call names them, and frees
// them after the stall timeout. So, once it has passed, the tensors held are exactly those whose
// handles reached the caller (which named them) and which it has not freed.
TEST_F(ServiceTest, KeptOutputsOfCallsThatRanOutOfTimeAreFreedUnlessTheirHandlesArrived) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.5;
  StartServer(o);
  auto free = [&](const std::string& h) {
    auto ctx = Ctx();
    v1::FreeTensorRequest req;
    req.set_handle(h);
    v1::FreeTensorResponse freed;
    return stub_->FreeTensor(ctx.get(), req, &freed).ok();
  };
  // Deadlines around this host's time for such a call (1 MiB in, computed, a handle back), so
  // that many end around their commit.
  std::vector<int64_t> us;
  for (int i = 0; i < 21; ++i) {
    auto ctx = Ctx();
    v1::GeluResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(stub_->Gelu(ctx.get(), KeptGelu(1 << 18), &resp).ok());
    us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
    ASSERT_TRUE(free(resp.output().handle()));
  }
  std::sort(us.begin(), us.end());
  const int median_us = static_cast<int>(us[us.size() / 2]);
  std::mt19937 rng(std::random_device{}());
  std::set<std::string> kept;
  int ok = 0, expired = 0;
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(std::uniform_int_distribution<int>(
                         median_us / 2, median_us * 3 / 2)(rng)));
    PendingGelu call(*stub_, &ctx, KeptGelu(1 << 18));
    const grpc::Status s = call.Wait();
    if (!s.ok()) {
      ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
      ++expired;
      continue;
    }
    ++ok;
    const std::string& h = call.response().output().handle();
    auto use = Ctx();  // the caller names its handle: claimed
    v1::ListTensorsRequest one;
    one.set_handle(h);
    v1::ListTensorsResponse listed;
    ASSERT_TRUE(stub_->ListTensors(use.get(), one, &listed).ok()) << h;
    if (i % 10 == 0) {
      kept.insert(h);
    } else {
      ASSERT_TRUE(free(h)) << h;  // 1 MiB each: the test holds a few dozen at most
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // past the stall timeout, and a sweep
  const std::set<std::string> listed = ListedHandles(*server_);
  int orphans = 0;
  for (const auto& h : listed) orphans += kept.count(h) == 0;
  EXPECT_EQ(orphans, 0) << "of " << expired << " calls past their deadline";
  EXPECT_EQ(listed.size() - orphans, kept.size()) << "a handle the caller named was freed";
  EXPECT_GT(expired, 0) << "no call ran out of time: the test proves nothing";
  std::fprintf(stderr, "%d OK, %d past their deadline (around %d us), %d orphans\n", ok,
               expired, median_us, orphans);
}

TEST_F(ServiceTest, ShortUploadIsInvalidAndLeavesNothing) {
  StartServer({});
  const auto bytes = RandomFloats(1000);
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto w = stub_->Upload(ctx.get(), &resp);
  v1::UploadRequest m;
  m.set_dtype(v1::FLOAT32);
  m.add_shape(2000);  // promises twice what it sends
  m.set_data(bytes.data(), bytes.size());
  w->Write(m);
  w->WritesDone();
  grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("ended after 4000 of 8000 bytes"), std::string::npos);
  EXPECT_EQ(List().tensors_size(), 0);
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
}

TEST_F(ServiceTest, OversizedUploadIsInvalid) {
  StartServer({});
  std::string h;
  std::vector<uint8_t> bytes(404);
  grpc::Status s = Upload(bytes, {100}, v1::FLOAT32, &h);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(List().tensors_size(), 0);
}

TEST_F(ServiceTest, UploadOverBudgetIsResourceExhaustedAndKeepsWhatIsStored) {
  ServerOptions o;
  o.store_budget_bytes = 1 << 20;
  StartServer(o);
  std::string h1, h2;
  const auto a = RandomFloats(200000);  // 800 KB
  ASSERT_TRUE(Upload(a, {200000}, v1::FLOAT32, &h1).ok());
  grpc::Status s = Upload(RandomFloats(100000), {100000}, v1::FLOAT32, &h2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  std::string back;
  ASSERT_TRUE(Download(h1, &back).ok());
  ASSERT_EQ(back.size(), a.size());
  EXPECT_EQ(0, std::memcmp(back.data(), a.data(), a.size()));
}

class TokenServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "fusebox_tokens_" + std::to_string(getpid());
    std::ofstream(path_) << "# token tenant\nsecret-a alice\nsecret-b bob\n";
  }
  void TearDown() override {
    ServiceTest::TearDown();
    std::remove(path_.c_str());
  }
  std::string path_;
};

TEST_F(TokenServiceTest, CallWithoutOrWithUnknownTokenIsUnauthenticated) {
  ServerOptions o;
  o.token_file = path_;
  StartServer(o);
  std::string h;
  EXPECT_EQ(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Near misses too: a prefix, an extension, one byte off, another case.
  for (const char* token : {"nope", "secret-", "secret-ab", "secret-c", "SECRET-A", "secret-a "}) {
    EXPECT_EQ(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h, token).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << token;
  }
  EXPECT_TRUE(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h, "secret-a").ok());
  auto ctx = Ctx();
  v1::GeluRequest req;
  v1::GeluResponse resp;
  EXPECT_EQ(stub_->Gelu(ctx.get(), req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TokenServiceTest, BearerSchemeIsCaseInsensitiveAndTheTokenIsNot) {
  ServerOptions o;
  o.token_file = path_;
  StartServer(o);
  for (const char* value : {"bearer secret-a", "BEARER secret-a", "Bearer secret-a"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", value);
    v1::ListTensorsResponse resp;
    EXPECT_TRUE(stub_->ListTensors(&ctx, v1::ListTensorsRequest(), &resp).ok()) << value;
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "bearer SECRET-A");
  v1::ListTensorsResponse resp;
  EXPECT_EQ(stub_->ListTensors(&ctx, v1::ListTensorsRequest(), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TokenServiceTest, TenantCannotSeeUseDownloadOrFreeAnothersTensor) {
  ServerOptions o;
  o.token_file = path_;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h, "secret-a").ok());
  const std::string missing = "t00000000000000000000000000000000";
  std::string data;
  grpc::Status theirs = Download(h, &data, "secret-b");
  grpc::Status never = Download(missing, &data, "secret-b");
  EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(never.error_code(), grpc::StatusCode::NOT_FOUND);
  std::string m1 = theirs.error_message(), m2 = never.error_message();
  m1.replace(m1.find(h), h.size(), "H");
  m2.replace(m2.find(missing), missing.size(), "H");
  EXPECT_EQ(m1, m2);  // nothing tells bob the handle exists

  auto ctx = Ctx("secret-b");
  v1::GeluRequest req;
  req.mutable_input()->set_handle(h);
  v1::GeluResponse resp;
  EXPECT_EQ(stub_->Gelu(ctx.get(), req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  auto fctx = Ctx("secret-b");
  v1::FreeTensorRequest freq;
  freq.set_handle(h);
  v1::FreeTensorResponse fresp;
  EXPECT_EQ(stub_->FreeTensor(fctx.get(), freq, &fresp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(List("secret-b").tensors_size(), 0);
  EXPECT_EQ(List("secret-a").tensors_size(), 1);  // alice still has it
}

TEST_F(TokenServiceTest, TenantQuotaIsResourceExhaustedForThatTenantOnly) {
  ServerOptions o;
  o.token_file = path_;
  o.tenant_quota_bytes = 100000;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(20000), {20000}, v1::FLOAT32, &h, "secret-a").ok());
  grpc::Status s = Upload(RandomFloats(10000), {10000}, v1::FLOAT32, &h, "secret-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("quota"), std::string::npos);
  EXPECT_TRUE(Upload(RandomFloats(20000), {20000}, v1::FLOAT32, &h, "secret-b").ok());
  EXPECT_EQ(List("secret-a").quota_bytes(), 100000);
}

TEST_F(ServiceTest, FreedHandleIsNotFoundInEveryUse) {
  StartServer({});
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h).ok());
  auto ctx = Ctx();
  v1::FreeTensorRequest freq;
  freq.set_handle(h);
  v1::FreeTensorResponse fresp;
  ASSERT_TRUE(stub_->FreeTensor(ctx.get(), freq, &fresp).ok());
  EXPECT_EQ(fresp.freed_bytes(), 40);
  std::string data;
  EXPECT_EQ(Download(h, &data).error_code(), grpc::StatusCode::NOT_FOUND);
  auto gctx = Ctx();
  v1::SoftmaxRequest req;
  req.mutable_input()->set_handle(h);
  v1::SoftmaxResponse resp;
  EXPECT_EQ(stub_->Softmax(gctx.get(), req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServiceTest, IdleTensorExpiresToNotFound) {
  ServerOptions o;
  o.idle_expiry_seconds = 0.3;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(10), {10}, v1::FLOAT32, &h).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  std::string data;
  EXPECT_EQ(Download(h, &data).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
}

// A Download of 1 MiB of float32 in 64 messages of 16 KiB, on a channel without BDP probing,
// so the server writes only as fast as this client reads (members in destruction order).
struct SlowDownload {
  std::unique_ptr<KernelService::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader;
};

SlowDownload OpenSlowDownload(int port, const std::string& handle) {
  SlowDownload d;
  d.stub = StubWithoutBdpProbing(port);
  d.ctx = std::make_unique<grpc::ClientContext>();
  d.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::DownloadRequest req;
  req.set_handle(handle);
  req.set_chunk_bytes(16 << 10);
  d.reader = d.stub->Download(d.ctx.get(), req);
  return d;
}

TEST_F(ServiceTest, ASlowDownloadKeepsItsTensorFromExpiring) {
  ServerOptions o;
  o.idle_expiry_seconds = 0.3;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(1 << 18), {1 << 18}, v1::FLOAT32, &h).ok());  // 1 MiB
  SlowDownload d = OpenSlowDownload(server_->port(), h);
  v1::DownloadResponse m;
  int messages = 0;
  while (d.reader->Read(&m)) {  // one each 25 ms: 1.6 s, 5 expiry periods
    ++messages;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    if (messages == 48) {  // in use 1.2 s in
      EXPECT_EQ(List().tensors_size(), 1);
    }
  }
  ASSERT_TRUE(d.reader->Finish().ok());
  EXPECT_EQ(messages, 64);
}

TEST_F(ServiceTest, AnUploadStalledAfterItsHeaderIsCancelledAndItsBudgetReturned) {
  ServerOptions o;
  o.store_budget_bytes = 1 << 20;
  o.stall_timeout_seconds = 0.3;
  StartServer(o);
  const auto t0 = std::chrono::steady_clock::now();
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto stalled = stub_->Upload(ctx.get(), &resp);
  v1::UploadRequest header;  // 800 KB of the 1 MiB budget reserved, then nothing more
  header.set_dtype(v1::FLOAT32);
  header.add_shape(200000);
  header.set_data(std::string(4000, 'x'));
  ASSERT_TRUE(stalled->Write(header));
  // The header's reservation first (Write returns once the bytes are queued, not read): else
  // the other upload may take the budget first, and the stalled one is refused instead.
  for (int i = 0; i < 500 && List().used_bytes() < 800000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(List().used_bytes(), 800000) << "the server never reserved the header's budget";
  std::string h;
  grpc::Status other;
  int refused = 0;
  for (int i = 0; i < 100; ++i) {  // up to 5 s
    other = Upload(RandomFloats(100000), {100000}, v1::FLOAT32, &h);
    if (other.ok()) break;
    EXPECT_EQ(other.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << other.error_message();
    ++refused;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(other.ok()) << "the stalled upload still holds its budget: "
                          << other.error_message();
  EXPECT_GE(refused, 1);  // it did hold it while it waited
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(List().tensors_size(), 1);  // the other upload's only
}

TEST_F(ServiceTest, AnUploadThatKeepsSendingAtTheMinimumRateOutlivesTheStallTimeout) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.8;  // all its waits may take 0.8 s + 1 s per MiB: 2.8 s
  StartServer(o);
  // 16 messages of 128 KiB, 100 ms apart: 1.6 s (twice the timeout), 1.25 MiB/s.
  const auto a = RandomFloats(16 * 32 * 1024);
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto w = stub_->Upload(ctx.get(), &resp);
  for (int i = 0; i < 16; ++i) {
    v1::UploadRequest m;
    if (i == 0) {
      m.set_dtype(v1::FLOAT32);
      m.add_shape(16 * 32 * 1024);
    }
    m.set_data(a.data() + i * 128 * 1024, 128 * 1024);
    ASSERT_TRUE(w->Write(m));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  w->WritesDone();
  const grpc::Status s = w->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::string back;
  ASSERT_TRUE(Download(resp.tensor().handle(), &back).ok());
  EXPECT_EQ(back, std::string(a.begin(), a.end()));
}

TEST_F(ServiceTest, ADownloadWhoseReaderStopsIsCancelled) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.3;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(1 << 18), {1 << 18}, v1::FLOAT32, &h).ok());  // 1 MiB
  SlowDownload d = OpenSlowDownload(server_->port(), h);  // the window holds 4 messages
  v1::DownloadResponse m;
  ASSERT_TRUE(d.reader->Read(&m));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the reader stops
  int messages = 1;
  while (d.reader->Read(&m)) ++messages;
  EXPECT_LT(messages, 64);
  EXPECT_EQ(d.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(List().tensors_size(), 1);  // the tensor itself stays
}

// A loopback TCP proxy to a server for one connection, which can stop passing the server's
// bytes on (a client that takes nothing more, as the server sees it) or pass either side's
// at a set rate (a slow client; 0 = as fast as they come).
class PausableProxy {
 public:
  explicit PausableProxy(int server_port, int64_t server_bytes_per_second = 0,
                         int64_t client_bytes_per_second = 0)
      : server_port_(server_port),
        rate_(server_bytes_per_second),
        client_rate_(client_bytes_per_second) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        listen(listen_fd_, 1) == 0 &&
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~PausableProxy() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  void Pause(bool paused) { paused_ = paused; }

 private:
  // Passes what `from` has, at most `most` bytes; false: closed.
  static bool Pass(int from, int to, size_t most = 65536) {
    char buf[65536];
    const ssize_t n = read(from, buf, std::min(most, sizeof buf));
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }
  void Run() {
    int client = -1;
    while (!stop_ && client < 0) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) > 0) client = accept(listen_fd_, nullptr, nullptr);
    }
    if (client < 0) return;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      while (!stop_) {
        pollfd p[2] = {{client, POLLIN, 0}, {server, static_cast<short>(paused_ ? 0 : POLLIN), 0}};
        if (poll(p, 2, 20) <= 0) continue;
        if (p[0].revents & (POLLIN | POLLHUP)) {
          if (!Pass(client, server, client_rate_ > 0 ? 16384 : 65536)) break;
          if (client_rate_ > 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(16384000000 / client_rate_));
          }
        }
        if (p[1].revents & (POLLIN | POLLHUP)) {
          if (!Pass(server, client, rate_ > 0 ? 16384 : 65536)) break;
          if (rate_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(16384000000 / rate_));
        }
      }
    }
    close(server);
    close(client);
  }

  const int server_port_;
  const int64_t rate_, client_rate_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> paused_{false}, stop_{false};
  std::thread thread_;
};

// A stub through `proxy`, its connection made before the proxy stops passing the server's
// bytes on.
std::unique_ptr<KernelService::Stub> ConnectThenPause(PausableProxy& proxy) {
  auto stub = StubWithoutBdpProbing(proxy.port());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::FreeTensorRequest none;
  none.set_handle("none");
  v1::FreeTensorResponse freed;
  stub->FreeTensor(&ctx, none, &freed);  // NOT_FOUND, over the connection
  proxy.Pause(true);
  return stub;
}

// Gelu on 1 MiB inline: 1 MiB in, 1 MiB out (sent from where it is computed, so held once: 2 MiB
// of the in-flight budget).
v1::GeluRequest InlineGelu1MiB() {
  v1::GeluRequest req;
  const auto x = RandomFloats(1 << 18);
  req.mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
  req.mutable_input()->mutable_tensor()->add_shape(1 << 18);
  req.mutable_input()->mutable_tensor()->set_data(x.data(), x.size());
  return req;
}

// Calls `req` until the server has room for it (RESOURCE_EXHAUSTED until then), 5 s at most;
// returns the last status and counts the refusals in *refused.
grpc::Status GeluOnceThereIsRoom(KernelService::Stub& stub, const v1::GeluRequest& req,
                                 int* refused) {
  grpc::Status s;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GeluResponse resp;
    s = stub.Gelu(&ctx, req, &resp);
    if (s.ok()) break;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    ++*refused;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

// Replies handed to gRPC count until their calls end, against gRPC's buffers (at least
// --inflight_mib, and two of the largest messages). Past that, they keep every call out until
// the stall timeout cancels them and their bytes return.
TEST_F(ServiceTest, RepliesTheClientDoesNotTakeAreCancelledAndReturnTheirInflightBytes) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.3;  // a 1 MiB reply may wait 0.3 s + 1 s
  o.inflight_bytes = (3 << 20) + (64 << 10);  // three replies of 1 MiB and their framing
  o.max_message_bytes = 3 << 19;              // 1.5 MiB: gRPC's buffers are the above
  StartServer(o);
  // Small requests for 1 MiB replies (the paused proxy passes only a few MiB of requests).
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(1 << 18), {1 << 18}, v1::FLOAT32, &h).ok());
  v1::GeluRequest by_handle;
  by_handle.mutable_input()->set_handle(h);
  PausableProxy proxy(server_->port());
  ASSERT_GT(proxy.port(), 0);
  auto stub = ConnectThenPause(proxy);
  const v1::GeluRequest req = InlineGelu1MiB();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<PendingGelu>> untaken;
  for (int i = 0; i < 4; ++i) {  // each alone, beside the replies before it: 4 MiB of them
    contexts.push_back(Ctx());
    untaken.push_back(std::make_unique<PendingGelu>(*stub, contexts.back().get(), by_handle));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // answered, not taken
  }
  int refused = 0;
  const grpc::Status other = GeluOnceThereIsRoom(*stub_, req, &refused);
  EXPECT_TRUE(other.ok()) << "the untaken replies still hold their bytes: "
                          << other.error_message();
  EXPECT_GE(refused, 1);  // they did hold them while they waited
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the last one's allowance
  proxy.Pause(false);
  for (auto& call : untaken) EXPECT_EQ(call->Wait().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(ServiceTest, ListingsTheClientDoesNotTakeAreCancelledAndReturnTheirInflightBytes) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.6;  // a listing of 1 MiB may wait 1.6 s
  o.inflight_bytes = 3 << 20;
  o.max_message_bytes = 3 << 19;  // 1.5 MiB: gRPC's buffers are 3 MiB
  StartServer(o);
  // 1600 empty tensors of 64 axes: a listing of about 1 MiB.
  std::vector<int64_t> shape(64, int64_t{1} << 62);
  shape[0] = 0;
  for (int i = 0; i < 1600; ++i) {
    ASSERT_TRUE(Upload({}, shape, v1::FLOAT32, nullptr).ok());
  }
  PausableProxy proxy(server_->port());
  ASSERT_GT(proxy.port(), 0);
  auto stub = ConnectThenPause(proxy);
  const v1::ListTensorsRequest all;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::ListTensorsResponse> untaken(4);
  std::vector<std::promise<grpc::Status>> untaken_status(4);
  for (int i = 0; i < 4; ++i) {
    contexts.push_back(Ctx());
    stub->async()->ListTensors(contexts.back().get(), &all, &untaken[i],
                               [&, i](grpc::Status s) { untaken_status[i].set_value(s); });
    // It has been answered (each holds 2 MiB of the budget while it is built: one at a time).
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  int refused = 0;
  const grpc::Status other = GeluOnceThereIsRoom(*stub_, InlineGelu1MiB(), &refused);
  EXPECT_TRUE(other.ok()) << "the untaken listings still hold their bytes: "
                          << other.error_message();
  EXPECT_GE(refused, 1);  // they did hold them while they waited
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the last one's allowance
  proxy.Pause(false);
  for (auto& st : untaken_status) {
    EXPECT_EQ(st.get_future().get().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(List().tensors_size(), 1600);  // a listing the client takes is whole
}

TEST_F(ServiceTest, AListingPastTheMessageLimitAsksForOneHandleAtATime) {
  ServerOptions o;
  o.max_message_bytes = 64 << 10;
  StartServer(o);
  std::vector<int64_t> shape(64, int64_t{1} << 62);  // about 650 bytes listed each
  shape[0] = 0;
  std::string h;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(Upload({}, shape, v1::FLOAT32, &h).ok());
  auto ctx = Ctx();
  v1::ListTensorsResponse all;
  const grpc::Status s = stub_->ListTensors(ctx.get(), v1::ListTensorsRequest(), &all);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("one handle at a time"), std::string::npos) << s.error_message();
  auto ctx1 = Ctx();
  v1::ListTensorsRequest one;
  one.set_handle(h);
  v1::ListTensorsResponse listed;
  ASSERT_TRUE(stub_->ListTensors(ctx1.get(), one, &listed).ok());
  EXPECT_EQ(listed.tensors_size(), 1);
}

TEST_F(ServiceTest, AReplyTakenSteadilyButSlowlyOutlivesTheStallTimeout) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.3;  // a 2 MiB reply may take 0.3 s + 2 s (1 MiB/s)
  StartServer(o);
  PausableProxy proxy(server_->port(), /*server_bytes_per_second=*/2 << 20);  // about 1 s
  ASSERT_GT(proxy.port(), 0);
  auto stub = StubWithoutBdpProbing(proxy.port());
  v1::GeluRequest req = KeptGelu(1 << 19);  // 2 MiB in, 2 MiB out inline
  req.clear_output_options();
  auto ctx = Ctx();
  v1::GeluResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  const grpc::Status s = stub->Gelu(ctx.get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(600));  // slow
  EXPECT_EQ(resp.output().tensor().data().size(), size_t{2} << 20);
}

TEST_F(ServiceTest, AnUploadsFirstMessageSentSlowlyOutlivesTheStallTimeout) {
  ServerOptions o;
  // The first message may take the timeout + its size at 1 MiB/s; it takes twice the timeout.
  // 1 s, not less: the reply then has 1 s to get through the proxy (0.3 s was missed once under
  // ASan on a loaded 2-core machine).
  o.stall_timeout_seconds = 1.0;
  StartServer(o);
  PausableProxy proxy(server_->port(), 0, /*client_bytes_per_second=*/2 << 20);  // about 2 s
  ASSERT_GT(proxy.port(), 0);
  auto stub = StubWithoutBdpProbing(proxy.port());
  const auto a = RandomFloats(1 << 20);  // 4 MiB, in one message
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto w = stub->Upload(ctx.get(), &resp);
  v1::UploadRequest m;
  m.set_dtype(v1::FLOAT32);
  m.add_shape(1 << 20);
  m.set_data(a.data(), a.size());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(w->Write(m));
  w->WritesDone();
  const grpc::Status s = w->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1200));  // slow
}

TEST_F(ServiceTest, AnUploadsLaterMessageLargerThanAnyBeforeOutlivesTheStallTimeout) {
  ServerOptions o;
  // The next message may take 1 s + 1 s per MiB still missing (4 s); the timeout alone would
  // cancel it. (A longer timeout than other tests': the reply must also reach the client within
  // it, and under a sanitizer on a loaded machine 0.3 s was not always enough.)
  o.stall_timeout_seconds = 1.0;
  StartServer(o);
  PausableProxy proxy(server_->port(), 0, /*client_bytes_per_second=*/2 << 20);
  ASSERT_GT(proxy.port(), 0);
  auto stub = StubWithoutBdpProbing(proxy.port());
  const int64_t n = (3 << 20) / 4 + 1024;  // 4 KiB with the header, then 3 MiB: about 1.5 s
  const auto a = RandomFloats(n);
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto w = stub->Upload(ctx.get(), &resp);
  v1::UploadRequest first;
  first.set_dtype(v1::FLOAT32);
  first.add_shape(n);
  first.set_data(a.data(), 4096);
  v1::UploadRequest rest;
  rest.set_data(a.data() + 4096, a.size() - 4096);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(w->Write(first));
  ASSERT_TRUE(w->Write(rest));
  w->WritesDone();
  const grpc::Status s = w->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1200));  // slow
  std::string back;
  ASSERT_TRUE(Download(resp.tensor().handle(), &back).ok());
  EXPECT_EQ(back, std::string(a.begin(), a.end()));
}

// A Download read slowly for longer than the arrival timeout: its connection receives next to
// nothing (the reader's window updates) but serves a call, so it stays open. Calls are matched
// to their connections by peer address: IPv4, and IPv6 where the host has it.
TEST(ServiceConnectionTest, AConnectionServingACallIsNotClosedForReceivingLittle) {
  for (const std::string host : {"127.0.0.1", "[::1]"}) {
    ServerOptions o;
    o.address = host + ":0";
    o.backend.kind = "cpu";
    o.arrival_timeout_seconds = 0.3;
    auto server = FuseboxServer::Start(o);
    if (!server.ok() && host != "127.0.0.1") continue;  // no IPv6 here
    ASSERT_TRUE(server.ok()) << server.status();
    const std::string target = host + ":" + std::to_string((*server)->port());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // the server writes only as fast as we read
    auto stub = KernelService::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    const auto a = RandomFloats(1 << 18);  // 1 MiB
    grpc::ClientContext up;
    v1::UploadResponse uploaded;
    auto w = stub->Upload(&up, &uploaded);
    v1::UploadRequest m;
    m.set_dtype(v1::FLOAT32);
    m.add_shape(1 << 18);
    m.set_data(a.data(), a.size());
    ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    ASSERT_TRUE(w->Finish().ok());
    grpc::ClientContext down;
    v1::DownloadRequest req;
    req.set_handle(uploaded.tensor().handle());
    req.set_chunk_bytes(16 << 10);
    auto r = stub->Download(&down, req);
    v1::DownloadResponse chunk;
    std::string got;
    while (r->Read(&chunk)) {  // 64 chunks, one each 25 ms: 1.6 s
      got += chunk.data();
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    const grpc::Status s = r->Finish();
    EXPECT_TRUE(s.ok()) << host << ": " << s.error_message();
    EXPECT_EQ(got, std::string(a.begin(), a.end())) << host;
    (*server)->Shutdown(5);
  }
}

TEST_F(ServiceTest, StalledCallsAreStillCancelledWhileTheServerDrains) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.05;
  StartServer(o);
  std::string h;
  ASSERT_TRUE(Upload(RandomFloats(1 << 18), {1 << 18}, v1::FLOAT32, &h).ok());  // 1 MiB
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto upload = stub_->Upload(ctx.get(), &resp);
  v1::UploadRequest header;  // 4 bytes short, then nothing more
  header.set_dtype(v1::FLOAT32);
  header.add_shape(1001);
  header.set_data(std::string(4000, 'x'));
  ASSERT_TRUE(upload->Write(header));
  SlowDownload d = OpenSlowDownload(server_->port(), h);
  v1::DownloadResponse m;
  ASSERT_TRUE(d.reader->Read(&m));  // then it reads no more
  const auto t0 = std::chrono::steady_clock::now();
  // Their allowances (0.05 s, and 1 s per MiB the download moved and has in transit) end
  // within ~3 s; the drain would wait 20.
  server_->Shutdown(/*drain_seconds=*/20, /*notice_seconds=*/0.2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "the drain waited for calls stalled on their clients";
  EXPECT_EQ(upload->Finish().error_code(), grpc::StatusCode::CANCELLED);
  while (d.reader->Read(&m)) {
  }
  EXPECT_EQ(d.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(ServiceTest, TransfersPastTheInflightLimitAreResourceExhaustedUntilOthersEnd) {
  ServerOptions o;
  o.inflight_bytes = 6 << 20;
  StartServer(o);
  const auto a = RandomFloats(1 << 20);  // 4 MiB
  std::string h;
  ASSERT_TRUE(Upload(a, {1 << 20}, v1::FLOAT32, &h).ok());

  // A Download in 2 MiB chunks holds 4 MiB of the 6 (a chunk and gRPC's copy of it) until
  // it ends; its reader takes nothing yet.
  auto stub = StubWithoutBdpProbing(server_->port());
  auto ctx = Ctx();
  v1::DownloadRequest req;
  req.set_handle(h);
  req.set_chunk_bytes(2 << 20);
  auto first = stub->Download(ctx.get(), req);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it has started
  std::string data;
  grpc::Status s = Download(h, &data, "", 2 << 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--inflight_mib"), std::string::npos) << s.error_message();
  // So does an Upload's message meanwhile; nothing of it is kept.
  std::string h2;
  s = Upload(a, {1 << 20}, v1::FLOAT32, &h2, "", 4 << 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(List().tensors_size(), 1);

  v1::DownloadResponse m;
  std::string got;
  while (first->Read(&m)) got += m.data();
  ASSERT_TRUE(first->Finish().ok());
  EXPECT_EQ(got, std::string(a.begin(), a.end()));
  // Once it has ended, both fit.
  EXPECT_TRUE(Download(h, &data, "", 2 << 20).ok());
  EXPECT_TRUE(Upload(a, {1 << 20}, v1::FLOAT32, &h2, "", 4 << 20).ok());
}

TEST_F(ServiceTest, TransfersOneAfterAnotherEachFitAloneUnderASmallInflightLimit) {
  ServerOptions o;
  o.inflight_bytes = 1 << 20;  // less than any one of these transfers holds
  StartServer(o);
  const auto a = RandomFloats(1 << 20);  // 4 MiB
  std::string h, data;
  ASSERT_TRUE(Upload(a, {1 << 20}, v1::FLOAT32, &h, "", 2 << 20).ok());
  for (int i = 0; i < 100; ++i) {  // each finds the budget its predecessor held given back
    grpc::Status s = Download(h, &data, "", 2 << 20);
    ASSERT_TRUE(s.ok()) << "round " << i << ": " << s.error_message();
    std::string other;
    s = Upload(a, {1 << 20}, v1::FLOAT32, &other, "", 2 << 20);
    ASSERT_TRUE(s.ok()) << "round " << i << ": " << s.error_message();
    auto ctx = Ctx();
    v1::FreeTensorRequest free;
    free.set_handle(other);
    v1::FreeTensorResponse freed;
    ASSERT_TRUE(stub_->FreeTensor(ctx.get(), free, &freed).ok());
    ASSERT_EQ(List().tensors_size(), 1);  // a small listing takes no budget
  }
}

// A client that sends a byte now and then, each well within the stall timeout, still keeps to
// no rate: its waits add up, and the upload is cancelled once they pass the timeout and the
// time its bytes take at 1 MiB/s, its reservation returned.
TEST_F(ServiceTest, AnUploadTricklingOneByteAtATimeIsCancelledWithinItsAllowance) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.3;  // 1 MiB to come: its waits may take 0.3 s + about 1 s
  StartServer(o);
  auto ctx = Ctx();
  v1::UploadResponse resp;
  auto w = stub_->Upload(ctx.get(), &resp);
  v1::UploadRequest m;
  m.set_dtype(v1::FLOAT32);
  m.add_shape(1 << 18);
  m.set_data("x");
  const auto t0 = std::chrono::steady_clock::now();
  bool written = w->Write(m);
  for (int i = 0; written && i < 25; ++i) {  // one byte each 200 ms, 5 s at most
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    v1::UploadRequest byte;
    byte.set_data("x");
    written = w->Write(byte);
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  const grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_GT(took, std::chrono::milliseconds(1000));  // its allowance did count its bytes
  EXPECT_LT(took, std::chrono::milliseconds(2500)) << "the trickle kept the upload alive";
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
  EXPECT_EQ(List().tensors_size(), 0);
}

// alice's client stops taking replies: they hold her share of the in-flight budget and no
// more (her calls are refused once they fill it), and bob's calls still fit.
TEST_F(TokenServiceTest, ATenantWhoseClientTakesNoRepliesCannotStarveAnother) {
  ServerOptions o;
  o.token_file = path_;
  o.inflight_bytes = 6 << 20;       // two tenants: 3 MiB each
  o.max_message_bytes = 2 << 20;    // gRPC's buffers, the replies' budget: 6 MiB, 3 MiB each
  StartServer(o);
  PausableProxy proxy(server_->port());
  ASSERT_GT(proxy.port(), 0);
  auto alice = ConnectThenPause(proxy);
  const v1::GeluRequest req = InlineGelu1MiB();  // its reply: 1 MiB, until taken
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<PendingGelu>> calls;
  for (int i = 0; i < 6; ++i) {
    ctxs.push_back(Ctx("secret-a"));
    calls.push_back(std::make_unique<PendingGelu>(*alice, ctxs.back().get(), req));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // answered, not taken
    v1::GeluResponse resp;
    auto c = Ctx("secret-b");
    const grpc::Status bob = stub_->Gelu(c.get(), req, &resp);
    ASSERT_TRUE(bob.ok()) << "alice's " << i + 1 << " untaken calls starve bob: "
                          << bob.error_message();
  }
  proxy.Pause(false);
  // Replies the client has not taken hold her share until they fill it: then her calls are
  // refused. (Some of a reply may sit in the socket's buffers, which the server cannot tell
  // from taken: how many are answered first varies.)
  int refused = 0;
  std::string pattern;
  for (auto& call : calls) {
    const grpc::Status s = call->Wait();
    pattern += s.ok() ? 'a' : 'r';
    if (s.ok()) continue;
    ++refused;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("--tenant_inflight_share"), std::string::npos)
        << s.error_message();
  }
  EXPECT_GE(refused, 1) << pattern;
  EXPECT_EQ(pattern.substr(0, 2), "aa") << "her first calls are hers to make";
}

// Empty tensors cost no quota; each tenant may still hold only its share of --max_tensors.
TEST_F(TokenServiceTest, ATenantCannotTakeEveryPlaceInTheTensorTable) {
  ServerOptions o;
  o.token_file = path_;
  o.max_tensors = 10;  // two tenants: 5 each
  StartServer(o);
  int held = 0;
  grpc::Status s;
  for (int i = 0; i < 10; ++i) {
    s = Upload({}, {0}, v1::FLOAT32, nullptr, "secret-a");
    if (!s.ok()) break;
    ++held;
  }
  EXPECT_EQ(held, 5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("--max_tensors_per_tenant"), std::string::npos)
      << s.error_message();
  for (int i = 0; i < 5; ++i) {
    s = Upload({}, {0}, v1::FLOAT32, nullptr, "secret-b");
    EXPECT_TRUE(s.ok()) << "bob, tensor " << i << ": " << s.error_message();
  }
  EXPECT_EQ(List("secret-a").tensors_size(), 5);
}

// A call alone always fits: a client that makes its calls one after another, each near
// --inflight_mib or past it, is never refused, though the server may not yet have seen its
// previous call end (its reply taken) when the next arrives.
TEST_F(ServiceTest, CallsOneAfterAnotherEachFitAloneNearTheInflightLimit) {
  ServerOptions o;
  o.inflight_bytes = 4 << 20;
  StartServer(o);
  const v1::GeluRequest near = InlineGelu1MiB();  // 1 MiB in, 1 MiB out: 2 MiB of 4
  v1::GeluRequest past = KeptGelu(3 << 18);       // 3 MiB in, 3 MiB out: 6 MiB
  past.clear_output_options();
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    auto ctx = Ctx();
    v1::GeluResponse resp;
    const grpc::Status s = stub_->Gelu(ctx.get(), i % 3 == 2 ? past : near, &resp);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  EXPECT_EQ(refused, 0) << "of 300 calls, each alone";
}

TEST_F(ServiceTest, ChainedOpsKeepIntermediatesOnTheServer) {
  StartServer({});
  const int64_t m = 37, k = 53, n = 129;
  const uint64_t seed = std::random_device{}();
  const auto a = ref::RandomTensor(DType::kFloat32, m * k, -1, 1, seed);
  const auto b = ref::RandomTensor(DType::kFloat32, k * n, -1, 1, seed + 1);
  std::string ha, hb;
  ASSERT_TRUE(Upload(a, {m, k}, v1::FLOAT32, &ha).ok());
  ASSERT_TRUE(Upload(b, {k, n}, v1::FLOAT32, &hb).ok());

  v1::MatmulReluRequest mm;
  mm.mutable_a()->set_handle(ha);
  mm.mutable_b()->set_handle(hb);
  mm.mutable_output_options()->set_keep_on_server(true);
  v1::MatmulReluResponse mmr;
  ASSERT_TRUE(stub_->MatmulRelu(Ctx().get(), mm, &mmr).ok());
  ASSERT_TRUE(mmr.output().has_handle() || !mmr.output().handle().empty());
  EXPECT_FALSE(mmr.output().has_tensor());

  v1::SoftmaxRequest sm;
  sm.mutable_input()->set_handle(mmr.output().handle());
  sm.mutable_output_options()->set_keep_on_server(true);
  v1::SoftmaxResponse smr;
  ASSERT_TRUE(stub_->Softmax(Ctx().get(), sm, &smr).ok());

  v1::RowSumRequest rs;
  rs.mutable_input()->set_handle(smr.output().handle());
  v1::RowSumResponse rsr;
  ASSERT_TRUE(stub_->RowSum(Ctx().get(), rs, &rsr).ok());
  ASSERT_EQ(rsr.output().tensor().shape_size(), 1);
  ASSERT_EQ(rsr.output().tensor().shape(0), m);

  // Reference: relu(a b) -> softmax -> row sum (each row sums to 1).
  auto mmref = ref::MatmulRelu(DType::kFloat32, a.data(), b.data(), nullptr, m, n, k);
  std::vector<float> mmf(mmref.begin(), mmref.end());
  auto smref = ref::Softmax(DType::kFloat32, mmf.data(), m, n);
  std::vector<float> smf(smref.begin(), smref.end());
  auto rsref = ref::RowSum(DType::kFloat32, smf.data(), m, n);
  ASSERT_EQ(rsr.output().tensor().data().size(), static_cast<size_t>(m) * 4);
  auto cmp = ref::Compare(DType::kFloat32, rsr.output().tensor().data().data(), rsref, 1e-5);
  EXPECT_TRUE(cmp.ok) << cmp.rel_error;
  // The intermediates are held and downloadable, and each is its step's result (the row sums
  // alone would pass any softmax: every row of one sums to 1).
  std::string mid;
  ASSERT_TRUE(Download(mmr.output().handle(), &mid).ok());
  ASSERT_EQ(mid.size(), static_cast<size_t>(m * n) * 4);
  EXPECT_TRUE(ref::Compare(DType::kFloat32, mid.data(), mmref, 1e-5).ok);
  ASSERT_TRUE(Download(smr.output().handle(), &mid).ok());
  ASSERT_EQ(mid.size(), static_cast<size_t>(m * n) * 4);
  EXPECT_TRUE(ref::Compare(DType::kFloat32, mid.data(), smref, 1e-5).ok);
  EXPECT_EQ(List().tensors_size(), 4);
}

TEST_F(ServiceTest, FreeingWhileOpsReadTheTensorIsSafe) {
  StartServer({});
  const auto x = RandomFloats(1 << 18);
  const auto want = ref::Gelu(DType::kFloat32, x.data(), 1 << 18);
  for (int round = 0; round < 5; ++round) {
    std::string h;
    ASSERT_TRUE(Upload(x, {1 << 18}, v1::FLOAT32, &h).ok());
    std::atomic<int> ok{0}, not_found{0};
    std::vector<std::thread> readers;
    for (int i = 0; i < 4; ++i) {
      readers.emplace_back([&] {
        for (int j = 0; j < 5; ++j) {
          v1::GeluRequest req;
          req.mutable_input()->set_handle(h);
          v1::GeluResponse resp;
          grpc::Status s = stub_->Gelu(Ctx().get(), req, &resp);
          if (s.ok()) {
            ASSERT_EQ(resp.output().tensor().data().size(), want.size() * 4);
            EXPECT_TRUE(ref::Compare(DType::kFloat32, resp.output().tensor().data().data(), want,
                                     1e-5).ok);
            ++ok;
          } else {
            EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
            ++not_found;
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 5));
    v1::FreeTensorRequest freq;
    freq.set_handle(h);
    v1::FreeTensorResponse fresp;
    EXPECT_TRUE(stub_->FreeTensor(Ctx().get(), freq, &fresp).ok());
    for (auto& t : readers) t.join();  // each answer right or NOT_FOUND (above), none lost
  }
  EXPECT_EQ(server_->store().TenantUsedBytes("anonymous"), 0);
}

// An empty row sum or a K = 0 product needs no kernel; its result is built in host memory even
// when kept, and costs the client nothing to ask for: inline or kept, it may be no larger than
// the request's tensors, or 64 KiB.
TEST_F(ServiceTest, ResultsThatNeedNoKernelAreHeldToTheRequestsSize) {
  ServerOptions o;
  o.max_message_bytes = 1 << 20;  // inline results up to 1 MiB - 4 KiB
  StartServer(o);
  auto empty = [](std::vector<int64_t> shape) {
    v1::Tensor t;
    t.set_dtype(v1::FLOAT32);
    for (int64_t d : shape) t.add_shape(d);
    return t;
  };
  v1::RowSumRequest rs;
  *rs.mutable_input()->mutable_tensor() = empty({1 << 18, 0});  // 1 MiB of zeros, inline
  v1::RowSumResponse rsr;
  grpc::Status s = stub_->RowSum(Ctx().get(), rs, &rsr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("need no kernel"), std::string::npos) << s.error_message();
  *rs.mutable_input()->mutable_tensor() = empty({int64_t{1} << 40, 0});  // 4 TiB, kept
  rs.mutable_output_options()->set_keep_on_server(true);
  s = stub_->RowSum(Ctx().get(), rs, &rsr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("need no kernel"), std::string::npos) << s.error_message();
  v1::MatmulReluRequest mm;
  *mm.mutable_a()->mutable_tensor() = empty({1 << 20, 0});
  *mm.mutable_b()->mutable_tensor() = empty({0, 1 << 10});  // 4 GiB of zeros
  mm.mutable_output_options()->set_keep_on_server(true);
  v1::MatmulReluResponse mmr;
  s = stub_->MatmulRelu(Ctx().get(), mm, &mmr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(List().tensors_size(), 0);

  // Within the limit: kept, and downloads as relu(bias) in every row.
  *mm.mutable_a()->mutable_tensor() = empty({1000, 0});
  *mm.mutable_b()->mutable_tensor() = empty({0, 3});
  const float bias[3] = {-1.0f, 2.0f, 0.5f};
  *mm.mutable_bias()->mutable_tensor() = empty({3});
  mm.mutable_bias()->mutable_tensor()->set_data(bias, sizeof bias);
  ASSERT_TRUE(stub_->MatmulRelu(Ctx().get(), mm, &mmr).ok());
  std::string kept;
  ASSERT_TRUE(Download(mmr.output().handle(), &kept).ok());
  ASSERT_EQ(kept.size(), 1000u * 3 * 4);
  std::vector<float> got(3000);
  std::memcpy(got.data(), kept.data(), kept.size());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(got[3 * i], 0.0f) << i;
    ASSERT_EQ(got[3 * i + 1], 2.0f) << i;
    ASSERT_EQ(got[3 * i + 2], 0.5f) << i;
  }
}

TEST_F(ServiceTest, BadRequestsGetClearErrorsAndTheServerKeepsServing) {
  StartServer({});
  v1::GeluRequest bad;
  bad.mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
  bad.mutable_input()->mutable_tensor()->add_shape(3);
  bad.mutable_input()->mutable_tensor()->set_data("12345");
  v1::GeluResponse resp;
  grpc::Status s = stub_->Gelu(Ctx().get(), bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("has 5 bytes"), std::string::npos);
  v1::GeluRequest good;
  good.mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
  good.mutable_input()->mutable_tensor()->add_shape(1);
  const float one = 1.0f;
  good.mutable_input()->mutable_tensor()->set_data(&one, 4);
  ASSERT_TRUE(stub_->Gelu(Ctx().get(), good, &resp).ok());
  float out;
  std::memcpy(&out, resp.output().tensor().data().data(), 4);
  EXPECT_NEAR(out, 0.8411920f, 1e-6);
  EXPECT_EQ(resp.timing().backend(), "cpu");
  EXPECT_GT(resp.timing().total_us(), 0);
}

TEST_F(ServiceTest, ShutdownTurnsHealthNotServingWhileStillServingThenRefuses) {
  StartServer({});
  auto health = client::Client::Create("127.0.0.1:" + std::to_string(server_->port()));
  ASSERT_EQ(*health->Health(), client::HealthStatus::kServing);
  std::thread stopper([this] { server_->Shutdown(/*drain_seconds=*/5, /*notice_seconds=*/1.5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto during = health->Health();
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(*during, client::HealthStatus::kNotServing);
  v1::GeluRequest req;
  req.mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
  req.mutable_input()->mutable_tensor()->add_shape(1);
  req.mutable_input()->mutable_tensor()->set_data(std::string(4, '\0'));
  v1::GeluResponse resp;
  EXPECT_TRUE(stub_->Gelu(Ctx().get(), req, &resp).ok());  // still served during the notice
  stopper.join();
  EXPECT_FALSE(stub_->Gelu(Ctx().get(), req, &resp).ok());  // and refused after
}

// A second Shutdown, while the first is in its notice, returns only when the first is done.
TEST_F(ServiceTest, EveryShutdownCallerWaitsForTheFirstToFinish) {
  StartServer({});
  auto health = client::Client::Create("127.0.0.1:" + std::to_string(server_->port()));
  ASSERT_EQ(*health->Health(), client::HealthStatus::kServing);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread first([this] { server_->Shutdown(/*drain_seconds=*/5, /*notice_seconds=*/1.0); });
  for (int i = 0; i < 250; ++i) {  // the first caller has begun: health reads NOT_SERVING
    auto h = health->Health();
    if (h.ok() && *h == client::HealthStatus::kNotServing) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->Shutdown(0);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(950));
  first.join();
}

// A loopback port nobody listens on now (bound, then released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The body of GET http://127.0.0.1:port/path (HTTP/1.0: the server closes); empty if it
// does not answer within 10 s.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const timeval wait{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

// The value of the one `name{...}` line of `text` that has every label of
// `labels` (`key="value"` pieces); NaN if none does, or more than one.
double MetricValue(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels) {
  double value = NAN;
  int found = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (!all) continue;
    ++found;
    value = std::stod(line.substr(line.rfind(' ') + 1));
  }
  return found == 1 ? value : NAN;
}

// service.cc fills the response's Timing and the metrics from the same
// OpTiming: for every phase, launch included, /metrics counts each call once
// and sums what the responses said (launch_us is 0 on the CPU backend, but
// the series is there and counts the calls).
TEST_F(ServiceTest, MetricsAreServedWhileClientsStallMidRequest) {
  const int metrics_port = StartServerWithMetrics();
  if (metrics_port == 0) GTEST_SKIP() << "no free port for /metrics";
  std::vector<int> stalled;  // half a request line each, then nothing
  for (int i = 0; i < 3; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(metrics_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(write(fd, "GET /metr", 9), 9);
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string body = HttpGet(metrics_port, "/metrics");
  EXPECT_NE(body.find("fusebox_calls_in_flight"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  for (int fd : stalled) close(fd);
}

TEST_F(ServiceTest, MetricsPhasesMatchTheResponsesTimingLaunchIncluded) {
  const int metrics_port = StartServerWithMetrics();
  ASSERT_GT(metrics_port, 0);
  constexpr int kCalls = 7;
  const char* phases[] = {"queue", "copy_in", "launch", "kernel", "copy_out", "total"};
  double sums[6] = {};
  for (int i = 0; i < kCalls; ++i) {
    v1::SoftmaxRequest req;
    auto* t = req.mutable_input()->mutable_tensor();
    t->set_dtype(v1::FLOAT32);
    t->add_shape(4);
    t->add_shape(64 * (i + 1));
    const std::vector<float> x(4 * 64 * (i + 1), 0.5f);
    t->set_data(x.data(), x.size() * sizeof(float));
    v1::SoftmaxResponse resp;
    ASSERT_TRUE(stub_->Softmax(Ctx().get(), req, &resp).ok());
    const v1::Timing& tm = resp.timing();
    const double us[6] = {tm.queue_us(),  tm.copy_in_us(),  tm.launch_us(),
                          tm.kernel_us(), tm.copy_out_us(), tm.total_us()};
    for (int p = 0; p < 6; ++p) sums[p] += us[p];
    EXPECT_EQ(tm.launch_us(), 0);  // the CPU backend launches nothing
  }
  const std::string text = HttpGet(metrics_port, "/metrics");
  ASSERT_FALSE(text.empty());
  for (int p = 0; p < 6; ++p) {
    SCOPED_TRACE(phases[p]);
    const std::vector<std::string> labels = {
        "op=\"Softmax\"", "dtype=\"float32\"", "device=\"cpu\"",
        std::string("phase=\"") + phases[p] + "\""};
    EXPECT_EQ(MetricValue(text, "fusebox_call_phase_duration_seconds_count", labels), kCalls);
    EXPECT_NEAR(MetricValue(text, "fusebox_call_phase_duration_seconds_sum", labels),
                sums[p] * 1e-6, 1e-6 * sums[p] * 1e-6 + 1e-12);
  }
}

// A service of the test's own making on a loopback port, and a stub for it.
// One call to `method` of KernelService with `body` as its request's bytes, whatever they
// are (a unary call: one message each way, for streaming methods too).
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& body) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1), reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/fusebox.v1.KernelService/" + method, grpc::StubOptions(), &request,
                 &reply, [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

const char* const kMethods[] = {"Gelu",   "Softmax",  "RowSum",     "MatmulRelu",
                                "Upload", "Download", "FreeTensor", "ListTensors"};

// A body that is not a protobuf message at all, for every method: INVALID_ARGUMENT with the
// reason, and counted in fusebox_calls_total like any other bad request.
TEST_F(ServiceTest, BodiesThatDoNotParseAreInvalidArgumentWithAReasonAndCounted) {
  const int metrics_port = StartServerWithMetrics();
  if (metrics_port == 0) GTEST_SKIP() << "no free port for /metrics";
  for (const char* method : kMethods) {
    for (const std::string& body : {std::string("\xff\xff\xff", 3), std::string("\x0a\x05\x01", 3),
                                    std::string("\x00", 1)}) {
      const grpc::Status s = RawCall(channel_, method, body);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      EXPECT_NE(s.error_message().find("not a well-formed protobuf message"), std::string::npos)
          << method << ": " << s.error_message();
    }
  }
  const std::string text = HttpGet(metrics_port, "/metrics");
  for (const char* method : kMethods) {
    EXPECT_EQ(MetricValue(text, "fusebox_calls_total",
                          {"method=\"" + std::string(method) + "\"", "code=\"INVALID_ARGUMENT\""}),
              3)
        << method;
  }
  v1::GeluRequest good = KeptGelu(4);
  good.clear_output_options();
  v1::GeluResponse resp;
  EXPECT_TRUE(stub_->Gelu(Ctx().get(), good, &resp).ok());  // and serving goes on
}

// protobuf logs a line for each string field that is not UTF-8 as it parses it; the server
// checks the bytes first and refuses such a request without a line.
TEST_F(ServiceTest, HandlesThatAreNotUtf8AreInvalidArgumentAndLogNothing) {
  StartServer({});
  static std::atomic<int> lines{0};
  lines = 0;
  auto* before = google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) { ++lines; });
  const std::string bad_handle("\x0a\x02\xc3\x28", 4);  // field 1, "\xc3\x28"
  const std::pair<const char*, std::string> calls[] = {
      {"FreeTensor", bad_handle},
      {"ListTensors", bad_handle},
      {"Download", bad_handle},
      {"Gelu", std::string("\x0a\x04\x12\x02\xc3\x28", 6)},             // input.handle
      {"MatmulRelu", std::string("\x1a\x04\x12\x02\xed\xa0\x80", 7)},  // bias.handle: a surrogate
  };
  for (int i = 0; i < 20; ++i) {
    for (const auto& [method, body] : calls) {
      const grpc::Status s = RawCall(channel_, method, body);
      ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      ASSERT_NE(s.error_message().find("is not valid UTF-8"), std::string::npos)
          << method << ": " << s.error_message();
    }
  }
  google::protobuf::SetLogHandler(before);
  EXPECT_EQ(lines.load(), 0) << "protobuf logged for requests the server refused";
  // UTF-8 that is valid, of 1 to 4 bytes a character, is a handle like any other.
  v1::FreeTensorRequest free;
  free.set_handle("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  v1::FreeTensorResponse freed;
  EXPECT_EQ(stub_->FreeTensor(Ctx().get(), free, &freed).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// A GeluRequest whose input tensor has `axes` one-byte shape values, packed.
std::string GeluWithPackedShape(int64_t axes) {
  std::string shape(static_cast<size_t>(axes), '\x01');
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  std::string tensor;
  t.SerializeToString(&tensor);
  tensor += '\x12';  // field 2 (shape), length-delimited
  google::protobuf::io::StringOutputStream out(&tensor);
  {
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.WriteVarint64(static_cast<uint64_t>(axes));
    coded.WriteRaw(shape.data(), static_cast<int>(shape.size()));
  }
  std::string ref = "\x0a";  // TensorRef.tensor
  google::protobuf::io::StringOutputStream ref_out(&ref);
  {
    google::protobuf::io::CodedOutputStream coded(&ref_out);
    coded.WriteVarint64(tensor.size());
    coded.WriteRaw(tensor.data(), static_cast<int>(tensor.size()));
  }
  std::string req = "\x0a";  // GeluRequest.input
  google::protobuf::io::StringOutputStream req_out(&req);
  {
    google::protobuf::io::CodedOutputStream coded(&req_out);
    coded.WriteVarint64(ref.size());
    coded.WriteRaw(ref.data(), static_cast<int>(ref.size()));
  }
  return req;
}

// Parsing would turn each one-byte shape value into 8 bytes (and grow the field by doubling):
// a shape past 64 values, and fields the schema does not know past 1024, are refused on the
// wire, before parsing and before the token is looked at.
TEST_F(ServiceTest, RequestsThatWouldSwellInParsingAreRefusedBeforeIt) {
  StartServer({});
  for (int64_t axes : {int64_t{65}, int64_t{8} << 20}) {
    const grpc::Status s = RawCall(channel_, "Gelu", GeluWithPackedShape(axes));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("fusebox.v1.Tensor.shape has more than 64 values"),
              std::string::npos)
        << s.error_message();
  }
  // 64 axes pass the wire and parse (and are then a tensor of 1 element).
  EXPECT_EQ(RawCall(channel_, "Gelu", GeluWithPackedShape(64)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // no data: "has 0 bytes but ... needs 4"
  // Repeated occurrences of a message merge: their shapes add up.
  std::string merged;
  for (int i = 0; i < 3; ++i) merged += GeluWithPackedShape(30);
  grpc::Status s = RawCall(channel_, "Gelu", merged);
  EXPECT_NE(s.error_message().find("has more than 64 values"), std::string::npos)
      << s.error_message();
  // Fields from a newer client are let through, a few; a flood of them is not.
  v1::GeluRequest good = KeptGelu(1);
  good.clear_output_options();
  std::string body;
  good.SerializeToString(&body);
  auto unknown = [](int n) {
    std::string u;
    for (int i = 0; i < n; ++i) u += std::string("\xa0\x01\x00", 3);  // field 20, empty bytes
    return u;
  };
  EXPECT_TRUE(RawCall(channel_, "Gelu", body + unknown(10)).ok());
  s = RawCall(channel_, "Gelu", body + unknown(1025));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("fields this server does not know"), std::string::npos)
      << s.error_message();
  // An Upload's messages are checked the same way.
  std::string upload = std::string("\x08\x01\x12", 3) + std::string(1, static_cast<char>(100)) +
                       std::string(100, '\x01');
  s = RawCall(channel_, "Upload", upload);
  EXPECT_NE(s.error_message().find("fusebox.v1.UploadRequest.shape has more than 64 values"),
            std::string::npos)
      << s.error_message();
  v1::GeluResponse resp;
  EXPECT_TRUE(stub_->Gelu(Ctx().get(), good, &resp).ok());
}

struct LoopbackServer {
  explicit LoopbackServer(KernelServiceImpl* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server = builder.BuildAndStart();
    if (server != nullptr) {
      stub = KernelService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                        grpc::InsecureChannelCredentials()));
    }
  }
  bool ok() const { return server != nullptr && port > 0; }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<KernelService::Stub> stub;
};

// Every RPC counts in fusebox_calls_in_flight while it is open, uploads included.
TEST_F(ServiceTest, CallsInFlightCountsAnOpenUploadUntilItEnds) {
  const int metrics_port = StartServerWithMetrics();
  ASSERT_GT(metrics_port, 0);
  auto in_flight = [&] {
    return MetricValue(HttpGet(metrics_port, "/metrics"), "fusebox_calls_in_flight", {});
  };
  EXPECT_EQ(in_flight(), 0);
  {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto w = stub_->Upload(&ctx, &resp);
    v1::UploadRequest m;
    m.set_dtype(v1::FLOAT32);
    m.add_shape(256);
    m.set_data(std::string(512, 'x'));  // half of it: the upload stays open
    ASSERT_TRUE(w->Write(m));
    double seen = 0;
    for (int i = 0; i < 100 && (seen = in_flight()) < 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(seen, 1);
    m.Clear();
    m.set_data(std::string(512, 'x'));
    ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    ASSERT_TRUE(w->Finish().ok());
  }
  EXPECT_EQ(List().tensors_size(), 1);
  EXPECT_EQ(in_flight(), 0);
}

// The CPU backend, with the launch gap a GPU would report: every call's
// launch_us is kLaunchUs, so a nonzero value can be followed from the backend
// to the response and to /metrics.
class LaunchingCpuBackend final : public Backend {
 public:
  static constexpr double kLaunchUs = 12.5;  // in the (8 us, 16 us] bucket
  LaunchingCpuBackend() : cpu_(MakeCpuBackend({})) {}
  std::string name() const override { return cpu_->name(); }
  std::string device() const override { return cpu_->device(); }
  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override {
    cpu_->Submit(call, enqueued_ns, [done = std::move(done)](absl::Status s, const OpTiming& t) {
      OpTiming with_launch = t;
      with_launch.launch_us = kLaunchUs;
      done(std::move(s), with_launch);
    });
  }
  BackendStats stats() const override { return cpu_->stats(); }
  void Shutdown() override { cpu_->Shutdown(); }

 private:
  const std::unique_ptr<Backend> cpu_;
};

TEST(ServiceLaunchTest, BackendsLaunchUsReachesTheResponseAndTheLaunchPhase) {
  LaunchingCpuBackend backend;
  auto metrics = Metrics::Start("127.0.0.1:0", &backend);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const Authenticator open;
  KernelServiceImpl service(&backend, metrics->get(), /*store=*/nullptr, &open, RequestLimits{});
  LoopbackServer loopback(&service);
  ASSERT_TRUE(loopback.ok());

  constexpr int kCalls = 5;
  double kernel_us = 0;
  for (int i = 0; i < kCalls; ++i) {
    v1::RowSumRequest req;
    auto* t = req.mutable_input()->mutable_tensor();
    t->set_dtype(v1::BFLOAT16);
    t->add_shape(8);
    t->add_shape(32);
    t->set_data(std::string(8 * 32 * 2, '\0'));
    v1::RowSumResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(loopback.stub->RowSum(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.timing().launch_us(), LaunchingCpuBackend::kLaunchUs);
    kernel_us += resp.timing().kernel_us();
  }
  const std::string text = HttpGet((*metrics)->port(), "/metrics");
  auto labels = [](const char* phase) {
    return std::vector<std::string>{"op=\"RowSum\"", "dtype=\"bfloat16\"",
                                    std::string("phase=\"") + phase + "\""};
  };
  EXPECT_EQ(MetricValue(text, "fusebox_call_phase_duration_seconds_count", labels("launch")),
            kCalls);
  EXPECT_NEAR(MetricValue(text, "fusebox_call_phase_duration_seconds_sum", labels("launch")),
              kCalls * LaunchingCpuBackend::kLaunchUs * 1e-6, 1e-12);
  std::vector<std::string> le16 = labels("launch"), le8 = labels("launch");
  le16.push_back("le=\"1.6e-05\"");
  le8.push_back("le=\"8e-06\"");
  EXPECT_EQ(MetricValue(text, "fusebox_call_phase_duration_seconds_bucket", le8), 0);
  EXPECT_EQ(MetricValue(text, "fusebox_call_phase_duration_seconds_bucket", le16), kCalls);
  // The launch gap is not counted in the kernel phase too.
  EXPECT_NEAR(MetricValue(text, "fusebox_call_phase_duration_seconds_sum", labels("kernel")),
              kernel_us * 1e-6, 1e-6 * kernel_us * 1e-6 + 1e-12);
  loopback.server->Shutdown();
  backend.Shutdown();
}

// A call cancelled while its op waits keeps no output, and the op is not computed.
TEST(ServiceCancelTest, OpCancelledWhileQueuedKeepsNoOutputAndIsNotComputed) {
  HeldCpuBackend backend;
  TensorStore store(&backend, StoreLimits{});
  const Authenticator open;
  KernelServiceImpl service(&backend, /*metrics=*/nullptr, &store, &open, RequestLimits{});
  LoopbackServer loopback(&service);
  ASSERT_TRUE(loopback.ok());

  grpc::ClientContext ctx;
  PendingGelu call(*loopback.stub, &ctx, KeptGelu(1000));
  ASSERT_TRUE(backend.WaitUntilHolding(1));  // the output is reserved, the op waits
  EXPECT_EQ(store.TenantUsedBytes("anonymous"), 4000);
  ctx.TryCancel();
  EXPECT_EQ(call.Wait().error_code(), grpc::StatusCode::CANCELLED);
  // The cancel reaches the server: the held call reads as abandoned, so the backend will
  // answer it without computing it.
  for (int i = 0; i < 250 && !backend.HeldAbandoned(0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(backend.HeldAbandoned(0));
  backend.ReleaseAll();
  loopback.server->Shutdown();  // returns once the call has ended
  EXPECT_EQ(backend.BackendCodes(), std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
  EXPECT_TRUE(store.List("anonymous").empty());
  // The reservation goes with the call's last reference, which the backend's worker may
  // drop just after the reply.
  for (int i = 0; i < 100 && store.TenantUsedBytes("anonymous") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(store.TenantUsedBytes("anonymous"), 0);
  backend.Shutdown();
}

// Queued calls hold their inline tensors (request, and the reply built in place) until
// answered: past --inflight_mib a call is refused before its output is allocated.
TEST(ServiceInflightTest, CallsPastTheInflightLimitAreResourceExhaustedUntilOthersEnd) {
  HeldCpuBackend backend;
  TensorStore store(&backend, StoreLimits{});
  const Authenticator open;
  RequestLimits limits;
  limits.max_inflight_bytes = 16000;
  KernelServiceImpl service(&backend, /*metrics=*/nullptr, &store, &open, limits);
  LoopbackServer loopback(&service);
  ASSERT_TRUE(loopback.ok());
  v1::GeluRequest inline_gelu = KeptGelu(1000);  // 4000 bytes in, 4000 out inline (twice: small)
  inline_gelu.clear_output_options();

  grpc::ClientContext c1;
  PendingGelu first(*loopback.stub, &c1, inline_gelu);
  ASSERT_TRUE(backend.WaitUntilHolding(1));  // 12000 of 16000 held
  grpc::ClientContext c2;
  PendingGelu second(*loopback.stub, &c2, inline_gelu);
  const grpc::Status refused = second.Wait();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("--inflight_mib"), std::string::npos)
      << refused.error_message();
  grpc::ClientContext c3;  // a kept output is the store's: only its 4000 bytes in count
  PendingGelu kept(*loopback.stub, &c3, KeptGelu(1000));
  ASSERT_TRUE(backend.WaitUntilHolding(2));
  backend.ReleaseAll(/*open=*/true);
  EXPECT_TRUE(first.Wait().ok());
  EXPECT_TRUE(kept.Wait().ok());
  // Once their replies have gone, there is room again.
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext c;
    PendingGelu call(*loopback.stub, &c, inline_gelu);
    again = call.Wait();
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  loopback.server->Shutdown();
  backend.Shutdown();
}

// The CPU backend, whose Check refuses softmax rows longer than kMaxCols (as the CUDA
// backend refuses rows past its kernels' longest); counts what reaches Check and Submit.
class RowLimitedCpuBackend final : public Backend {
 public:
  static constexpr int64_t kMaxCols = 64;
  RowLimitedCpuBackend() : cpu_(MakeCpuBackend({})) {}
  std::string name() const override { return cpu_->name(); }
  std::string device() const override { return cpu_->device(); }
  absl::Status Check(const OpCall& call) const override {
    ++checked_;
    if (call.op == Op::kSoftmax && call.cols > kMaxCols) {
      return absl::InvalidArgumentError("Softmax on this backend: rows of at most 64 elements");
    }
    return absl::OkStatus();
  }
  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override {
    ++submitted_;
    cpu_->Submit(call, enqueued_ns, std::move(done));
  }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return cpu_->Allocate(bytes);
  }
  void SubmitWrite(Buffer* dst, size_t offset, const void* src, size_t bytes, int64_t enqueued_ns,
                   OpDone done) override {
    cpu_->SubmitWrite(dst, offset, src, bytes, enqueued_ns, std::move(done));
  }
  void SubmitRead(const Buffer* src, size_t offset, void* dst, size_t bytes, int64_t enqueued_ns,
                  OpDone done) override {
    cpu_->SubmitRead(src, offset, dst, bytes, enqueued_ns, std::move(done));
  }
  BackendStats stats() const override { return cpu_->stats(); }
  void Shutdown() override { cpu_->Shutdown(); }
  int checked() const { return checked_; }
  int submitted() const { return submitted_; }

 private:
  const std::unique_ptr<Backend> cpu_;
  mutable std::atomic<int> checked_{0};
  std::atomic<int> submitted_{0};
};

v1::SoftmaxRequest SoftmaxOfZeros(int64_t rows, int64_t cols, bool keep) {
  v1::SoftmaxRequest req;
  auto* t = req.mutable_input()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_shape(rows);
  t->add_shape(cols);
  t->set_data(std::string(static_cast<size_t>(rows * cols) * 4, '\0'));
  req.mutable_output_options()->set_keep_on_server(keep);
  return req;
}

// A call the backend's Check refuses gets Check's error without reaching Submit (it never
// waits in the queue), and the output prepared for it, kept on the server or inline, is
// given back before the reply; the server keeps serving.
TEST(ServiceCheckTest, ACallTheBackendCannotRunIsRefusedBeforeItIsQueued) {
  RowLimitedCpuBackend backend;
  TensorStore store(&backend, StoreLimits{});
  const Authenticator open;
  KernelServiceImpl service(&backend, /*metrics=*/nullptr, &store, &open, RequestLimits{});
  LoopbackServer loopback(&service);
  ASSERT_TRUE(loopback.ok());
  auto softmax = [&](const v1::SoftmaxRequest& req, v1::SoftmaxResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return loopback.stub->Softmax(&ctx, req, resp);
  };
  constexpr int64_t kLong = RowLimitedCpuBackend::kMaxCols + 1;

  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "kept output" : "inline output");
    v1::SoftmaxResponse resp;
    const grpc::Status s = softmax(SoftmaxOfZeros(3, kLong, keep), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "Softmax on this backend: rows of at most 64 elements");
    EXPECT_EQ(backend.submitted(), 0);
    EXPECT_EQ(store.TenantUsedBytes("anonymous"), 0);  // the kept output is gone already
    EXPECT_TRUE(store.List("anonymous").empty());
  }
  const int checked = backend.checked();
  EXPECT_EQ(checked, 2);

  // Results that need no kernel are not the backend's to refuse.
  v1::SoftmaxResponse empty;
  ASSERT_TRUE(softmax(SoftmaxOfZeros(0, kLong, false), &empty).ok());
  EXPECT_EQ(empty.output().tensor().shape_size(), 2);
  EXPECT_EQ(backend.checked(), checked);

  // Calls it can run are checked, then submitted.
  v1::SoftmaxResponse ok;
  ASSERT_TRUE(softmax(SoftmaxOfZeros(3, RowLimitedCpuBackend::kMaxCols, true), &ok).ok());
  EXPECT_FALSE(ok.output().handle().empty());
  EXPECT_EQ(backend.checked(), checked + 1);
  EXPECT_EQ(backend.submitted(), 1);
  EXPECT_EQ(store.List("anonymous").size(), 1u);
  loopback.server->Shutdown();
  backend.Shutdown();
}

}  // namespace
}  // namespace fusebox
