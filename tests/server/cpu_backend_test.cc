// The CPU backend's queue: a transfer's first piece is refused when the queue is full, its
// later pieces are not (an admitted Upload or Download is never cut short by load); a call
// whose caller has gone is answered CANCELLED without being computed; Check refuses nothing.
#include "server/backends/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

namespace fusebox {
namespace {

TEST(CpuBackendCopies, ALaterPieceOfATransferIsQueuedPastAFullQueue) {
  CpuBackendOptions o;
  o.workers = 1;
  o.queue_capacity = 1;
  auto b = MakeCpuBackend(o);
  auto buf = b->Allocate(16);
  ASSERT_TRUE(buf.ok());
  const char src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::promise<void> release;
  auto gate = release.get_future().share();
  std::atomic<bool> started{false};
  // The only worker runs this write and then waits in its callback.
  b->SubmitWrite(buf->get(), 0, src, 4, SteadyNowNs(), [&, gate](absl::Status, const OpTiming&) {
    started = true;
    gate.wait();
  });
  while (!started) std::this_thread::yield();
  auto submit = [&](size_t offset) {
    auto p = std::make_shared<std::promise<absl::Status>>();
    b->SubmitWrite(buf->get(), offset, src, 4, SteadyNowNs(),
                   [p](absl::Status s, const OpTiming&) { p->set_value(std::move(s)); });
    return p->get_future();
  };
  auto queued = submit(0);     // fills the queue
  auto refused = submit(0);    // a new transfer: refused at once
  auto continued = submit(4);  // a later piece: queued anyway
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(refused.get().code(), absl::StatusCode::kResourceExhausted);
  release.set_value();
  EXPECT_TRUE(queued.get().ok());
  EXPECT_TRUE(continued.get().ok());
  b->Shutdown();
}

TEST(CpuBackendCalls, AnAbandonedCallIsCancelledWithoutBeingComputed) {
  auto b = MakeCpuBackend({});
  const float in[4] = {1, 2, 3, 4};
  for (bool gone : {true, false}) {
    float out[4] = {-7, -7, -7, -7};
    OpCall c;
    c.op = Op::kGelu;
    c.dtype = DType::kFloat32;
    c.rows = 1;
    c.cols = 4;
    c.inputs[0] = in;
    c.output = out;
    c.output_bytes = sizeof out;
    c.abandoned = [gone] { return gone; };
    std::promise<absl::Status> done;
    b->Submit(c, SteadyNowNs(), [&](absl::Status s, const OpTiming&) { done.set_value(s); });
    const absl::Status s = done.get_future().get();
    if (gone) {
      EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
      EXPECT_EQ(out[3], -7);  // not computed
    } else {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_NEAR(out[3], 3.99993f, 1e-4);
    }
  }
  b->Shutdown();
}

// The CPU's kernels take any row length: Check refuses nothing the request checks passed
// (rows longer than the GPU kernels' longest included), and needs no buffers to answer.
TEST(CpuBackendCalls, CheckAcceptsRowsOfAnyLength) {
  auto b = MakeCpuBackend({});
  for (Op op : {Op::kGelu, Op::kSoftmax, Op::kRowSum}) {
    OpCall c;
    c.op = op;
    c.dtype = DType::kFloat16;
    c.rows = 1;
    c.cols = (int64_t{1} << 30) + 1;
    c.output_bytes = op == Op::kRowSum ? 4 : static_cast<size_t>(c.cols) * 2;
    EXPECT_TRUE(b->Check(c).ok()) << OpName(op);
  }
  b->Shutdown();
}

}  // namespace
}  // namespace fusebox
