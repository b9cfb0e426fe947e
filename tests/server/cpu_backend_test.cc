// The CPU backend's queue: a transfer's first piece is refused when the queue is full, its
// later pieces are not (an admitted Upload or Download is never cut short by load); a call
// whose caller has gone is answered CANCELLED without being computed; Check refuses nothing; an
// input in pieces or unaligned is read where it is (GeLU) or gathered into place, on one thread
// or several, and one whose pieces hold too few bytes is refused rather than read past.
#include "server/backends/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

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

// Runs GeLU of `n` floats whose bytes are `pieces` (or, with none, `in` as it is) on a backend
// gathering with `copy_threads`; the status, and the result in *out.
absl::Status GeluOf(int copy_threads, const void* in, const HostPieces* pieces, int64_t n,
                    std::vector<float>* out) {
  CpuBackendOptions o;
  o.copy_threads = copy_threads;
  auto b = MakeCpuBackend(o);
  out->assign(n, -7);
  OpCall c;
  c.op = Op::kGelu;
  c.dtype = DType::kFloat32;
  c.rows = 1;
  c.cols = n;
  c.inputs[0] = in;
  c.input_pieces[0] = pieces;
  c.output = out->data();
  c.output_bytes = n * sizeof(float);
  std::promise<absl::Status> done;
  b->Submit(c, SteadyNowNs(), [&](absl::Status s, const OpTiming&) { done.set_value(s); });
  absl::Status s = done.get_future().get();
  b->Shutdown();
  return s;
}

TEST(CpuBackendCalls, AGeluInputInPiecesOrUnalignedGivesTheSameResultWithAnyCopyThreads) {
  const int64_t n = (int64_t{5} << 20) / 4 + 3;  // past two 1 MiB parts, not a multiple of them
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 7919) % 2001 - 1000) / 250;
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  const size_t total = n * sizeof(float);
  // Receive-slice-like pieces: an odd first one (cuts a float), empty ones, then 64 KiB each.
  HostPieces pieces = {{bytes, 13}, {bytes + 13, 0}};
  for (size_t at = 13; at < total; at += 64 << 10) {
    pieces.push_back({bytes + at, std::min<size_t>(64 << 10, total - at)});
    if (pieces.size() % 10 == 0) pieces.push_back({bytes + at, 0});
  }
  // The same floats one byte past an aligned address: copied to an aligned buffer first.
  std::vector<uint8_t> shifted(total + 1);
  std::memcpy(shifted.data() + 1, bytes, total);

  std::vector<float> want, got;
  ASSERT_TRUE(GeluOf(1, values.data(), nullptr, n, &want).ok());
  EXPECT_NE(want[n - 1], -7.0f);  // computed
  for (int threads : {1, 2, 4, 8}) {
    ASSERT_TRUE(GeluOf(threads, bytes, &pieces, n, &got).ok()) << threads;
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), total)) << "pieces, threads " << threads;
    ASSERT_TRUE(GeluOf(threads, shifted.data() + 1, nullptr, n, &got).ok()) << threads;
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), total)) << "unaligned, threads " << threads;
  }
  // Pieces short of the shape's bytes (the service never submits these): refused, not read past.
  while (pieces.back().bytes == 0) pieces.pop_back();
  pieces.pop_back();
  const absl::Status s = GeluOf(2, bytes, &pieces, n, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
}

}  // namespace
}  // namespace fusebox
