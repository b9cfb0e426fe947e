// GPU tests of matmul+ReLU: the cuBLASLt path and our tiled kernel against the
// fp64 CPU reference (tests/reference.h) on fresh random inputs, every dtype,
// with and without bias, exact fp32 and TF32, shapes that are not multiples of
// any tile (1x1x1, 3x5x7, 65x33x129, ...), K = 0, misaligned pointers, NaN.
// Outputs are poisoned (0xFF bytes = NaN in every dtype) before each run, so an
// element the kernel never wrote fails the comparison.
// The cuBLASLt runner's algorithm choice (two picks, autotune) is checked for
// cache hits and for choosing one of its candidates.
// Cost: a few seconds, mostly the fp64 references of the 1000^3 and
// 64x4096x4096 shapes on the CPU.
// FUSEBOX_GPU_TEST_SMALL=1 (compute-sanitizer runs) leaves out the 1000^3 shape;
// every kernel path (wgmma, both mma.sync configurations, FFMA, gather) stays.
// FUSEBOX_MATMUL_TEST_IMPLS=LIST (comma-separated; default all) runs only those
// implementations: cublaslt, wgmma (our TMA + wgmma kernel), mma (our mma.sync
// kernel), ffma (our fp32 CUDA-core kernel); "tiled" = wgmma,mma,ffma. Runs of
// the others are skipped, so e.g. racecheck can run our kernels without ever
// launching a cuBLASLt kernel (which it cannot run), and wgmma apart
// from mma/ffma (a sanitizer failure in one cannot hide the other).
// Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tuning.h"
#include "tests/reference.h"

namespace fusebox::cuda {
namespace {

bool HaveGpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

bool SmallMode() {
  const char* e = std::getenv("FUSEBOX_GPU_TEST_SMALL");
  return e != nullptr && *e != '\0' && *e != '0';
}

// The kernels a run may launch (FUSEBOX_MATMUL_TEST_IMPLS).
enum Kernel : unsigned { kLtKernels = 1, kWgmmaKernel = 2, kMmaKernel = 4, kFfmaKernel = 8 };

unsigned EnabledKernels() {
  static const unsigned mask = [] {
    const char* e = std::getenv("FUSEBOX_MATMUL_TEST_IMPLS");
    if (e == nullptr || *e == '\0') return 15u;
    unsigned m = 0;
    std::string list(e);
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t end = list.find(',', pos);
      if (end == std::string::npos) end = list.size();
      const std::string item = list.substr(pos, end - pos);
      if (item == "all") m |= 15u;
      else if (item == "cublaslt") m |= kLtKernels;
      else if (item == "tiled") m |= kWgmmaKernel | kMmaKernel | kFfmaKernel;
      else if (item == "wgmma") m |= kWgmmaKernel;
      else if (item == "mma") m |= kMmaKernel;
      else if (item == "ffma") m |= kFfmaKernel;
      else if (!item.empty()) ADD_FAILURE() << "FUSEBOX_MATMUL_TEST_IMPLS: unknown item " << item;
      pos = end + 1;
    }
    return m;
  }();
  return mask;
}

bool LtEnabled() { return (EnabledKernels() & kLtKernels) != 0; }

#define SKIP_WITHOUT_CUBLASLT() \
  if (!LtEnabled()) GTEST_SKIP() << "cuBLASLt left out (FUSEBOX_MATMUL_TEST_IMPLS)"

// Device buffer with `slack` spare bytes in front, for misaligned views.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p_, bytes + 256), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  uint8_t* get(size_t offset = 0) const { return static_cast<uint8_t*>(p_) + offset; }

 private:
  void* p_ = nullptr;
};

// kTiled is the launcher's automatic choice (wgmma on large aligned 16-bit
// problems, else mma.sync); kTiledMma forces mma.sync.
enum class Impl { kCublasLt, kTiled, kTiledMma };
const char* ImplName(Impl i) {
  return i == Impl::kTiled ? "tiled" : i == Impl::kTiledMma ? "tiled-mma.sync" : "cublaslt";
}

// The kernel a run launches. Mirrors LaunchHalf's choice in matmul_tiled.cu
// (wgmma for 16-bit with K and N multiples of 8, A and B 16-byte aligned, the
// output 4-byte aligned and at least 132 tiles of 128x256); only used to
// select runs, so a mismatch would mix the sanitizer logs, not fail a test.
Kernel KernelOf(Impl impl, DType dt, int64_t m, int64_t n, int64_t k, size_t misalign) {
  if (impl == Impl::kCublasLt) return kLtKernels;
  if (dt == DType::kFloat32) return kFfmaKernel;
  if (impl == Impl::kTiledMma) return kMmaKernel;
  const bool vec = k % 8 == 0 && n % 8 == 0 && misalign % 16 == 0;
  const bool big = ((m + 127) / 128) * ((n + 255) / 256) >= 132;
  return vec && big ? kWgmmaKernel : kMmaKernel;
}

// Runs per kernel family, printed at the end ("matmul runs: ..."), so that a
// sanitizer log shows what it actually covered.
std::atomic<int> g_runs[4];

int KernelIndex(Kernel k) {
  return k == kLtKernels ? 0 : k == kWgmmaKernel ? 1 : k == kMmaKernel ? 2 : 3;
}

class RunCountPrinter : public testing::Environment {
 public:
  void TearDown() override {
    const char* impls = std::getenv("FUSEBOX_MATMUL_TEST_IMPLS");
    std::printf("matmul runs: cublaslt %d, wgmma %d, mma.sync %d, ffma %d "
                "(FUSEBOX_MATMUL_TEST_IMPLS=%s)\n",
                g_runs[0].load(), g_runs[1].load(), g_runs[2].load(), g_runs[3].load(),
                impls ? impls : "all");
  }
};
testing::Environment* const g_run_count_printer =
    testing::AddGlobalTestEnvironment(new RunCountPrinter);

double Tolerance(DType dt, bool tf32) {
  switch (dt) {
    case DType::kFloat32: return tf32 ? 2e-3 : 1e-5;
    case DType::kFloat16: return 2e-3;
    default: return 1e-2;
  }
}

struct Problem {
  DType dt;
  int64_t m, n, k;
  bool bias;
  std::vector<uint8_t> a, b, c;  // host inputs (c = bias)
  std::vector<double> ref;
};

Problem MakeProblem(DType dt, int64_t m, int64_t n, int64_t k, bool bias, uint64_t seed,
                    bool nan_in_a = false) {
  Problem p{dt, m, n, k, bias, {}, {}, {}, {}};
  p.a = ref::RandomTensor(dt, m * k, -1.f, 1.f, seed);
  p.b = ref::RandomTensor(dt, k * n, -1.f, 1.f, seed + 1);
  if (bias) p.c = ref::RandomTensor(dt, n, -1.f, 1.f, seed + 2);
  if (nan_in_a && m * k > 0) {  // first and last element: rows 0 and m-1 become NaN
    StoreFromFloat(dt, p.a.data(), 0, std::nanf(""));
    StoreFromFloat(dt, p.a.data(), m * k - 1, std::nanf(""));
  }
  p.ref = ref::MatmulRelu(dt, p.a.data(), p.b.data(), bias ? p.c.data() : nullptr, m, n, k);
  return p;
}

// Runs one implementation on the problem; `misalign` shifts every device
// pointer by that many bytes (a multiple of the element size).
absl::Status RunOnGpu(const Problem& p, Impl impl, bool tf32, std::vector<uint8_t>* out,
                      size_t misalign = 0, CublasLtMatmul* lt = nullptr) {
  ++g_runs[KernelIndex(KernelOf(impl, p.dt, p.m, p.n, p.k, misalign))];
  const size_t es = ElementSize(p.dt);
  DeviceBuffer da(p.a.size()), db(p.b.size()), dc(p.c.size() + es), dout(p.m * p.n * es);
  EXPECT_EQ(cudaMemcpy(da.get(misalign), p.a.data(), p.a.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(db.get(misalign), p.b.data(), p.b.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  if (p.bias) {
    EXPECT_EQ(cudaMemcpy(dc.get(misalign), p.c.data(), p.c.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  MatmulArgs args;
  args.dtype = p.dt;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = da.get(misalign);
  args.b = db.get(misalign);
  args.bias = p.bias ? dc.get(misalign) : nullptr;
  args.out = dout.get(misalign);
  args.allow_tf32 = tf32;
  std::unique_ptr<CublasLtMatmul> own;
  if (impl == Impl::kCublasLt) {
    if (lt == nullptr) {
      auto created = CublasLtMatmul::Create(NewMatmulAlgoCache());
      if (!created.ok()) return created.status();
      own = std::move(*created);
      lt = own.get();
    }
    // Choose the algorithm before poisoning: a timing of the two picks writes
    // the output, and an element the chosen kernel skips must stay poisoned.
    if (absl::Status s = lt->Prepare(args, nullptr); !s.ok()) return s;
  }
  EXPECT_EQ(cudaMemset(dout.get(misalign), 0xFF, p.m * p.n * es), cudaSuccess);  // poison
  absl::Status s;
  if (impl != Impl::kCublasLt) {
    s = CudaStatus(LaunchMatmulReluTiledWith(
                       impl == Impl::kTiled ? TiledKernel::kAuto : TiledKernel::kMmaSync, args,
                       nullptr),
                   "tiled");
  } else {
    s = lt->Run(args, nullptr);
  }
  if (!s.ok()) return s;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaStatus(e, "sync");
  out->assign(p.m * p.n * es, 0);
  EXPECT_EQ(cudaMemcpy(out->data(), dout.get(misalign), out->size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return absl::OkStatus();
}

bool Enabled(const Problem& p, Impl impl, size_t misalign) {
  return (EnabledKernels() & KernelOf(impl, p.dt, p.m, p.n, p.k, misalign)) != 0;
}

void ExpectMatches(const Problem& p, Impl impl, bool tf32, size_t misalign = 0) {
  if (!Enabled(p, impl, misalign)) return;
  SCOPED_TRACE(testing::Message() << ImplName(impl) << " " << DTypeName(p.dt) << (tf32 ? " tf32" : "")
                                  << " " << p.m << "x" << p.n << "x" << p.k
                                  << (p.bias ? " bias" : "") << " misalign " << misalign);
  std::vector<uint8_t> out;
  absl::Status s = RunOnGpu(p, impl, tf32, &out, misalign);
  ASSERT_TRUE(s.ok()) << s;
  const ref::Comparison c = ref::Compare(p.dt, out.data(), p.ref, Tolerance(p.dt, tf32));
  EXPECT_TRUE(c.ok) << "rel_error " << c.rel_error << " first_bad " << c.first_bad;
}

struct Shape {
  int64_t m, n, k;
};

// Odd shapes (partial tiles, N or K not a multiple of 8 -> the gather path),
// tile multiples, a GEMV-like row, both tile configurations of the mma.sync
// kernel (>= 132 tiles of 128x256 selects the large one), and the wgmma
// kernel (large + aligned) with full and with partial tiles in M, N and K.
const Shape kShapes[] = {{1, 1, 1},        {3, 5, 7},          {65, 33, 129},
                         {128, 256, 64},   {257, 130, 96},     {256, 264, 80},
                         {1, 4096, 512},   {300, 2000, 40},    {1536, 2816, 64},
                         {1537, 2817, 65}, {1000, 4104, 136},  {1000, 1000, 1000}};

class MatmulTest : public testing::TestWithParam<DType> {};

TEST_P(MatmulTest, AllShapesBothImplsMatchReference) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // The fp64 references are the slow part: build them on all cores at once.
  std::vector<std::future<Problem>> problems;
  uint64_t seed = 1000 + static_cast<uint64_t>(dt) * 100;
  for (const Shape& s : kShapes) {
    if (SmallMode() && s.m * s.n * s.k >= 1000000000) continue;
    for (bool bias : {false, true}) {
      if (s.m * s.n * s.k >= 1000000000 && !bias) continue;  // keep the CPU reference short
      seed += 7;
      problems.push_back(std::async(std::launch::async, [=] {
        return MakeProblem(dt, s.m, s.n, s.k, bias, seed);
      }));
    }
  }
  for (auto& f : problems) {
    const Problem p = f.get();
    ExpectMatches(p, Impl::kCublasLt, false);
    ExpectMatches(p, Impl::kTiled, false);
    if (dt == DType::kFloat32) {
      ExpectMatches(p, Impl::kCublasLt, true);
      ExpectMatches(p, Impl::kTiled, true);  // ignores tf32: exact
    } else {
      ExpectMatches(p, Impl::kTiledMma, false);
    }
  }
}

TEST_P(MatmulTest, ZeroKGivesReluOfBias) {
  SKIP_WITHOUT_GPU();
  const Problem p = MakeProblem(GetParam(), 5, 7, 0, true, 77);
  ExpectMatches(p, Impl::kCublasLt, false);
  ExpectMatches(p, Impl::kTiled, false);
}

TEST_P(MatmulTest, MisalignedPointers) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Problem p = MakeProblem(dt, 70, 72, 88, true, 99);
  // One element off: never 16-byte aligned, so the tiled kernel gathers.
  ExpectMatches(p, Impl::kTiled, false, ElementSize(dt));
  // cuBLASLt either handles the alignment or says it cannot.
  if (!LtEnabled()) return;
  std::vector<uint8_t> out;
  absl::Status s = RunOnGpu(p, Impl::kCublasLt, false, &out, ElementSize(dt));
  if (s.ok()) {
    EXPECT_TRUE(ref::Compare(dt, out.data(), p.ref, Tolerance(dt, false)).ok);
  } else {
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  }
}

TEST_P(MatmulTest, NanInputPropagatesThroughRelu) {
  SKIP_WITHOUT_GPU();
  const Problem p = MakeProblem(GetParam(), 65, 40, 48, true, 5, /*nan_in_a=*/true);
  ASSERT_TRUE(std::isnan(p.ref[0]));
  ExpectMatches(p, Impl::kTiled, false);
  ExpectMatches(p, Impl::kCublasLt, false);
  if (GetParam() != DType::kFloat32) {  // the wgmma kernel
    const Problem q = MakeProblem(GetParam(), 1000, 4104, 136, true, 6, /*nan_in_a=*/true);
    ExpectMatches(q, Impl::kTiled, false);
  }
}

TEST_P(MatmulTest, FreshInputsEachRunGiveFreshResults) {
  SKIP_WITHOUT_GPU();
  // Same shape, new data: a stale cache or unwritten output would show here.
  for (uint64_t seed : {11, 12}) {
    const Problem p = MakeProblem(GetParam(), 200, 136, 72, false, seed);
    ExpectMatches(p, Impl::kCublasLt, false);
    ExpectMatches(p, Impl::kTiled, false);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatmulTest,
                         testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

TEST(MatmulCache, RunnersOnManyThreadsShareOneCache) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUBLASLT();
  auto cache = NewMatmulAlgoCache();
  const Problem p = MakeProblem(DType::kBFloat16, 96, 80, 64, true, 3);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto lt = CublasLtMatmul::Create(cache);
      if (!lt.ok()) return;
      for (int i = 0; i < 5; ++i) {
        std::vector<uint8_t> out;
        if (!RunOnGpu(p, Impl::kCublasLt, false, &out, 0, lt->get()).ok()) return;
        if (!ref::Compare(p.dt, out.data(), p.ref, 1e-2).ok) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
}

// Device copies of a problem's inputs and an output, 256-byte aligned.
struct DeviceProblem {
  explicit DeviceProblem(const Problem& p)
      : a(p.a.size()), b(p.b.size()), c(p.c.size()), out(p.m * p.n * ElementSize(p.dt)) {
    EXPECT_EQ(cudaMemcpy(a.get(), p.a.data(), p.a.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(b.get(), p.b.data(), p.b.size(), cudaMemcpyHostToDevice), cudaSuccess);
    if (p.bias) {
      EXPECT_EQ(cudaMemcpy(c.get(), p.c.data(), p.c.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    args.dtype = p.dt;
    args.m = p.m;
    args.n = p.n;
    args.k = p.k;
    args.a = a.get();
    args.b = b.get();
    args.bias = p.bias ? c.get() : nullptr;
    args.out = out.get();
  }
  DeviceBuffer a, b, c, out;
  MatmulArgs args;
};

// Runs `lt` into a poisoned output and compares with the reference.
void ExpectRunMatches(CublasLtMatmul& lt, const Problem& p, const DeviceProblem& d, bool tf32) {
  MatmulArgs args = d.args;
  args.allow_tf32 = tf32;
  const size_t bytes = p.m * p.n * ElementSize(p.dt);
  ASSERT_EQ(cudaMemset(d.out.get(), 0xFF, bytes), cudaSuccess);
  absl::Status s = lt.Run(args, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> out(bytes);
  ASSERT_EQ(cudaMemcpy(out.data(), d.out.get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  const ref::Comparison c = ref::Compare(p.dt, out.data(), p.ref, Tolerance(p.dt, tf32));
  EXPECT_TRUE(c.ok) << "rel_error " << c.rel_error << " first_bad " << c.first_bad;
}

// A Run right after its Prepare launches what the Prepare chose, even when another runner
// on the same cache filled it past its bound (4096 keys: it is then cleared) in between:
// the server prepares before its kernel gate and runs behind it, where choosing again
// would time candidates on a held stream.
TEST(MatmulCache, RunAfterPrepareNeverChoosesAgainWhenAnotherRunnerClearsTheCache) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUBLASLT();
  auto cache = NewMatmulAlgoCache();
  auto a = CublasLtMatmul::Create(cache);
  auto b = CublasLtMatmul::Create(cache);
  ASSERT_TRUE(a.ok() && b.ok());
  const Problem p = MakeProblem(DType::kBFloat16, 96, 80, 64, true, 7);
  const DeviceProblem d(p);
  ASSERT_TRUE((*a)->Prepare(d.args, nullptr).ok());
  const LtStats prepared = StatsOf(**a);
  EXPECT_EQ(prepared.cache_misses, 1);
  // 4100 other keys through runner b: at least one clear after a's key went in.
  constexpr int64_t kKeys = 4100, kN = 8, kK = 8;
  DeviceBuffer da(kKeys * kK * 2), db(kK * kN * 2), dout(kKeys * kN * 2);
  for (int64_t m = 1; m <= kKeys; ++m) {
    MatmulArgs args;
    args.dtype = DType::kBFloat16;
    args.m = m;
    args.n = kN;
    args.k = kK;
    args.a = da.get();
    args.b = db.get();
    args.out = dout.get();
    ASSERT_TRUE((*b)->Prepare(args, nullptr).ok()) << m;
  }
  EXPECT_EQ(StatsOf(**b).cache_misses, kKeys);
  ExpectRunMatches(**a, p, d, false);
  const LtStats ran = StatsOf(**a);
  EXPECT_EQ(ran.cache_misses, prepared.cache_misses);
  EXPECT_EQ(ran.heuristic_queries, prepared.heuristic_queries);
  EXPECT_EQ(ran.timed_selections, prepared.timed_selections);
}

// The default policy (two picks) on shapes where the 32 MiB and the 1 MiB
// first picks differ on the H200 (fp32 and tf32 64x4096x4096) and on a bf16
// one where they agree: the first Run of a key chooses (timing only if
// the picks differ) and is correct whichever pick won; later calls of the key,
// from this runner or another sharing the cache, run no heuristic and no
// timing; the choice is one of the two first picks, as first-pick runners with
// 32 MiB and 1 MiB report them.
TEST(MatmulAlgoChoice, TwoPicksChoosesOnceAndPicksOneOfThem) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUBLASLT();
  auto cache = NewMatmulAlgoCache();
  auto lt = CublasLtMatmul::Create(cache);
  auto lt2 = CublasLtMatmul::Create(cache);
  auto first_large = CublasLtMatmul::Create(NewMatmulAlgoCache(), kLtLargeWorkspaceBytes,
                                            LtAlgoPolicy::kFirstPick);
  auto first_small = CublasLtMatmul::Create(NewMatmulAlgoCache(), kLtTorchWorkspaceBytes,
                                            LtAlgoPolicy::kFirstPick);
  ASSERT_TRUE(lt.ok() && lt2.ok() && first_large.ok() && first_small.ok());
  ASSERT_EQ(PolicyOf(**lt), LtAlgoPolicy::kTwoPicks);
  struct Case {
    DType dt;
    int64_t m, n, k;
    std::vector<bool> tf32;
  };
  const Case cases[] = {{DType::kFloat32, 64, 4096, 4096, {false, true}},
                        {DType::kBFloat16, 256, 512, 128, {false}}};
  for (const Case& cs : cases) {
    const Problem p = MakeProblem(cs.dt, cs.m, cs.n, cs.k, true, 4242);
    const DeviceProblem d(p);
    for (bool tf32 : cs.tf32) {
      SCOPED_TRACE(testing::Message() << DTypeName(cs.dt) << (tf32 ? " tf32 " : " ") << cs.m
                                      << "x" << cs.n << "x" << cs.k);
      MatmulArgs args = d.args;
      args.allow_tf32 = tf32;
      const LtStats s0 = StatsOf(**lt);
      ExpectRunMatches(**lt, p, d, tf32);  // the miss: chooses, then launches
      const LtStats s1 = StatsOf(**lt);
      EXPECT_EQ(s1.cache_misses, s0.cache_misses + 1);
      EXPECT_GE(s1.heuristic_queries, s0.heuristic_queries + 1);
      EXPECT_LE(s1.heuristic_queries, s0.heuristic_queries + 2);
      ExpectRunMatches(**lt, p, d, tf32);  // the hit
      auto info = AlgoInfoOf(**lt, args, nullptr);
      ASSERT_TRUE(info.ok()) << info.status();
      const LtStats s2 = StatsOf(**lt);
      EXPECT_EQ(s2.cache_misses, s1.cache_misses);
      EXPECT_EQ(s2.cache_hits, s1.cache_hits + 2);
      EXPECT_EQ(s2.heuristic_queries, s1.heuristic_queries);
      EXPECT_EQ(s2.timed_selections, s1.timed_selections);
      // Another worker's runner on the same cache: a hit on its first call.
      ASSERT_TRUE((*lt2)->Prepare(args, nullptr).ok());
      EXPECT_EQ(StatsOf(**lt2).heuristic_queries, 0);
      EXPECT_EQ(StatsOf(**lt2).timed_selections, 0);

      auto large = AlgoInfoOf(**first_large, args, nullptr);
      auto small = AlgoInfoOf(**first_small, args, nullptr);
      ASSERT_TRUE(large.ok() && small.ok());
      EXPECT_EQ(large->choice, LtAlgoChoice::kFirstPick);
      EXPECT_EQ(info->large_hash, large->hash);
      EXPECT_EQ(info->small_hash, small->hash);
      EXPECT_TRUE(info->hash == large->hash || info->hash == small->hash) << info->description;
      if (large->hash == small->hash) {
        EXPECT_EQ(info->choice, LtAlgoChoice::kPicksAgree) << info->description;
        EXPECT_FALSE(info->timed);
        EXPECT_EQ(s1.timed_selections, s0.timed_selections);
        EXPECT_EQ(info->launch_workspace, CublasLtMatmul::kDefaultWorkspaceBytes);
      } else {
        // A healthy GPU never fails the timing.
        EXPECT_TRUE(info->choice == LtAlgoChoice::kTimedLargeKept ||
                    info->choice == LtAlgoChoice::kTimedSmallWon)
            << info->description;
        EXPECT_TRUE(info->timed);
        EXPECT_EQ(s1.timed_selections, s0.timed_selections + 1);
        EXPECT_GT(info->large_ms, 0.f);
        EXPECT_GT(info->small_ms, 0.f);
        const bool small_won = info->choice == LtAlgoChoice::kTimedSmallWon;
        EXPECT_EQ(info->hash, small_won ? small->hash : large->hash);
        EXPECT_EQ(small_won, info->small_ms <= 0.98f * info->large_ms) << info->description;
        EXPECT_EQ(info->launch_workspace, small_won ? CublasLtMatmul::kSecondPickWorkspaceBytes
                                                    : CublasLtMatmul::kDefaultWorkspaceBytes);
      }
      std::printf("two picks, %s%s %lldx%lldx%lld bias: %s\n", DTypeName(cs.dt),
                  tf32 ? " tf32" : "", static_cast<long long>(cs.m),
                  static_cast<long long>(cs.n), static_cast<long long>(cs.k),
                  info->description.c_str());
    }
  }
}

// kAutotune times its 8 candidates where it applies (>= 8 GFLOP) and nothing
// else does: a smaller problem gets the two picks; a first-pick runner never
// times. Runners of different policies share the cache without seeing each
// other's entries.
TEST(MatmulAlgoChoice, AutotuneReplacesTwoPicksWhereItApplies) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUBLASLT();
  auto cache = NewMatmulAlgoCache();
  auto tuned = CublasLtMatmul::Create(cache, CublasLtMatmul::kDefaultWorkspaceBytes,
                                      LtAlgoPolicy::kAutotune);
  auto first = CublasLtMatmul::Create(cache, CublasLtMatmul::kDefaultWorkspaceBytes,
                                      LtAlgoPolicy::kFirstPick);
  ASSERT_TRUE(tuned.ok() && first.ok());
  const int64_t big = 2048;  // 17 GFLOP
  DeviceBuffer a(big * big * 2), b(big * big * 2), out(big * big * 2);
  ASSERT_EQ(cudaMemset(a.get(), 0, big * big * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(b.get(), 0, big * big * 2), cudaSuccess);
  MatmulArgs args;
  args.dtype = DType::kBFloat16;
  args.m = args.n = args.k = big;
  args.a = a.get();
  args.b = b.get();
  args.out = out.get();
  auto info = AlgoInfoOf(**tuned, args, nullptr);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->choice, LtAlgoChoice::kAutotuned) << info->description;
  EXPECT_TRUE(info->timed);
  EXPECT_EQ(StatsOf(**tuned).timed_selections, 1);
  auto plain = AlgoInfoOf(**first, args, nullptr);  // same key but the policy: its own entry
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->choice, LtAlgoChoice::kFirstPick);
  EXPECT_EQ(StatsOf(**first).cache_misses, 1);
  EXPECT_EQ(StatsOf(**first).timed_selections, 0);
  args.m = 64;  // 64x2048x2048: 0.5 GFLOP, below the autotune threshold
  auto small = AlgoInfoOf(**tuned, args, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_NE(small->choice, LtAlgoChoice::kAutotuned) << small->description;
  EXPECT_NE(small->choice, LtAlgoChoice::kFirstPick) << small->description;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(MatmulTestConfig, ImplsListIsValid) {
  // Fails (ADD_FAILURE in EnabledKernels) on an unknown FUSEBOX_MATMUL_TEST_IMPLS item.
  EXPECT_NE(EnabledKernels(), 0u) << "FUSEBOX_MATMUL_TEST_IMPLS selects nothing";
}

TEST(MatmulValidation, RejectsBadShapes) {
  MatmulArgs a;
  a.m = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateMatmul(a)));
  a.m = int64_t{1} << 31;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateMatmul(a)));
  a = MatmulArgs{};
  a.m = a.n = a.k = 4;  // null pointers
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateMatmul(a)));
  a = MatmulArgs{};
  EXPECT_TRUE(ValidateMatmul(a).ok());  // empty is fine
}

}  // namespace
}  // namespace fusebox::cuda
