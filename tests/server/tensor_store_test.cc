// TensorStore: budget and quota are enforced before memory is taken and never
// cost a stored tensor; tenants see only their own handles; freed and expired
// handles are NOT_FOUND; a reader keeps a freed tensor's memory alive; handles name the
// replica that minted them.
#include "server/core/tensor_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/backends/cpu/cpu_backend.h"

namespace fusebox {
namespace {

class TensorStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(CpuBackendOptions{});
  StoreLimits Limits(int64_t budget, int64_t quota) {
    StoreLimits l;
    l.budget_bytes = budget;
    l.tenant_quota_bytes = quota;
    l.max_tensor_bytes = budget;
    return l;
  }
  std::string Put(TensorStore& s, const std::string& tenant, int64_t floats) {
    auto t = s.Create(tenant, DType::kFloat32, {floats});
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return "";
    s.Commit(*t);
    return (*t)->handle;
  }
};

TEST_F(TensorStoreTest, FullBudgetIsResourceExhaustedAndKeepsStoredTensors) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const std::string a = Put(s, "x", 200);  // 800 bytes
  auto more = s.Create("y", DType::kFloat32, {100});
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(more.status().message()).find("memory is full"), std::string::npos);
  EXPECT_TRUE(s.Get("x", a).ok());
  EXPECT_EQ(s.stats().bytes, 800);
}

TEST_F(TensorStoreTest, TensorsPastATenantsCountAreResourceExhaustedForThatTenantOnly) {
  StoreLimits l = Limits(1000, 1000);
  l.max_tensors = 10;
  l.max_tensors_per_tenant = 2;  // empty tensors cost no quota: the count is what binds
  TensorStore s(backend_.get(), l);
  const std::string a = Put(s, "x", 0);
  Put(s, "x", 0);
  auto over = s.Create("x", DType::kFloat32, {0});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.status().message()).find("--max_tensors_per_tenant"),
            std::string::npos)
      << over.status();
  EXPECT_TRUE(s.Create("y", DType::kFloat32, {0}).ok());  // another tenant is let in
  ASSERT_TRUE(s.Free("x", a).ok());
  EXPECT_TRUE(s.Create("x", DType::kFloat32, {0}).ok());  // freed: room again
}

TEST_F(TensorStoreTest, TensorsPastTheCountLimitAreResourceExhaustedEmptyOnesToo) {
  StoreLimits l = Limits(1000, 1000);
  l.max_tensors = 3;  // empty tensors use no budget, but each costs host memory
  TensorStore s(backend_.get(), l);
  const std::string a = Put(s, "x", 0);
  Put(s, "y", 0);
  auto uncommitted = s.Create("x", DType::kFloat32, {1});
  ASSERT_TRUE(uncommitted.ok());
  auto over = s.Create("y", DType::kFloat32, {0});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.status().message()).find("--max_tensors"), std::string::npos)
      << over.status();
  uncommitted->reset();
  EXPECT_TRUE(s.Create("y", DType::kFloat32, {0}).ok());  // dropped: room again
  ASSERT_TRUE(s.Free("x", a).ok());
  EXPECT_TRUE(s.Create("y", DType::kFloat32, {0}).ok());  // freed: room again
  EXPECT_EQ(s.stats().count, 1);
}

TEST_F(TensorStoreTest, TenantQuotaIsEnforcedPerTenant) {
  TensorStore s(backend_.get(), Limits(10000, 1000));
  Put(s, "x", 200);
  auto over = s.Create("x", DType::kFloat32, {100});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.status().message()).find("quota"), std::string::npos);
  EXPECT_TRUE(s.Create("y", DType::kFloat32, {200}).ok());  // another tenant has room
}

TEST_F(TensorStoreTest, UncommittedTensorReturnsItsReservation) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  { auto t = s.Create("x", DType::kFloat32, {250}); ASSERT_TRUE(t.ok()); }
  EXPECT_EQ(s.TenantUsedBytes("x"), 0);
  EXPECT_TRUE(s.Create("x", DType::kFloat32, {250}).ok());
}

TEST_F(TensorStoreTest, OtherTenantsHandleIsNotFoundLikeAMissingOne) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const std::string h = Put(s, "alice", 10);
  auto theirs = s.Get("bob", h);
  auto missing = s.Get("bob", "t0000");
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound);
  // Same message shape: only the handle differs.
  std::string a(theirs.status().message()), b(missing.status().message());
  a.replace(a.find(h), h.size(), "H");
  b.replace(b.find("t0000"), 5, "H");
  EXPECT_EQ(a, b);
  EXPECT_EQ(s.Free("bob", h).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.List("bob").empty());
  EXPECT_TRUE(s.Get("alice", h).ok());
}

TEST_F(TensorStoreTest, ZeroAnywhereInTheShapeMakesItEmpty) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const int64_t big = int64_t{1} << 62;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{big, big, 0},
                                            std::vector<int64_t>{0, big, big},
                                            std::vector<int64_t>{big, 0, big}}) {
    auto t = s.Create("x", DType::kFloat32, shape);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->bytes, 0);
  }
}

TEST_F(TensorStoreTest, NotFoundEchoesALongHandleOnlyInPart) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const std::string handle(20000, 'h');
  auto got = s.Get("x", handle);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(got.status().message().size(), 200u) << got.status();
  EXPECT_NE(std::string(got.status().message()).find("(20000 bytes)"), std::string::npos);
  EXPECT_EQ(s.Free("x", handle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TensorStoreTest, FreedHandleIsNotFound) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const std::string h = Put(s, "x", 10);
  ASSERT_EQ(*s.Free("x", h), 40);
  EXPECT_EQ(s.Get("x", h).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Free("x", h).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.TenantUsedBytes("x"), 0);
}

TEST_F(TensorStoreTest, IdleTensorsExpireAndUsedOnesStay) {
  StoreLimits l = Limits(1000, 1000);
  l.idle_expiry_seconds = 0.2;
  TensorStore s(backend_.get(), l);
  const std::string idle = Put(s, "x", 10), busy = Put(s, "x", 10);
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    ASSERT_TRUE(s.Get("x", busy).ok());
  }
  EXPECT_EQ(s.ExpireIdle(), 1);
  EXPECT_EQ(s.Get("x", idle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.Get("x", busy).ok());
}

// A handle that may never have reached its caller is freed at its time, idle expiry or not,
// unless a call names it first.
TEST_F(TensorStoreTest, UnclaimedTensorsGoAtTheirTimeAndClaimedOnesStay) {
  StoreLimits l = Limits(1000, 1000);
  l.idle_expiry_seconds = 0;  // never
  TensorStore s(backend_.get(), l);
  std::string handles[3];
  for (std::string& h : handles) {
    auto t = s.Create("x", DType::kFloat32, {10});
    ASSERT_TRUE(t.ok());
    (*t)->unclaimed_until_ns = SteadyNowNs() + 50000000;  // 50 ms
    s.Commit(*t);
    h = (*t)->handle;
  }
  EXPECT_EQ(s.ExpireIdle(), 0);
  ASSERT_TRUE(s.Get("x", handles[1]).ok());  // claimed
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_EQ(s.ExpireIdle(), 2);
  EXPECT_EQ(s.Get("x", handles[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.Get("x", handles[1]).ok());
  EXPECT_EQ(s.TenantUsedBytes("x"), 40);
}

TEST_F(TensorStoreTest, ReaderKeepsFreedTensorMemoryUntilDone) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  const std::string h = Put(s, "x", 250);
  auto reader = s.Get("x", h);
  ASSERT_TRUE(reader.ok());
  static_cast<float*>((*reader)->buffer->data())[249] = 7.0f;
  ASSERT_TRUE(s.Free("x", h).ok());
  // The handle is gone, the bytes are still reserved and readable.
  EXPECT_EQ(s.TenantUsedBytes("x"), 1000);
  EXPECT_EQ(static_cast<float*>((*reader)->buffer->data())[249], 7.0f);
  reader->reset();
  EXPECT_EQ(s.TenantUsedBytes("x"), 0);
}

TEST_F(TensorStoreTest, ConcurrentCreateAndFreeStayWithinBudget) {
  TensorStore s(backend_.get(), Limits(4000, 4000));
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto x = s.Create("x", DType::kFloat32, {100 + t});
        if (!x.ok()) {
          ++refused;
          continue;
        }
        s.Commit(*x);
        EXPECT_LE(s.TenantUsedBytes("x"), 4000);
        EXPECT_TRUE(s.Free("x", (*x)->handle).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(s.TenantUsedBytes("x"), 0);
  EXPECT_EQ(s.stats().count, 0);
}

TEST_F(TensorStoreTest, TensorOverPerTensorLimitIsResourceExhausted) {
  StoreLimits l = Limits(1 << 20, 1 << 20);
  l.max_tensor_bytes = 100;
  TensorStore s(backend_.get(), l);
  EXPECT_EQ(s.Create("x", DType::kFloat16, {51}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(s.Create("x", DType::kFloat16, {50}).ok());
}

TEST_F(TensorStoreTest, HandlesStartWithTheReplicaIdAndOtherReplicasHandlesSayWhereTheyLive) {
  TensorStore s(backend_.get(), Limits(1000, 1000), "fusebox-1");
  const std::string h = Put(s, "x", 4);
  EXPECT_EQ(h.rfind("fusebox-1.", 0), 0u) << h;
  EXPECT_TRUE(s.Get("x", h).ok());

  auto elsewhere = s.Get("x", "fusebox-0.t0123");
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(elsewhere.status().message());
  EXPECT_NE(msg.find("replica 'fusebox-0'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this is replica 'fusebox-1'"), std::string::npos) << msg;

  auto freed = s.Get("x", "fusebox-1.t0123");
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(freed.status().message()).find("made by replica"), std::string::npos);
}

TEST_F(TensorStoreTest, WithoutAReplicaIdHandlesAreBareAndReplicasHandlesAreNamed) {
  TensorStore s(backend_.get(), Limits(1000, 1000));
  EXPECT_EQ(Put(s, "x", 4).find('.'), std::string::npos);
  auto elsewhere = s.Get("x", "fusebox-0.t0123");
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(elsewhere.status().message());
  EXPECT_NE(msg.find("made by replica 'fusebox-0' and this server has no --replica_id"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace fusebox
