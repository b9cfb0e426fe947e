// PendingUploads without gRPC: range claims (merging, overlap and end checks, the cap on
// ranges), a writer's ranges taken back when it does not finish, idle expiry returning the
// reservation, and an abort while a writer is open.
#include "server/core/pending_uploads.h"

#include <gtest/gtest.h>

#include "server/backends/cpu/cpu_backend.h"

namespace fusebox {
namespace {

class PendingUploadsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(CpuBackendOptions{});
  TensorStore store_{backend_.get(), StoreLimits{}};
};

TEST_F(PendingUploadsTest, AWritersAdjacentRangesMergeSoTheCapCountsOnlyGaps) {
  PendingUploads uploads(&store_, 0);
  const int64_t n = 2 * PendingUploads::kMaxRanges + 4000;  // bytes: float16 x n / 2
  auto c = uploads.Create("t", DType::kFloat16, {n / 2});
  ASSERT_TRUE(c.ok()) << c.status();
  auto w = uploads.OpenWriter("t", c->id);
  ASSERT_TRUE(w.ok());
  // Going forward byte by byte stays one range however many claims it takes.
  for (int64_t i = 0; i < 1000; ++i) ASSERT_TRUE((*w)->Claim(i, 1).ok());
  // Every other byte after that is a range of its own: the cap stops it, and says why.
  absl::Status s;
  int64_t off = 1001;
  for (; off < n; off += 2) {
    s = (*w)->Claim(off, 1);
    if (!s.ok()) break;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("write larger contiguous ranges"), std::string::npos);
  EXPECT_EQ((off - 1001) / 2, PendingUploads::kMaxRanges - 1);
  // The refused claim changed nothing: the byte is still free for a claim that fits.
  EXPECT_TRUE((*w)->Claim(off - 1, 1).ok());  // adjacent to the range before: merges
}

TEST_F(PendingUploadsTest, AWriterThatDoesNotFinishLeavesNoRangeBehind) {
  PendingUploads uploads(&store_, 0);
  auto c = uploads.Create("t", DType::kFloat32, {100});
  ASSERT_TRUE(c.ok());
  {
    auto w = uploads.OpenWriter("t", c->id);
    ASSERT_TRUE((*w)->Claim(0, 200).ok());
    EXPECT_EQ((*w)->Claim(100, 10).code(), absl::StatusCode::kInvalidArgument);  // its own
  }  // gone without Finish
  auto w = uploads.OpenWriter("t", c->id);
  ASSERT_TRUE((*w)->Claim(0, 400).ok());  // the whole tensor is free again
  EXPECT_EQ((*w)->Claim(400, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(uploads.TakeComplete("t", c->id).status().code(),
            absl::StatusCode::kFailedPrecondition);  // claimed, not finished: not written
  auto missing = (*w)->Finish();
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(*missing, 0);
  w->reset();
  auto t = uploads.TakeComplete("t", c->id);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bytes, 400);
  EXPECT_EQ(uploads.count(), 0);
}

TEST_F(PendingUploadsTest, IdleUploadsExpireAndReturnTheirReservationButOpenWritersKeepThem) {
  PendingUploads uploads(&store_, 0.001);
  auto idle = uploads.Create("t", DType::kFloat32, {1000});
  auto busy = uploads.Create("t", DType::kFloat32, {1000});
  ASSERT_TRUE(idle.ok() && busy.ok());
  EXPECT_EQ(store_.TenantUsedBytes("t"), 8000);
  auto w = uploads.OpenWriter("t", busy->id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(uploads.ExpireIdle(SteadyNowNs() + 1000000000), 1);  // the idle one only
  EXPECT_EQ(store_.TenantUsedBytes("t"), 4000);
  EXPECT_EQ(uploads.OpenWriter("t", idle->id).status().code(), absl::StatusCode::kNotFound);
  // Aborted under an open writer: its next claim says so, and the memory goes with the writer.
  ASSERT_TRUE(uploads.Abort("t", busy->id).ok());
  EXPECT_EQ((*w)->Claim(0, 4).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_.TenantUsedBytes("t"), 4000);
  w->reset();
  EXPECT_EQ(store_.TenantUsedBytes("t"), 0);
}

}  // namespace
}  // namespace fusebox
