// Batching (server/exec/batcher.h) on the CPU backend: small calls of one op, dtype and row
// length that wait together run as one launch and each gets its own result, the same as when
// computed alone; other keys, abandoned calls, calls that cannot be batched and batching turned
// off keep the old behaviour; batch_wait_us bounds how long a call waits for company.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "tests/reference.h"

namespace fusebox {
namespace {

using Clock = std::chrono::steady_clock;

// One call's operands, owned.
struct Call {
  Op op = Op::kSoftmax;
  DType dtype = DType::kFloat32;
  int64_t rows = 1, cols = 1;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);

  size_t OutBytes() const {
    return op == Op::kRowSum ? rows * sizeof(float) : in.size();
  }
  DType OutType() const { return op == Op::kRowSum ? DType::kFloat32 : dtype; }
  int64_t OutElems() const { return op == Op::kRowSum ? rows : rows * cols; }
  OpCall ToOpCall() {
    OpCall c;
    c.op = op;
    c.dtype = dtype;
    c.rows = rows;
    c.cols = cols;
    c.inputs[0] = in.data();
    out.assign(OutBytes(), 0xAB);
    c.output = out.data();
    c.output_bytes = out.size();
    auto g = gone;
    c.abandoned = [g] { return g->load(); };
    return c;
  }
};

Call MakeCall(Op op, DType dt, int64_t rows, int64_t cols, uint64_t seed) {
  Call c;
  c.op = op;
  c.dtype = dt;
  c.rows = rows;
  c.cols = cols;
  c.in = ref::RandomTensor(dt, rows * cols, -4.f, 4.f, seed);
  return c;
}

std::shared_future<absl::Status> Submit(Backend* b, Call* c) {
  auto p = std::make_shared<std::promise<absl::Status>>();
  b->Submit(c->ToOpCall(), SteadyNowNs(),
            [p](absl::Status s, const OpTiming&) { p->set_value(std::move(s)); });
  return p->get_future().share();
}

// The result of `c` computed alone, by a backend that never batches.
std::vector<uint8_t> Alone(const Call& c) {
  static std::unique_ptr<Backend> single = [] {
    CpuBackendOptions o;
    o.batch.enabled = false;
    return MakeCpuBackend(o);
  }();
  Call copy = c;
  const absl::Status s = Submit(single.get(), &copy).get();
  EXPECT_TRUE(s.ok()) << s;
  return copy.out;
}

// `c`'s output equals its result computed alone (to the last bit, or within one rounding of
// the output type where the kernel's vector and scalar paths may round differently) and the
// double-precision reference.
void ExpectOwnResult(const Call& c) {
  const std::vector<uint8_t> alone = Alone(c);
  ASSERT_EQ(alone.size(), c.out.size());
  const DType ot = c.OutType();
  for (int64_t i = 0; i < c.OutElems(); ++i) {
    const float got = LoadAsFloat(ot, c.out.data(), i), want = LoadAsFloat(ot, alone.data(), i);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "element " << i;
      continue;
    }
    ASSERT_NEAR(got, want, 1e-6f * std::max(1.f, std::fabs(want)) +
                               (ot == DType::kFloat32 ? 0.f : 0.01f * std::fabs(want)))
        << OpName(c.op) << " element " << i;
  }
  std::vector<double> want;
  switch (c.op) {
    case Op::kGelu: want = ref::Gelu(c.dtype, c.in.data(), c.rows * c.cols); break;
    case Op::kSoftmax: want = ref::Softmax(c.dtype, c.in.data(), c.rows, c.cols); break;
    default: want = ref::RowSum(c.dtype, c.in.data(), c.rows, c.cols); break;
  }
  const double tol = c.op == Op::kRowSum
                         ? ref::RowSumTolerance(c.dtype, c.in.data(), c.rows, c.cols, want)
                         : ref::DefaultTolerance(c.dtype);
  const ref::Comparison cmp = ref::Compare(ot, c.out.data(), want, tol);
  EXPECT_TRUE(cmp.ok) << OpName(c.op) << " " << DTypeName(c.dtype) << " rel error "
                      << cmp.rel_error;
}

// Holds a backend's only worker until released, so that calls submitted meanwhile queue.
class Hold {
 public:
  explicit Hold(Backend* b) {
    auto buf = b->Allocate(4);
    EXPECT_TRUE(buf.ok());
    buf_ = std::move(*buf);
    auto gate = release_.get_future().share();
    b->SubmitWrite(buf_.get(), 0, src_, 4, SteadyNowNs(),
                   [this, gate](absl::Status, const OpTiming&) {
                     started_ = true;
                     gate.wait();
                   });
    while (!started_) std::this_thread::yield();
  }
  void Release() { release_.set_value(); }

 private:
  std::unique_ptr<Buffer> buf_;
  const char src_[4] = {1, 2, 3, 4};
  std::promise<void> release_;
  std::atomic<bool> started_{false};
};

// Submits every call while the backend's only worker is held (so they queue together), releases
// it, and waits for each call to finish OK.
void RunQueuedTogether(Backend* b, std::vector<Call>* calls) {
  Hold hold(b);
  std::vector<std::shared_future<absl::Status>> done;
  for (Call& c : *calls) done.push_back(Submit(b, &c));
  hold.Release();
  for (auto& d : done) ASSERT_TRUE(d.get().ok()) << d.get();
}

std::unique_ptr<Backend> OneWorker(BatchOptions batch = {}) {
  CpuBackendOptions o;
  o.workers = 1;
  o.batch = batch;
  return MakeCpuBackend(o);
}

TEST(Batching, SameKeyCallsQueuedTogetherRunAsOneLaunchEachWithItsOwnResult) {
  for (Op op : {Op::kGelu, Op::kSoftmax, Op::kRowSum}) {
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      auto b = OneWorker();
      std::vector<Call> calls;
      for (int i = 0; i < 8; ++i) {
        // GeLU batches any shapes of a dtype; softmax / row sum rows of one length.
        const int64_t cols = op == Op::kGelu ? 5 + 7 * i : 67;
        calls.push_back(MakeCall(op, dt, 1 + i, cols, 100 + i));
      }
      const BackendStats before = b->stats();
      ASSERT_NO_FATAL_FAILURE(RunQueuedTogether(b.get(), &calls));
      const BackendStats after = b->stats();
      EXPECT_EQ(after.launches - before.launches, 1) << OpName(op) << " " << DTypeName(dt);
      EXPECT_EQ(after.calls - before.calls, 8);
      EXPECT_EQ(after.batched_calls - before.batched_calls, 8);
      for (const Call& c : calls) ExpectOwnResult(c);
    }
  }
}

TEST(Batching, DifferentKeysNeverMix) {
  auto b = OneWorker();
  std::vector<Call> calls;
  int seed = 0;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat32, 2, 64, ++seed));
    calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat32, 2, 32, ++seed));  // row length
    calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat16, 2, 64, ++seed));  // dtype
    calls.push_back(MakeCall(Op::kRowSum, DType::kFloat32, 2, 64, ++seed));   // op
    calls.push_back(MakeCall(Op::kGelu, DType::kFloat32, 2, 64, ++seed));     // op
  }
  const BackendStats before = b->stats();
  ASSERT_NO_FATAL_FAILURE(RunQueuedTogether(b.get(), &calls));
  const BackendStats after = b->stats();
  EXPECT_EQ(after.launches - before.launches, 5);  // one per key
  EXPECT_EQ(after.calls - before.calls, 15);
  for (const Call& c : calls) ExpectOwnResult(c);
}

TEST(Batching, AnAbandonedCallIsNotRun) {
  auto b = OneWorker();
  std::vector<Call> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat32, 3, 16, i));
  const BackendStats before = b->stats();
  Hold hold(b.get());
  std::vector<std::shared_future<absl::Status>> done;
  for (Call& c : calls) done.push_back(Submit(b.get(), &c));
  *calls[0].gone = true;  // the one whose job starts the batch
  *calls[2].gone = true;  // one the batch would take
  hold.Release();
  for (int i = 0; i < 5; ++i) {
    const absl::Status s = done[i].get();
    if (i == 0 || i == 2) {
      EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << i << ": " << s;
      for (uint8_t byte : calls[i].out) ASSERT_EQ(byte, 0xAB) << "call " << i << " was computed";
    } else {
      ASSERT_TRUE(s.ok()) << i << ": " << s;
      ExpectOwnResult(calls[i]);
    }
  }
  const BackendStats after = b->stats();
  EXPECT_EQ(after.calls - before.calls, 3);
  EXPECT_EQ(after.launches - before.launches, 1);
}

TEST(Batching, BadInputInOneCallNeverAffectsOthers) {
  auto b = OneWorker();
  std::vector<Call> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat32, 2, 8, i));
  // Non-finite values in one call stay in its rows.
  float* bad = reinterpret_cast<float*>(calls[1].in.data());
  bad[0] = NAN;
  bad[9] = INFINITY;
  // A call the batcher refuses (its output buffer is not the result's size) runs alone.
  Call odd = MakeCall(Op::kSoftmax, DType::kFloat32, 2, 8, 99);
  const BackendStats before = b->stats();
  Hold hold(b.get());
  std::vector<std::shared_future<absl::Status>> done;
  for (Call& c : calls) done.push_back(Submit(b.get(), &c));
  auto p = std::make_shared<std::promise<absl::Status>>();
  OpCall oc = odd.ToOpCall();
  odd.out.resize(odd.out.size() + 64, 0xAB);  // larger than the result
  oc.output = odd.out.data();
  oc.output_bytes = odd.out.size();
  b->Submit(oc, SteadyNowNs(), [p](absl::Status s, const OpTiming&) { p->set_value(s); });
  hold.Release();
  for (auto& d : done) ASSERT_TRUE(d.get().ok()) << d.get();
  ASSERT_TRUE(p->get_future().get().ok());
  const BackendStats after = b->stats();
  EXPECT_EQ(after.launches - before.launches, 2);  // the batch of 4, and `odd` alone
  EXPECT_EQ(after.batched_calls - before.batched_calls, 4);
  for (int i : {0, 2, 3}) ExpectOwnResult(calls[i]);
  const float* row0 = reinterpret_cast<const float*>(calls[1].out.data());
  EXPECT_TRUE(std::isnan(row0[0]));
  const std::vector<uint8_t> alone = Alone(calls[1]);
  EXPECT_EQ(std::memcmp(alone.data(), calls[1].out.data(), alone.size()), 0);
}

TEST(Batching, BatchWaitBoundsTheWait) {
  BatchOptions o;
  o.wait_us = 200'000;
  auto b = OneWorker(o);
  // Alone, a call waits the whole wait for company, and not much longer.
  Call lone = MakeCall(Op::kGelu, DType::kFloat32, 1, 16, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(Submit(b.get(), &lone).get().ok());
  const double waited_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_GE(waited_ms, 199);
  EXPECT_LT(waited_ms, 5000);
  ExpectOwnResult(lone);

  // A call that arrives within the wait joins the waiting one's launch.
  const BackendStats before = b->stats();
  Call first = MakeCall(Op::kGelu, DType::kFloat32, 1, 16, 2);
  Call second = MakeCall(Op::kGelu, DType::kFloat32, 1, 16, 3);
  auto d1 = Submit(b.get(), &first);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto d2 = Submit(b.get(), &second);
  ASSERT_TRUE(d1.get().ok());
  ASSERT_TRUE(d2.get().ok());
  const BackendStats after = b->stats();
  EXPECT_EQ(after.calls - before.calls, 2);
  EXPECT_EQ(after.launches - before.launches, 1);
  ExpectOwnResult(first);
  ExpectOwnResult(second);

  // 0: never wait.
  auto nowait = OneWorker();
  Call quick = MakeCall(Op::kGelu, DType::kFloat32, 1, 16, 4);
  const auto t1 = Clock::now();
  ASSERT_TRUE(Submit(nowait.get(), &quick).get().ok());
  const double quick_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  EXPECT_LT(quick_ms, 150);  // far below the 200 ms a waiting call takes
}

TEST(Batching, OffOrOverTheSizeCapEveryCallRunsAlone) {
  BatchOptions off;
  off.enabled = false;
  BatchOptions small;
  small.max_call_bytes = 1024;  // the calls below have 2 KiB
  for (const BatchOptions& o : {off, small}) {
    auto b = OneWorker(o);
    std::vector<Call> calls;
    for (int i = 0; i < 6; ++i) calls.push_back(MakeCall(Op::kSoftmax, DType::kFloat32, 8, 64, i));
    const BackendStats before = b->stats();
    ASSERT_NO_FATAL_FAILURE(RunQueuedTogether(b.get(), &calls));
    const BackendStats after = b->stats();
    EXPECT_EQ(after.launches - before.launches, 6);
    EXPECT_EQ(after.calls - before.calls, 6);
    EXPECT_EQ(after.batched_calls - before.batched_calls, 0);
    for (const Call& c : calls) ExpectOwnResult(c);
  }
}

TEST(Batching, ABatchStopsAtItsByteCap) {
  BatchOptions o;
  o.max_batch_bytes = 3 * 1024;  // three of the 1 KiB calls below
  auto b = OneWorker(o);
  std::vector<Call> calls;
  for (int i = 0; i < 7; ++i) calls.push_back(MakeCall(Op::kRowSum, DType::kFloat32, 4, 64, i));
  const BackendStats before = b->stats();
  ASSERT_NO_FATAL_FAILURE(RunQueuedTogether(b.get(), &calls));
  const BackendStats after = b->stats();
  EXPECT_EQ(after.launches - before.launches, 3);  // 3 + 3 + 1
  for (const Call& c : calls) ExpectOwnResult(c);
}

// Many callers of mixed keys at once, every result checked against the call computed alone.
TEST(Batching, StressManyCallersOfMixedKeysEachGetTheirOwnResult) {
  for (int64_t wait_us : {0, 200}) {
    CpuBackendOptions opts;
    opts.workers = 2;
    opts.batch.wait_us = wait_us;
    auto b = MakeCpuBackend(opts);
    constexpr int kCallers = 64, kCallsEach = 20;
    const Op ops[] = {Op::kGelu, Op::kSoftmax, Op::kRowSum};
    const DType dts[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    const int64_t colss[] = {16, 64, 100};
    // Every caller's calls, made and their results computed alone beforehand.
    std::vector<std::vector<Call>> calls(kCallers);
    std::vector<std::vector<std::vector<uint8_t>>> want(kCallers);
    std::mt19937 rng(7);
    for (int t = 0; t < kCallers; ++t) {
      for (int i = 0; i < kCallsEach; ++i) {
        Call c = MakeCall(ops[rng() % 3], dts[rng() % 3], 1 + rng() % 6, colss[rng() % 3],
                          t * 1000 + i);
        want[t].push_back(Alone(c));
        calls[t].push_back(std::move(c));
      }
    }
    const BackendStats before = b->stats();
    std::atomic<int> failures{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < kCallers; ++t) {
      callers.emplace_back([&, t] {
        for (int i = 0; i < kCallsEach; ++i) {
          Call& c = calls[t][i];
          if (!Submit(b.get(), &c).get().ok() || c.out != want[t][i]) ++failures;
        }
      });
    }
    for (auto& th : callers) th.join();
    EXPECT_EQ(failures.load(), 0) << "wait_us " << wait_us;
    const BackendStats after = b->stats();
    const int64_t n = after.calls - before.calls, launches = after.launches - before.launches;
    EXPECT_EQ(n, kCallers * kCallsEach);
    EXPECT_LE(launches, n);
    std::printf("wait_us %lld: %lld calls in %lld launches (%lld batched)\n",
                static_cast<long long>(wait_us), static_cast<long long>(n),
                static_cast<long long>(launches),
                static_cast<long long>(after.batched_calls - before.batched_calls));
  }
}

}  // namespace
}  // namespace fusebox
