// Parallel transfers end to end in-process (real gRPC on a loopback port, CPU backend):
// ranged uploads (CreateUpload, WriteUpload on several connections, CommitUpload,
// AbortUpload), ranged Downloads, and the C++ client's default split of large transfers.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/fusebox_client.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/server.h"

namespace fusebox {
namespace {

using v1::KernelService;

std::string RandomBytes(size_t n, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

class RangedTransferTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions o) {
    o.address = "127.0.0.1:0";
    o.backend.kind = "cpu";
    auto s = FuseboxServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = NewStub(0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(5);
    std::remove(tokens_.c_str());
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  // A stub on a connection of its own (channels with different arguments share none).
  std::unique_ptr<KernelService::Stub> NewStub(int connection) {
    grpc::ChannelArguments args;
    args.SetInt("fusebox.test_connection", connection);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return KernelService::NewStub(
        grpc::CreateCustomChannel(target(), grpc::InsecureChannelCredentials(), args));
  }
  // Two tenants, alice (secret-a) and bob (secret-b).
  ServerOptions WithTokens() {
    tokens_ = ::testing::TempDir() + "fusebox_ranged_tokens_" + std::to_string(getpid());
    std::ofstream(tokens_) << "secret-a alice\nsecret-b bob\n";
    ServerOptions o;
    o.token_file = tokens_;
    return o;
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    return c;
  }

  grpc::Status Create(int64_t n, std::string* id, const std::string& token = "",
                      v1::DType dtype = v1::FLOAT32) {
    auto ctx = Ctx(token);
    v1::CreateUploadRequest req;
    req.set_dtype(dtype);
    req.add_shape(n);
    v1::CreateUploadResponse resp;
    grpc::Status s = stub_->CreateUpload(ctx.get(), req, &resp);
    if (s.ok()) *id = resp.upload_id();
    return s;
  }

  struct Range {
    int64_t offset;
    std::string data;
  };
  // One WriteUpload stream of `ranges`, on `stub` (default: the first connection).
  grpc::Status Write(const std::string& id, const std::vector<Range>& ranges,
                     const std::string& token = "", KernelService::Stub* stub = nullptr,
                     v1::WriteUploadResponse* out = nullptr) {
    auto ctx = Ctx(token);
    v1::WriteUploadResponse resp;
    auto w = (stub ? stub : stub_.get())->WriteUpload(ctx.get(), &resp);
    bool first = true;
    for (const Range& r : ranges) {
      v1::WriteUploadRequest m;
      if (first) m.set_upload_id(id);
      first = false;
      m.set_offset(r.offset);
      m.set_data(r.data);
      if (!w->Write(m)) break;
    }
    w->WritesDone();
    grpc::Status s = w->Finish();
    if (out) *out = resp;
    return s;
  }
  grpc::Status Commit(const std::string& id, std::string* handle = nullptr,
                      const std::string& token = "") {
    auto ctx = Ctx(token);
    v1::CommitUploadRequest req;
    req.set_upload_id(id);
    v1::CommitUploadResponse resp;
    grpc::Status s = stub_->CommitUpload(ctx.get(), req, &resp);
    if (s.ok() && handle) *handle = resp.tensor().handle();
    return s;
  }
  grpc::Status Abort(const std::string& id, const std::string& token = "") {
    auto ctx = Ctx(token);
    v1::AbortUploadRequest req;
    req.set_upload_id(id);
    v1::AbortUploadResponse resp;
    return stub_->AbortUpload(ctx.get(), req, &resp);
  }
  grpc::Status Download(const std::string& handle, std::string* data, int64_t offset = 0,
                        int64_t length = 0, const std::string& token = "") {
    auto ctx = Ctx(token);
    v1::DownloadRequest req;
    req.set_handle(handle);
    req.set_offset(offset);
    req.set_length(length);
    auto r = stub_->Download(ctx.get(), req);
    v1::DownloadResponse m;
    data->clear();
    while (r->Read(&m)) data->append(m.data());
    return r->Finish();
  }
  v1::ListTensorsResponse List(const std::string& token = "") {
    auto ctx = Ctx(token);
    v1::ListTensorsResponse resp;
    EXPECT_TRUE(stub_->ListTensors(ctx.get(), v1::ListTensorsRequest(), &resp).ok());
    return resp;
  }
  // Uploads `bytes` (float32) in one ranged write; returns the handle.
  std::string UploadRanged(const std::string& bytes) {
    std::string id, h;
    EXPECT_TRUE(Create(static_cast<int64_t>(bytes.size() / 4), &id).ok());
    EXPECT_TRUE(Write(id, {{0, bytes}}).ok());
    EXPECT_TRUE(Commit(id, &h).ok());
    return h;
  }

  std::unique_ptr<FuseboxServer> server_;
  std::unique_ptr<KernelService::Stub> stub_;
  std::string tokens_;
};

TEST_F(RangedTransferTest, ParallelRangedUploadFromSeveralConnectionsReassemblesTheExactBytes) {
  StartServer(ServerOptions());
  const int64_t n = (3 << 20) + 5;  // float32: 12 MiB and 20 bytes
  const std::string bytes = RandomBytes(4 * n);
  std::string id;
  ASSERT_TRUE(Create(n, &id).ok());
  // Four connections, each a stream of interleaved 256 KiB ranges, sent out of order.
  constexpr int kConnections = 4;
  constexpr int64_t kRange = 256 << 10;
  const int64_t ranges = (4 * n + kRange - 1) / kRange;
  std::vector<grpc::Status> status(kConnections);
  std::vector<std::thread> threads;
  for (int c = 0; c < kConnections; ++c) {
    threads.emplace_back([&, c] {
      auto stub = NewStub(c + 1);
      std::vector<Range> mine;
      for (int64_t r = ranges - 1 - c; r >= 0; r -= kConnections) {
        const int64_t off = r * kRange;
        mine.push_back({off, bytes.substr(off, kRange)});
      }
      status[c] = Write(id, mine, "", stub.get());
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) ASSERT_TRUE(s.ok()) << s.error_message();
  std::string h, back;
  ASSERT_TRUE(Commit(id, &h).ok());
  ASSERT_TRUE(Download(h, &back).ok());
  EXPECT_TRUE(back == bytes);
  // The upload id is spent: it names nothing any more.
  EXPECT_EQ(Commit(id).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Write(id, {{0, "x"}}).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RangedTransferTest, ACommitWithAMissingRangeFailsAndShowsNothing) {
  StartServer(ServerOptions());
  const std::string bytes = RandomBytes(4000);
  std::string id;
  ASSERT_TRUE(Create(1000, &id).ok());
  ASSERT_TRUE(Write(id, {{0, bytes.substr(0, 1000)}, {2000, bytes.substr(2000)}}).ok());
  grpc::Status s = Commit(id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("missing 1000 of its 4000 bytes"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(List().tensors_size(), 0);  // nothing visible
  // The upload stays open: the missing range completes it.
  v1::WriteUploadResponse resp;
  ASSERT_TRUE(Write(id, {{1000, bytes.substr(1000, 1000)}}, "", nullptr, &resp).ok());
  EXPECT_EQ(resp.written_bytes(), 1000);
  EXPECT_EQ(resp.missing_bytes(), 0);
  std::string h, back;
  ASSERT_TRUE(Commit(id, &h).ok());
  ASSERT_TRUE(Download(h, &back).ok());
  EXPECT_TRUE(back == bytes);
}

TEST_F(RangedTransferTest, OverlappingAndOutOfRangeWritesAreRejectedAndChangeNothing) {
  StartServer(ServerOptions());
  const std::string bytes = RandomBytes(4000);
  std::string id;
  ASSERT_TRUE(Create(1000, &id).ok());
  ASSERT_TRUE(Write(id, {{0, bytes.substr(0, 100)}}).ok());
  // Overlapping a written range.
  grpc::Status s = Write(id, {{50, std::string(100, 'x')}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("overlaps bytes [0, 100)"), std::string::npos)
      << s.error_message();
  // A stream whose second range overlaps its first: the whole stream counts for nothing.
  s = Write(id, {{200, std::string(100, 'y')}, {250, std::string(10, 'y')}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Past the end, and negative.
  s = Write(id, {{3990, std::string(11, 'z')}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("past the end"), std::string::npos) << s.error_message();
  EXPECT_EQ(Write(id, {{-1, "z"}}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Write(id, {{5000, ""}}).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // Only the first 100 bytes are written.
  s = Commit(id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("missing 3900 of"), std::string::npos) << s.error_message();
  // The rest goes in exactly where the rejected writes would have: none of their bytes stuck.
  ASSERT_TRUE(Write(id, {{100, bytes.substr(100)}}).ok());
  std::string h, back;
  ASSERT_TRUE(Commit(id, &h).ok());
  ASSERT_TRUE(Download(h, &back).ok());
  EXPECT_TRUE(back == bytes);
}

TEST_F(RangedTransferTest, AnAbandonedUploadFreesItsReservation) {
  ServerOptions o;
  o.store_budget_bytes = 1 << 20;
  o.stall_timeout_seconds = 0.3;
  StartServer(o);
  std::string id, other;
  ASSERT_TRUE(Create(200000, &id).ok());  // 800 KB of the 1 MiB budget
  ASSERT_TRUE(Write(id, {{0, std::string(4000, 'x')}}).ok());
  EXPECT_EQ(List().used_bytes(), 800000);
  EXPECT_EQ(Create(200000, &other).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // No write for the stall timeout: the sweeper drops it, and the budget is back.
  grpc::Status s;
  for (int i = 0; i < 100; ++i) {  // up to 5 s
    s = Create(200000, &other);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(s.ok()) << "the abandoned upload still holds its budget: " << s.error_message();
  EXPECT_EQ(Write(id, {{4000, "x"}}).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Commit(id).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Abort(other).ok());
  EXPECT_EQ(List().tensors_size(), 0);
  EXPECT_EQ(List().used_bytes(), 0);  // nothing left behind, the abort's included
}

TEST_F(RangedTransferTest, AStalledWriteIsCancelledAndItsRangesDoNotCount) {
  ServerOptions o;
  o.stall_timeout_seconds = 0.3;
  StartServer(o);
  std::string id;
  ASSERT_TRUE(Create(1000, &id).ok());
  auto ctx = Ctx();
  v1::WriteUploadResponse resp;
  auto w = stub_->WriteUpload(ctx.get(), &resp);
  v1::WriteUploadRequest m;
  m.set_upload_id(id);
  m.set_data(std::string(2000, 'x'));
  ASSERT_TRUE(w->Write(m));  // then nothing: the stall watch ends the stream
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
  grpc::Status s = Commit(id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("missing 4000 of"), std::string::npos) << s.error_message();
  // Its range is free to be written again once the server's side of the stream has ended too,
  // which may be a moment after the client saw it end: until then the range is refused as
  // being written by another write.
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    again = Write(id, {{0, std::string(4000, 'y')}});
    if (again.ok() || again.error_message().find("another write") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(Commit(id).ok());
}

TEST_F(RangedTransferTest, AnotherTenantCannotWriteCommitOrAbortSomeonesUpload) {
  StartServer(WithTokens());
  std::string id;
  ASSERT_TRUE(Create(100, &id, "secret-a").ok());
  ASSERT_TRUE(Write(id, {{0, std::string(200, 'a')}}, "secret-a").ok());
  const std::string never = "u00000000000000000000000000000000";
  const std::vector<std::pair<grpc::Status, grpc::Status>> calls = {
      {Write(id, {{200, std::string(200, 'b')}}, "secret-b"),
       Write(never, {{200, std::string(200, 'b')}}, "secret-b")},
      {Commit(id, nullptr, "secret-b"), Commit(never, nullptr, "secret-b")},
      {Abort(id, "secret-b"), Abort(never, "secret-b")},
  };
  for (const auto& [theirs, none] : calls) {
    EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::NOT_FOUND);
    std::string m1 = theirs.error_message(), m2 = none.error_message();
    ASSERT_NE(m1.find(id), std::string::npos);
    m1.replace(m1.find(id), id.size(), "U");
    m2.replace(m2.find(never), never.size(), "U");
    EXPECT_EQ(m1, m2);  // nothing tells bob the upload exists
  }
  // Alice's upload is untouched: bob's bytes never landed, and her own complete it.
  ASSERT_TRUE(Write(id, {{200, std::string(200, 'a')}}, "secret-a").ok());
  std::string h, back;
  ASSERT_TRUE(Commit(id, &h, "secret-a").ok());
  ASSERT_TRUE(Download(h, &back, 0, 0, "secret-a").ok());
  EXPECT_EQ(back, std::string(400, 'a'));
  EXPECT_EQ(List("secret-b").tensors_size(), 0);
}

TEST_F(RangedTransferTest, TheBudgetIsReservedAtCreateSoACreateOverQuotaFailsBeforeAnyByte) {
  ServerOptions o = WithTokens();
  o.tenant_quota_bytes = 100000;
  StartServer(o);
  std::string id, other;
  ASSERT_TRUE(Create(20000, &id, "secret-a").ok());  // 80 KB reserved, nothing sent yet
  EXPECT_EQ(List("secret-a").used_bytes(), 80000);
  grpc::Status s = Create(10000, &other, "secret-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("quota"), std::string::npos) << s.error_message();
  EXPECT_TRUE(Create(20000, &other, "secret-b").ok());  // bob's quota is his own
  // Bad headers are refused the same way as Upload's.
  EXPECT_EQ(Create(-1, &other, "secret-a").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Create(10, &other, "secret-a", v1::DTYPE_UNSPECIFIED).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Abort(id, "secret-a").ok());
  EXPECT_EQ(List("secret-a").used_bytes(), 0);
  EXPECT_EQ(Abort(id, "secret-a").error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RangedTransferTest, UploadIdsStartWithTheReplicaIdLikeHandles) {
  ServerOptions o;
  o.replica_id = "fusebox-3";
  StartServer(o);
  std::string id, h;
  ASSERT_TRUE(Create(10, &id).ok());
  EXPECT_EQ(id.rfind("fusebox-3.u", 0), 0u) << id;
  const std::string elsewhere = "fusebox-5.u00000000000000000000000000000000";
  grpc::Status s = Commit(elsewhere);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("replica 'fusebox-5'"), std::string::npos) << s.error_message();
  ASSERT_TRUE(Write(id, {{0, std::string(40, 'r')}}).ok());
  ASSERT_TRUE(Commit(id, &h).ok());
  EXPECT_EQ(h.rfind("fusebox-3.t", 0), 0u) << h;
}

TEST_F(RangedTransferTest, RangedDownloadReturnsExactBytesAndBadRangesAreRefused) {
  StartServer(ServerOptions());
  const std::string bytes = RandomBytes(4 * 300000);
  const std::string h = UploadRanged(bytes);
  std::string part;
  ASSERT_TRUE(Download(h, &part, 12345, 678901).ok());
  EXPECT_TRUE(part == bytes.substr(12345, 678901));
  ASSERT_TRUE(Download(h, &part, 1000000).ok());  // length 0: to the end
  EXPECT_TRUE(part == bytes.substr(1000000));
  ASSERT_TRUE(Download(h, &part, static_cast<int64_t>(bytes.size())).ok());  // the empty end
  EXPECT_TRUE(part.empty());
  EXPECT_EQ(Download(h, &part, 1200001).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Download(h, &part, 1000000, 200001).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Download(h, &part, -1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Download(h, &part, 0, -5).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Ranges fetched in parallel add up to the tensor.
  std::vector<std::string> parts(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(Download(h, &parts[i], i * 300000, 300000).ok()); });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(parts[0] + parts[1] + parts[2] + parts[3] == bytes);
}

TEST_F(RangedTransferTest, TheClientsDefaultSplitRoundTripsALargeTensor) {
  StartServer(ServerOptions());
  // 100 MiB and 6 bytes of float16: past the client's 64 MiB threshold, so it goes as ranges
  // over 4 connections, and its last range is short.
  client::HostTensor t;
  t.dtype = DType::kFloat16;
  t.shape = {(100 << 20) / 2 + 3};
  t.data = RandomBytes((100 << 20) + 6, 11);
  auto c = client::Client::Create(target());
  std::atomic<int64_t> last_done{0};
  int64_t total = 0;
  auto info = c->Upload(t, 4 << 20, std::chrono::seconds(120), [&](int64_t done, int64_t all) {
    last_done = std::max<int64_t>(last_done, done);
    total = all;
  });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(last_done, static_cast<int64_t>(t.data.size()));
  EXPECT_EQ(total, static_cast<int64_t>(t.data.size()));
  EXPECT_EQ(info->shape, t.shape);
  int64_t down_done = 0;
  auto back = c->Download(info->handle, std::chrono::seconds(120),
                          [&](int64_t done, int64_t) { down_done = std::max(down_done, done); });
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, DType::kFloat16);
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_TRUE(back->data == t.data);
  EXPECT_EQ(down_done, static_cast<int64_t>(t.data.size()));
  EXPECT_EQ(c->ListTensors()->tensors.size(), 1u);  // the upload left nothing else behind
}

TEST_F(RangedTransferTest, TheClientsStreamsThatFindNoRangeLeftOpenNoCall) {
  // More connections than ranges, and streams that start late: one whose ranges the others
  // took opens no WriteUpload at all (the server refuses one that names no upload).
  StartServer(ServerOptions());
  client::Client::Options o;
  o.transfer_connections = 8;
  o.parallel_min_bytes = 0;
  o.range_bytes = 64 << 10;
  auto c = client::Client::Create(target(), o);
  client::HostTensor t;
  t.shape = {9 * (16 << 10) + 1};  // float32: 9 ranges and 4 bytes
  t.data = RandomBytes(4 * static_cast<size_t>(t.shape[0]), 13);
  for (int i = 0; i < 10; ++i) {
    auto info = c->Upload(t);
    ASSERT_TRUE(info.ok()) << info.status();
    auto back = c->Download(info->handle);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->data == t.data);
    ASSERT_TRUE(c->FreeTensor(info->handle).ok());
  }
}

}  // namespace
}  // namespace fusebox
