// Tests of the CUDA backend module as the server uses it: dlopen
// libfusebox_cuda_backend.so, create the backend through its one exported
// symbol, submit OpCalls and check results against the fp64 reference, that
// concurrent calls run on different streams and overlap, that an impossible
// allocation is RESOURCE_EXHAUSTED and the backend keeps serving, that rows
// past the kernels' longest are INVALID_ARGUMENT (and Check says so before
// anything is queued), that an abandoned call is answered CANCELLED without
// being computed, that a broken context turns later calls UNAVAILABLE, that
// first launches work while the pool holds all free device memory, and that
// Allocate and freeing a buffer do not wait for a running kernel (each of the
// last three in a child process), and that timings add up. Skips when the
// module cannot be loaded or finds no GPU.
// Module path: $FUSEBOX_CUDA_MODULE, else next to this executable, else the
// build tree's. Cost: a few seconds on the H200.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/exec/backend.h"
#include "server/backends/cuda/cuda_backend.h"
#include "tests/reference.h"

namespace fusebox {
namespace {

using Factory = decltype(&fusebox_create_cuda_backend);

std::string ModulePath() {
  if (const char* env = std::getenv("FUSEBOX_CUDA_MODULE")) return env;
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    std::string dir(buf, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string candidate = dir + "/libfusebox_cuda_backend.so";
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return FUSEBOX_CUDA_MODULE_PATH;
}

// Loads the module once; null (with the reason in *why) when unusable here.
Factory LoadFactory(std::string* why) {
  static void* lib = dlopen(ModulePath().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = std::string("cannot load the module: ") + dlerror();
    return nullptr;
  }
  auto f = reinterpret_cast<Factory>(dlsym(lib, "fusebox_create_cuda_backend"));
  if (f == nullptr) *why = "module lacks fusebox_create_cuda_backend";
  return f;
}

std::unique_ptr<Backend> MakeBackend(const CudaBackendOptions& o, std::string* why) {
  Factory f = LoadFactory(why);
  if (f == nullptr) return nullptr;
  char err[512] = {0};
  Backend* b = f(&o, err, sizeof err, nullptr);
  if (b == nullptr) *why = err;
  return std::unique_ptr<Backend>(b);
}

std::unique_ptr<Backend> OneStreamBackend(std::string* why) {
  CudaBackendOptions o;
  o.streams = 1;
  return MakeBackend(o, why);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Result {
  absl::Status status;
  OpTiming timing;
};

std::future<Result> SubmitAsync(Backend& b, const OpCall& call) {
  auto promise = std::make_shared<std::promise<Result>>();
  auto future = promise->get_future();
  b.Submit(call, NowNs(), [promise](absl::Status s, const OpTiming& t) {
    promise->set_value(Result{std::move(s), t});
  });
  return future;
}

Result SubmitSync(Backend& b, const OpCall& call) { return SubmitAsync(b, call).get(); }

class CudaBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    CudaBackendOptions o;
    o.streams = 4;
    std::string why;
    backend_ = MakeBackend(o, &why);
    if (!backend_) GTEST_SKIP() << "no CUDA backend here: " << why;
  }
  std::unique_ptr<Backend> backend_;
};

// A call with host buffers it owns; output poisoned with 0xFF (NaN).
struct HostCall {
  OpCall call;
  std::vector<uint8_t> in[3];
  std::vector<uint8_t> out;
  std::vector<double> ref;
  DType out_dtype = DType::kFloat32;

  void Bind() {
    for (int i = 0; i < 3; ++i) call.inputs[i] = in[i].empty() ? nullptr : in[i].data();
    out.assign(call.output_bytes, 0xFF);
    call.output = out.data();
  }
  // Row sums are held to a tolerance scaled by their condition number (reference.h): a row of
  // random signs can sum to nearly zero, and 1e-5 of that is below float32's own rounding.
  ref::Comparison Check(double tol) const {
    if (call.op == Op::kRowSum) {
      tol = std::max(tol, ref::RowSumTolerance(call.dtype, in[0].data(), call.rows, call.cols, ref));
    }
    return ref::Compare(out_dtype, out.data(), ref, tol);
  }
};

HostCall MakeElementwise(Op op, DType dt, int64_t rows, int64_t cols, uint64_t seed) {
  HostCall h;
  h.call.op = op;
  h.call.dtype = dt;
  h.call.rows = rows;
  h.call.cols = cols;
  h.in[0] = ref::RandomTensor(dt, rows * cols, -4.f, 4.f, seed);
  switch (op) {
    case Op::kGelu: h.ref = ref::Gelu(dt, h.in[0].data(), rows * cols); break;
    case Op::kSoftmax: h.ref = ref::Softmax(dt, h.in[0].data(), rows, cols); break;
    default: h.ref = ref::RowSum(dt, h.in[0].data(), rows, cols); break;
  }
  h.out_dtype = op == Op::kRowSum ? DType::kFloat32 : dt;
  h.call.output_bytes = (op == Op::kRowSum ? rows : rows * cols) * ElementSize(h.out_dtype);
  h.Bind();
  return h;
}

HostCall MakeMatmul(DType dt, int64_t m, int64_t n, int64_t k, bool bias, MatmulImpl impl,
                    uint64_t seed) {
  HostCall h;
  h.call.op = Op::kMatmulRelu;
  h.call.dtype = dt;
  h.call.m = m;
  h.call.n = n;
  h.call.k = k;
  h.call.matmul_impl = impl;
  h.in[0] = ref::RandomTensor(dt, m * k, -1.f, 1.f, seed);
  h.in[1] = ref::RandomTensor(dt, k * n, -1.f, 1.f, seed + 1);
  if (bias) h.in[2] = ref::RandomTensor(dt, n, -1.f, 1.f, seed + 2);
  h.ref = ref::MatmulRelu(dt, h.in[0].data(), h.in[1].data(), bias ? h.in[2].data() : nullptr, m,
                          n, k);
  h.out_dtype = dt;
  h.call.output_bytes = m * n * ElementSize(dt);
  h.Bind();
  return h;
}

double Tol(Op op, DType dt) {
  if (op == Op::kRowSum) return 1e-5;
  if (op == Op::kMatmulRelu) return dt == DType::kFloat32 ? 1e-5 : dt == DType::kFloat16 ? 2e-3 : 1e-2;
  return ref::DefaultTolerance(dt);
}

void ExpectTimingSane(const OpTiming& t) {
  EXPECT_GE(t.queue_us, 0);
  EXPECT_GE(t.copy_in_us, 0);
  EXPECT_GE(t.launch_us, 0);
  EXPECT_LT(t.launch_us, 2000) << "the kernel gate gives up after 1 ms";
  EXPECT_GT(t.kernel_us, 0);
  EXPECT_GE(t.copy_out_us, 0);
  EXPECT_GE(t.stream, 0);
  // The phases happen inside the call's lifetime (events and the host clock
  // differ by a few microseconds at most).
  EXPECT_LE(t.queue_us + t.copy_in_us + t.launch_us + t.kernel_us + t.copy_out_us,
            t.total_us * 1.02 + 20)
      << "queue " << t.queue_us << " in " << t.copy_in_us << " launch " << t.launch_us << " kernel "
      << t.kernel_us << " out " << t.copy_out_us << " total " << t.total_us;
}

TEST_F(CudaBackendTest, NameDeviceAndStats) {
  EXPECT_EQ(backend_->name(), "cuda");
  EXPECT_EQ(backend_->device().rfind("cuda:0 ", 0), 0u) << backend_->device();
  const BackendStats s = backend_->stats();
  EXPECT_EQ(s.workers, 4);
  EXPECT_GT(s.device_memory_total, int64_t{1} << 30);
  EXPECT_GT(s.device_memory_used, 0);
  EXPECT_LE(s.device_memory_used, s.device_memory_total);
}

TEST_F(CudaBackendTest, EveryOpAndDtypeMatchesReference) {
  uint64_t seed = 1;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<HostCall> calls;
    calls.push_back(MakeElementwise(Op::kGelu, dt, 1, 1000003, seed++));
    calls.push_back(MakeElementwise(Op::kSoftmax, dt, 37, 1000, seed++));
    calls.push_back(MakeElementwise(Op::kSoftmax, dt, 3, 65537, seed++));
    calls.push_back(MakeElementwise(Op::kRowSum, dt, 129, 4097, seed++));
    calls.push_back(MakeMatmul(dt, 65, 33, 129, true, MatmulImpl::kDefault, seed++));
    calls.push_back(MakeMatmul(dt, 65, 33, 129, false, MatmulImpl::kCublasLt, seed++));
    calls.push_back(MakeMatmul(dt, 300, 264, 200, true, MatmulImpl::kTiled, seed++));
    for (HostCall& h : calls) {
      SCOPED_TRACE(testing::Message() << OpName(h.call.op) << " " << DTypeName(dt) << " rows "
                                      << h.call.rows << " cols " << h.call.cols << " m "
                                      << h.call.m);
      const Result r = SubmitSync(*backend_, h.call);
      ASSERT_TRUE(r.status.ok()) << r.status;
      const ref::Comparison c = h.Check(Tol(h.call.op, dt));
      EXPECT_TRUE(c.ok) << "rel_error " << c.rel_error << " first_bad " << c.first_bad;
      ExpectTimingSane(r.timing);
    }
  }
}

TEST_F(CudaBackendTest, LargeTransfersCrossManyStagingChunks) {
  // 96 MiB in and out: more than the 64 MiB staging ring, so slots are reused.
  HostCall h = MakeElementwise(Op::kGelu, DType::kFloat32, 1, 24 << 20, 42);
  const Result r = SubmitSync(*backend_, h.call);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(h.Check(1e-5).ok);
  ExpectTimingSane(r.timing);
  // PCIe moves ~55 GB/s and a host memcpy ~16 GB/s: 96 MiB each way is
  // milliseconds, not microseconds and not seconds.
  EXPECT_GT(r.timing.copy_in_us, 1000);
  EXPECT_LT(r.timing.copy_in_us, 200000);
  EXPECT_GT(r.timing.copy_out_us, 1000);
  EXPECT_LT(r.timing.copy_out_us, 200000);
  std::printf("96 MiB gelu fp32: copy_in %.0f us, kernel %.0f us, copy_out %.0f us, total %.0f us\n",
              r.timing.copy_in_us, r.timing.kernel_us, r.timing.copy_out_us, r.timing.total_us);
}

TEST_F(CudaBackendTest, ConcurrentCallsUseDifferentStreamsAndOverlap) {
  constexpr int kCalls = 8;
  std::vector<HostCall> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(MakeElementwise(Op::kGelu, DType::kFloat32, 1, 8 << 20, 100 + i));  // 32 MiB
  }
  // Warm-up, then one at a time.
  ASSERT_TRUE(SubmitSync(*backend_, calls[0].call).status.ok());
  const int64_t t0 = NowNs();
  for (HostCall& h : calls) ASSERT_TRUE(SubmitSync(*backend_, h.call).status.ok());
  const double sequential_ms = (NowNs() - t0) / 1e6;
  // All at once.
  for (HostCall& h : calls) h.Bind();
  const int64_t t1 = NowNs();
  std::vector<std::future<Result>> futures;
  for (HostCall& h : calls) futures.push_back(SubmitAsync(*backend_, h.call));
  std::set<int> streams;
  for (auto& f : futures) {
    const Result r = f.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    streams.insert(r.timing.stream);
  }
  const double concurrent_ms = (NowNs() - t1) / 1e6;
  for (HostCall& h : calls) EXPECT_TRUE(h.Check(1e-5).ok);
  EXPECT_EQ(streams.size(), 4u);
  std::printf("8 x 32 MiB gelu: sequential %.1f ms, concurrent on 4 streams %.1f ms\n",
              sequential_ms, concurrent_ms);
  EXPECT_LT(concurrent_ms, 0.75 * sequential_ms);
}

TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhaustedAndBackendKeepsServing) {
  // 2^36 float32 elements: 256 GiB in and 256 GiB out, more than any GPU.
  // The allocation fails before a byte is copied, so tiny host buffers do.
  std::vector<uint8_t> tiny(64);
  OpCall huge;
  huge.op = Op::kGelu;
  huge.dtype = DType::kFloat32;
  huge.rows = 1;
  huge.cols = int64_t{1} << 36;
  huge.inputs[0] = tiny.data();
  huge.output = tiny.data();
  huge.output_bytes = size_t{4} << 36;
  const Result r = SubmitSync(*backend_, huge);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status)) << r.status;
  EXPECT_NE(r.status.message().find("GPU memory"), std::string::npos) << r.status;
  EXPECT_NE(r.status.message().find("needs 549755813888 bytes"), std::string::npos) << r.status;

  auto buf = backend_->Allocate(size_t{1} << 40);
  EXPECT_TRUE(absl::IsResourceExhausted(buf.status())) << buf.status();
  EXPECT_NE(buf.status().message().find("needs 1099511627776 bytes"), std::string::npos)
      << buf.status();

  HostCall h = MakeMatmul(DType::kBFloat16, 64, 48, 32, true, MatmulImpl::kDefault, 9);
  const Result ok = SubmitSync(*backend_, h.call);
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_TRUE(h.Check(1e-2).ok);
}

TEST_F(CudaBackendTest, ResidentTensorsSkipCopies) {
  HostCall h = MakeMatmul(DType::kFloat16, 96, 72, 40, true, MatmulImpl::kDefault, 21);
  // Upload A as a resident tensor, keep the result resident, then read it back.
  auto a = backend_->Allocate(h.in[0].size());
  ASSERT_TRUE(a.ok()) << a.status();
  auto out = backend_->Allocate(h.call.output_bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  std::promise<absl::Status> wrote;
  backend_->SubmitWrite(a->get(), 0, h.in[0].data(), h.in[0].size(), NowNs(),
                        [&](absl::Status s, const OpTiming&) { wrote.set_value(s); });
  ASSERT_TRUE(wrote.get_future().get().ok());
  OpCall call = h.call;
  call.inputs[0] = (*a)->data();
  call.input_resident[0] = true;
  call.output = (*out)->data();
  call.output_resident = true;
  const Result r = SubmitSync(*backend_, call);
  ASSERT_TRUE(r.status.ok()) << r.status;
  std::promise<absl::Status> read;
  backend_->SubmitRead(out->get(), 0, h.out.data(), h.out.size(), NowNs(),
                       [&](absl::Status s, const OpTiming&) { read.set_value(s); });
  ASSERT_TRUE(read.get_future().get().ok());
  EXPECT_TRUE(h.Check(2e-3).ok);
}

TEST_F(CudaBackendTest, WrongOutputSizeIsInvalidArgument) {
  HostCall h = MakeElementwise(Op::kGelu, DType::kFloat32, 1, 100, 3);
  h.call.output_bytes -= 4;
  const Result r = SubmitSync(*backend_, h.call);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status)) << r.status;
}

TEST_F(CudaBackendTest, RowsPastTheKernelsLongestAreInvalidArgument) {
  // float16 rows of 2^30 + 1 elements: not a whole number of 16-byte accesses, so the scalar
  // path, which takes 2^30 - 1 at most (the CPU backend computes them). Refused before any
  // allocation or copy, so tiny host buffers do.
  std::vector<uint8_t> tiny(64);
  for (Op op : {Op::kSoftmax, Op::kRowSum}) {
    OpCall c;
    c.op = op;
    c.dtype = DType::kFloat16;
    c.rows = 1;
    c.cols = (int64_t{1} << 30) + 1;
    c.inputs[0] = tiny.data();
    c.output = tiny.data();
    c.output_bytes = op == Op::kRowSum ? 4 : static_cast<size_t>(c.cols) * 2;
    const Result r = SubmitSync(*backend_, c);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status)) << r.status;
    EXPECT_NE(r.status.message().find("too long"), std::string::npos) << r.status;
  }
  HostCall h = MakeElementwise(Op::kSoftmax, DType::kFloat16, 3, 1000, 4);
  const Result ok = SubmitSync(*backend_, h.call);
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_TRUE(h.Check(Tol(Op::kSoftmax, DType::kFloat16)).ok);
}

// Check gives a call the error Submit would, without queueing it or touching its buffers
// (none are given here); Submit itself answers such a call before it returns.
TEST_F(CudaBackendTest, CheckRefusesRowsPastTheKernelsLongestBeforeAnythingIsQueued) {
  for (Op op : {Op::kSoftmax, Op::kRowSum}) {
    SCOPED_TRACE(OpName(op));
    OpCall c;
    c.op = op;
    c.dtype = DType::kFloat16;
    c.rows = 1;
    c.cols = (int64_t{1} << 30) + 1;  // as in RowsPastTheKernelsLongestAreInvalidArgument
    c.output_bytes = op == Op::kRowSum ? 4 : static_cast<size_t>(c.cols) * 2;
    const absl::Status checked = backend_->Check(c);
    EXPECT_TRUE(absl::IsInvalidArgument(checked)) << checked;
    EXPECT_NE(checked.message().find("too long"), std::string::npos) << checked;
    auto answer = std::make_shared<std::promise<absl::Status>>();
    auto answered = answer->get_future();
    backend_->Submit(c, NowNs(), [answer](absl::Status s, const OpTiming&) {
      answer->set_value(std::move(s));
    });
    ASSERT_EQ(answered.wait_for(std::chrono::seconds(0)), std::future_status::ready)
        << "answered from the queue, not before it";
    EXPECT_EQ(answered.get(), checked);
    // The longest row each path takes is accepted: 2^30 - 1 scalar accesses.
    c.cols = (int64_t{1} << 30) - 1;
    c.output_bytes = op == Op::kRowSum ? 4 : static_cast<size_t>(c.cols) * 2;
    c.inputs[0] = &c;  // Check reads no operand; it wants them present
    c.output = &c;
    EXPECT_TRUE(backend_->Check(c).ok()) << backend_->Check(c);
  }
  HostCall h = MakeMatmul(DType::kBFloat16, 64, 48, 32, true, MatmulImpl::kDefault, 11);
  EXPECT_TRUE(backend_->Check(h.call).ok());
  h.call.output_bytes -= 2;
  EXPECT_TRUE(absl::IsInvalidArgument(backend_->Check(h.call)));
}

TEST_F(CudaBackendTest, AnAbandonedCallIsCancelledWithoutBeingComputed) {
  HostCall h = MakeElementwise(Op::kSoftmax, DType::kFloat32, 7, 300, 6);
  h.call.abandoned = [] { return true; };
  const Result r = SubmitSync(*backend_, h.call);
  EXPECT_TRUE(absl::IsCancelled(r.status)) << r.status;
  for (uint8_t byte : h.out) ASSERT_EQ(byte, 0xFF);  // still the poison
  h.call.abandoned = [] { return false; };
  ASSERT_TRUE(SubmitSync(*backend_, h.call).status.ok());
  EXPECT_TRUE(h.Check(Tol(Op::kSoftmax, DType::kFloat32)).ok);
}

TEST_F(CudaBackendTest, TimingsMatchTheWork) {
  // bf16 1024^3 matmul: 2.1 GFLOP, a few microseconds at the H200's rate;
  // 2 x 2 MiB in and 2 MiB out.
  HostCall h = MakeMatmul(DType::kBFloat16, 1024, 1024, 1024, false, MatmulImpl::kDefault, 5);
  ASSERT_TRUE(SubmitSync(*backend_, h.call).status.ok());  // warm-up (heuristic, pool)
  h.Bind();
  const Result r = SubmitSync(*backend_, h.call);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(h.Check(1e-2).ok);
  ExpectTimingSane(r.timing);
  // Between 1 us (2000 TFLOP/s, impossible) and 5 ms (0.4 TFLOP/s, broken).
  EXPECT_GT(r.timing.kernel_us, 1);
  EXPECT_LT(r.timing.kernel_us, 5000);
  std::printf("bf16 1024^3 matmul: queue %.1f in %.1f kernel %.1f out %.1f total %.1f us\n",
              r.timing.queue_us, r.timing.copy_in_us, r.timing.kernel_us, r.timing.copy_out_us,
              r.timing.total_us);
}

// A device ordinal past the last is the caller's mistake: INVALID_ARGUMENT, which stops
// --backend=auto instead of serving from the CPU (no GPU at all is UNAVAILABLE).
// Batching (server/exec/batcher.h) on the GPU: small calls of one key queued while the only
// stream is busy run as one launch (one copy in of the packed inputs, one kernel, one copy out
// split into each call's output), each with its own correct result and sane timing; keys
// never mix; inputs in pieces are packed too.
class CudaBatchingTest : public testing::Test {
 protected:
  void SetUp() override {
    CudaBackendOptions o;
    o.streams = 1;
    std::string why;
    backend_ = MakeBackend(o, &why);
    if (!backend_) GTEST_SKIP() << "no CUDA backend here: " << why;
  }
  // Holds the only stream (its worker waits in a write's callback) until the future is set.
  void Hold(std::shared_future<void> gate) {
    auto buf = backend_->Allocate(4);
    ASSERT_TRUE(buf.ok());
    held_ = std::move(*buf);
    auto started = std::make_shared<std::promise<void>>();
    auto started_f = started->get_future();
    backend_->SubmitWrite(held_.get(), 0, "abcd", 4, NowNs(),
                          [started, gate](absl::Status, const OpTiming&) {
                            started->set_value();
                            gate.wait();
                          });
    started_f.wait();
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Buffer> held_;
};

TEST_F(CudaBatchingTest, SameKeyCallsQueuedTogetherRunAsOneLaunchEachWithItsOwnResult) {
  uint64_t seed = 1;
  for (Op op : {Op::kGelu, Op::kSoftmax, Op::kRowSum}) {
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(testing::Message() << OpName(op) << " " << DTypeName(dt));
      std::vector<HostCall> calls;
      std::vector<HostPieces> pieces(8);
      for (int i = 0; i < 8; ++i) {
        calls.push_back(MakeElementwise(op, dt, 1 + i, op == Op::kGelu ? 3 + 5 * i : 96, seed++));
      }
      for (int i = 0; i < 8; i += 2) {  // every other input arrives in two pieces
        HostCall& h = calls[i];
        const size_t half = h.in[0].size() / 2;
        pieces[i] = {{h.in[0].data(), half}, {h.in[0].data() + half, h.in[0].size() - half}};
        h.call.input_pieces[0] = &pieces[i];
      }
      const BackendStats before = backend_->stats();
      std::promise<void> release;
      Hold(release.get_future().share());
      std::vector<std::future<Result>> done;
      for (HostCall& h : calls) done.push_back(SubmitAsync(*backend_, h.call));
      release.set_value();
      for (size_t i = 0; i < calls.size(); ++i) {
        const Result r = done[i].get();
        ASSERT_TRUE(r.status.ok()) << r.status;
        const ref::Comparison c = calls[i].Check(Tol(op, dt));
        EXPECT_TRUE(c.ok) << "call " << i << " rel_error " << c.rel_error;
        ExpectTimingSane(r.timing);
      }
      const BackendStats after = backend_->stats();
      EXPECT_EQ(after.launches - before.launches, 1);
      EXPECT_EQ(after.calls - before.calls, 8);
      EXPECT_EQ(after.batched_calls - before.batched_calls, 8);
    }
  }
}

TEST_F(CudaBatchingTest, DifferentKeysNeverMixAndAbandonedCallsAreNotRun) {
  std::vector<HostCall> calls;
  uint64_t seed = 100;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(MakeElementwise(Op::kSoftmax, DType::kFloat32, 2, 64, seed++));
    calls.push_back(MakeElementwise(Op::kSoftmax, DType::kFloat32, 2, 32, seed++));
    calls.push_back(MakeElementwise(Op::kSoftmax, DType::kFloat16, 2, 64, seed++));
    calls.push_back(MakeElementwise(Op::kRowSum, DType::kFloat32, 2, 64, seed++));
  }
  HostCall gone = MakeElementwise(Op::kSoftmax, DType::kFloat32, 2, 64, seed++);
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  gone.call.abandoned = [abandoned] { return abandoned->load(); };
  const BackendStats before = backend_->stats();
  std::promise<void> release;
  Hold(release.get_future().share());
  std::vector<std::future<Result>> done;
  for (HostCall& h : calls) done.push_back(SubmitAsync(*backend_, h.call));
  auto gone_done = SubmitAsync(*backend_, gone.call);
  *abandoned = true;
  release.set_value();
  for (size_t i = 0; i < calls.size(); ++i) {
    const Result r = done[i].get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_TRUE(calls[i].Check(Tol(calls[i].call.op, calls[i].call.dtype)).ok) << "call " << i;
  }
  EXPECT_EQ(gone_done.get().status.code(), absl::StatusCode::kCancelled);
  for (uint8_t b : gone.out) ASSERT_EQ(b, 0xFF) << "the abandoned call was computed";
  const BackendStats after = backend_->stats();
  EXPECT_EQ(after.launches - before.launches, 4);  // one per key
  EXPECT_EQ(after.calls - before.calls, 12);
}

TEST_F(CudaBatchingTest, ManyCallersOfMixedKeysEachGetTheirOwnResult) {
  constexpr int kCallers = 32, kCallsEach = 20;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_failure;
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < kCallsEach; ++i) {
        const Op op = (t + i) % 3 == 0 ? Op::kGelu : (t + i) % 3 == 1 ? Op::kSoftmax : Op::kRowSum;
        const DType dt = t % 2 ? DType::kFloat32 : DType::kBFloat16;
        HostCall h = MakeElementwise(op, dt, 1 + (i % 5), 64 + 32 * (t % 2), t * 1000 + i);
        const Result r = SubmitSync(*backend_, h.call);
        const ref::Comparison c = r.status.ok() ? h.Check(Tol(op, dt)) : ref::Comparison{};
        if (!r.status.ok() || !c.ok) {
          ++failures;
          std::lock_guard<std::mutex> lock(mu);
          if (first_failure.empty()) {
            first_failure = testing::PrintToString(r.status) + " " + OpName(op) + " " +
                            DTypeName(dt) + " " + std::to_string(h.call.rows) + "x" +
                            std::to_string(h.call.cols) + " rel_error " +
                            std::to_string(c.rel_error);
          }
        }
      }
    });
  }
  for (auto& th : callers) th.join();
  EXPECT_EQ(failures.load(), 0) << "first: " << first_failure;
}

// --cuda_graphs: a small call of a shape the stream has run before is one CUDA graph replayed
// (StreamWorker::RunAsGraph). Every call of a shape, the first (usual path), the second
// (captured, then replayed) and later ones (replayed), on fresh inputs, inputs in pieces among
// them, matches the reference with sane timings; so do calls the graphs do not take (a kept
// output) interleaved with them.
TEST(CudaGraphsTest, RepeatedSmallCallsReplayAGraphWithFreshInputsAndTheirOwnResults) {
  CudaBackendOptions o;
  o.streams = 1;
  o.cuda_graphs = true;
  std::string why;
  std::unique_ptr<Backend> b = MakeBackend(o, &why);
  if (!b) GTEST_SKIP() << "no CUDA backend here: " << why;
  uint64_t seed = 500;
  for (Op op : {Op::kGelu, Op::kSoftmax, Op::kRowSum}) {
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{3, 97}, {64, 256}, {1, 4093}}) {
        SCOPED_TRACE(testing::Message() << OpName(op) << " " << DTypeName(dt) << " " << rows << "x" << cols);
        for (int i = 0; i < 4; ++i) {
          HostCall h = MakeElementwise(op, dt, rows, cols, seed++);
          HostPieces pieces;
          if (i == 3) {  // the last arrives in two pieces
            const size_t half = h.in[0].size() / 2;
            pieces = {{h.in[0].data(), half}, {h.in[0].data() + half, h.in[0].size() - half}};
            h.call.input_pieces[0] = &pieces;
          }
          const Result r = SubmitSync(*b, h.call);
          ASSERT_TRUE(r.status.ok()) << "call " << i << ": " << r.status;
          const ref::Comparison c = h.Check(Tol(op, dt));
          EXPECT_TRUE(c.ok) << "call " << i << " rel_error " << c.rel_error;
          ExpectTimingSane(r.timing);
          EXPECT_GT(r.timing.kernel_us, 0) << "call " << i;
        }
      }
    }
  }
  // A call with a kept output never takes a graph; after it, the graphs still replay right.
  HostCall h = MakeElementwise(Op::kGelu, DType::kFloat32, 3, 97, seed++);
  auto kept = b->Allocate(h.call.output_bytes);
  ASSERT_TRUE(kept.ok());
  OpCall to_kept = h.call;
  to_kept.output = (*kept)->data();
  to_kept.output_resident = true;
  ASSERT_TRUE(SubmitSync(*b, to_kept).status.ok());
  HostCall again = MakeElementwise(Op::kGelu, DType::kFloat32, 3, 97, seed++);
  ASSERT_TRUE(SubmitSync(*b, again.call).status.ok());
  EXPECT_TRUE(again.Check(Tol(Op::kGelu, DType::kFloat32)).ok);
}

TEST(CudaBackendStart, DeviceThatDoesNotExistIsInvalidArgument) {
  std::string why;
  if (!OneStreamBackend(&why)) GTEST_SKIP() << "no CUDA backend here: " << why;
  Factory f = LoadFactory(&why);
  ASSERT_NE(f, nullptr) << why;
  CudaBackendOptions o;
  o.device = 99;
  o.streams = 1;
  char err[512] = {0};
  int code = -1;
  EXPECT_EQ(f(&o, err, sizeof err, &code), nullptr);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kInvalidArgument)) << err;
  EXPECT_NE(std::string(err).find("does not exist"), std::string::npos) << err;
}

// Runs `body` in a child process (the "threadsafe" death-test style re-runs this binary for
// just this statement): a fresh CUDA context, with a one-stream backend of its own. The child
// exits with body's code (3: no backend there); the test wants 0 and `stderr_has` in what the
// child printed.
template <typename Body>
void ExpectInFreshProcess(Body body, const char* stderr_has) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::string reason;
        auto b = OneStreamBackend(&reason);
        std::_Exit(b ? body(*b) : 3);
      },
      testing::ExitedWithCode(0), stderr_has);
}

// A kernel that faults leaves the CUDA context unusable for the whole process: a child's.
TEST(CudaBackendBroken, StickyErrorMakesLaterCallsUnavailable) {
  if (std::string why; !OneStreamBackend(&why)) GTEST_SKIP() << "no CUDA backend here: " << why;
  ExpectInFreshProcess(
      [](Backend& b) {
        std::vector<float> out(1 << 20);
        OpCall bad;
        bad.op = Op::kGelu;
        bad.dtype = DType::kFloat32;
        bad.rows = 1;
        bad.cols = 1 << 20;
        bad.inputs[0] = reinterpret_cast<const void*>(uintptr_t{0x1000});  // unmapped
        bad.input_resident[0] = true;
        bad.output = out.data();
        bad.output_bytes = out.size() * 4;
        const Result first = SubmitSync(b, bad);
        if (first.status.ok()) return 4;
        HostCall h = MakeElementwise(Op::kGelu, DType::kFloat32, 1, 16, 1);
        const Result later = SubmitSync(b, h.call);
        std::fprintf(stderr, "first: %s\nlater: %s\n", first.status.ToString().c_str(),
                     later.status.ToString().c_str());
        return absl::IsUnavailable(later.status) ? 0 : 5;
      },
      "later: UNAVAILABLE");
}

// Buffers of 8 GiB, then of halves down to `smallest`, until none more can be had.
std::vector<std::unique_ptr<Buffer>> AllocateAllDeviceMemory(Backend& b, size_t smallest) {
  std::vector<std::unique_ptr<Buffer>> held;
  for (size_t piece = size_t{8} << 30; piece >= smallest; piece /= 2) {
    for (auto buf = b.Allocate(piece); buf.ok(); buf = b.Allocate(piece)) {
      held.push_back(*std::move(buf));
    }
  }
  return held;
}

// The pool keeps what it frees, so after a burst it can hold all free device memory; a
// kernel's first launch then loads its code (lazy loading), which needs device memory too.
// Every op's first launch in a fresh process must still work (in a child: a fresh context).
TEST(CudaBackendPoolFull, FirstLaunchesSucceedWhileThePoolHoldsAllFreeMemory) {
  if (std::string why; !OneStreamBackend(&why)) GTEST_SKIP() << "no CUDA backend here: " << why;
  ExpectInFreshProcess(
      [](Backend& b) {
        {
          const auto held = AllocateAllDeviceMemory(b, size_t{1} << 20);
          const BackendStats st = b.stats();
          std::fprintf(stderr, "held %zu blocks; device memory used %lld of %lld MiB\n",
                       held.size(), static_cast<long long>(st.device_memory_used >> 20),
                       static_cast<long long>(st.device_memory_total >> 20));
        }  // given back to the pool, which keeps it
        int failed = 0;
        uint64_t seed = 1;
        for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
          std::vector<HostCall> calls;
          calls.push_back(MakeElementwise(Op::kGelu, dt, 1, 1000, seed++));
          calls.push_back(MakeElementwise(Op::kSoftmax, dt, 3, 1000, seed++));
          calls.push_back(MakeElementwise(Op::kSoftmax, dt, 2, 300000, seed++));
          calls.push_back(MakeElementwise(Op::kRowSum, dt, 5, 4097, seed++));
          calls.push_back(MakeMatmul(dt, 65, 33, 129, true, MatmulImpl::kCublasLt, seed++));
          calls.push_back(MakeMatmul(dt, 70, 40, 30, false, MatmulImpl::kTiled, seed++));
          for (HostCall& h : calls) {
            const Result r = SubmitSync(b, h.call);
            const bool ok = r.status.ok() && h.Check(Tol(h.call.op, dt)).ok;
            if (!ok) ++failed;
            std::fprintf(stderr, "%s %s: %s\n", OpName(h.call.op), DTypeName(dt),
                         r.status.ok() ? (ok ? "ok" : "WRONG") : r.status.ToString().c_str());
          }
        }
        std::fprintf(stderr, "first launches failed: %d\n", failed);
        return failed == 0 ? 0 : 6;
      },
      "first launches failed: 0");
}

TEST(CudaBackendPoolFull, CallsOfUpTo1MiBRunWhileThePoolCannotAllocate) {
  if (std::string why; !OneStreamBackend(&why)) GTEST_SKIP() << "no CUDA backend here: " << why;
  ExpectInFreshProcess(
      [](Backend& b) {
        int wrong = 0;
        auto expect = [&](HostCall& h, bool want_ok, const char* what) {
          const Result r = SubmitSync(b, h.call);
          const bool ok = r.status.ok() && h.Check(Tol(h.call.op, h.call.dtype)).ok;
          const bool as_wanted = want_ok ? ok : absl::IsResourceExhausted(r.status);
          if (!as_wanted) ++wrong;
          std::fprintf(stderr, "%s: %s%s\n", what, r.status.ok() ? (ok ? "ok" : "WRONG") :
                       r.status.ToString().c_str(), as_wanted ? "" : "  <- not as expected");
        };
        HostCall gelu = MakeElementwise(Op::kGelu, DType::kFloat32, 1, 1000, 1);
        HostCall softmax = MakeElementwise(Op::kSoftmax, DType::kBFloat16, 3, 1000, 2);
        HostCall big = MakeElementwise(Op::kGelu, DType::kFloat32, 1, 1 << 20, 3);  // 8 MiB
        expect(gelu, true, "gelu 1x1000 before");  // loads the kernels' code first
        expect(softmax, true, "softmax 3x1000 before");
        auto held = AllocateAllDeviceMemory(b, 256);
        std::fprintf(stderr, "holding %zu blocks\n", held.size());
        gelu.Bind();
        softmax.Bind();
        expect(gelu, true, "gelu 1x1000 with the pool full");
        expect(softmax, true, "softmax 3x1000 with the pool full");
        expect(big, false, "gelu 1x1048576 with the pool full");
        held.clear();
        big.Bind();
        expect(big, true, "gelu 1x1048576 after");
        std::fprintf(stderr, "not as expected: %d\n", wrong);
        return wrong == 0 ? 0 : 6;
      },
      "not as expected: 0");
}

absl::Status WriteSync(Backend& b, Buffer* dst, const std::vector<uint8_t>& src) {
  std::promise<absl::Status> done;
  b.SubmitWrite(dst, 0, src.data(), src.size(), NowNs(),
                [&](absl::Status s, const OpTiming&) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

absl::Status ReadSync(Backend& b, const Buffer* src, std::vector<uint8_t>* dst) {
  std::promise<absl::Status> done;
  b.SubmitRead(src, 0, dst->data(), dst->size(), NowNs(),
               [&](absl::Status s, const OpTiming&) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

// Allocate and freeing a buffer run on gRPC threads, which must never wait for the GPU. In
// the child process every stream shares one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1),
// so a wait for anything on the pool stream would last until the worker's long kernel ends:
// both must instead return in a small part of that kernel's time while it runs, and the
// block freed and taken again meanwhile must hold what is written to it afterwards.
// Kept last in this file: the variable is set for the parent too, where it changes nothing
// once an earlier test has made the process's CUDA context (run alone, this test makes it
// and only creates a backend there to see whether to skip).
TEST(CudaBackendRpcThreads, AllocateAndFreeReturnWhileALongKernelRuns) {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);  // before the child's context exists
  if (std::string why; !OneStreamBackend(&why)) GTEST_SKIP() << "no CUDA backend here: " << why;
  ExpectInFreshProcess(
      [](Backend& b) {
        // An fp32 8192^3 matmul on the tiled kernel (CUDA-core FMAs): 1.1 TFLOP, over 16 ms
        // at the H200's fp32 peak. Operands resident, so the call is nearly all kernel.
        constexpr int64_t kN = 8192;
        constexpr size_t kBytes = size_t{kN} * kN * 4;
        constexpr size_t kPiece = size_t{64} << 20;
        auto a = b.Allocate(kBytes), bm = b.Allocate(kBytes), c = b.Allocate(kBytes);
        if (!a.ok() || !bm.ok() || !c.ok()) return 10;
        {
          const std::vector<uint8_t> zeros(kBytes, 0);
          if (!WriteSync(b, a->get(), zeros).ok() || !WriteSync(b, bm->get(), zeros).ok()) {
            return 11;
          }
        }
        OpCall call;
        call.op = Op::kMatmulRelu;
        call.dtype = DType::kFloat32;
        call.m = call.n = call.k = kN;
        call.matmul_impl = MatmulImpl::kTiled;
        call.inputs[0] = (*a)->data();
        call.inputs[1] = (*bm)->data();
        call.input_resident[0] = call.input_resident[1] = true;
        call.output = (*c)->data();
        call.output_resident = true;
        call.output_bytes = kBytes;
        const Result warm = SubmitSync(b, call);  // loads the kernel; its time is the yardstick
        if (!warm.status.ok()) {
          std::fprintf(stderr, "warm-up: %s\n", warm.status.ToString().c_str());
          return 12;
        }
        const double kernel_us = warm.timing.kernel_us;
        auto doomed = b.Allocate(kPiece);  // freed while the kernel runs
        if (!doomed.ok()) return 13;

        std::future<Result> running = SubmitAsync(b, call);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the kernel is queued
        const int64_t t0 = NowNs();
        doomed->reset();  // its free is queued on the pool stream, behind the kernel
        const int64_t t1 = NowNs();
        auto piece = b.Allocate(kPiece);  // the same block, after that free
        const int64_t t2 = NowNs();
        const bool in_flight = running.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
        const Result r = running.get();
        const double free_us = (t1 - t0) / 1e3, alloc_us = (t2 - t1) / 1e3;
        std::fprintf(stderr,
                     "kernel %.0f us (warm-up), %.0f us (this call); while it ran: free %.1f us, "
                     "Allocate %.1f us; the call was %s when both had returned\n",
                     kernel_us, r.timing.kernel_us, free_us, alloc_us,
                     in_flight ? "still running" : "done");
        if (!r.status.ok() || !piece.ok()) return 14;

        std::vector<uint8_t> pattern(kPiece), back(kPiece, 0);
        for (size_t i = 0; i < kPiece; ++i) pattern[i] = static_cast<uint8_t>(i * 7 % 251);
        if (!WriteSync(b, piece->get(), pattern).ok() || !ReadSync(b, piece->get(), &back).ok()) {
          return 15;
        }
        const bool intact = back == pattern;
        const bool quick = kernel_us > 10000 && in_flight && free_us < kernel_us / 4 &&
                           alloc_us < kernel_us / 4;
        std::fprintf(stderr, "reused block intact: %s; returned without waiting: %s\n",
                     intact ? "yes" : "NO", quick ? "yes" : "NO");
        return intact && quick ? 0 : 6;
      },
      "reused block intact: yes; returned without waiting: yes");
}

}  // namespace
}  // namespace fusebox
