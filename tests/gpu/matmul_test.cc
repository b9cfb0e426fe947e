// GPU tests of matmul+ReLU: the cuBLASLt path and our tiled kernel against the
// fp64 CPU reference (tests/reference.h) on fresh random inputs, every dtype,
// with and without bias, exact fp32 and TF32, shapes that are not multiples of
// any tile (1x1x1, 3x5x7, 65x33x129, ...), K = 0, misaligned pointers, NaN.
// Outputs are poisoned (0xFF bytes = NaN in every dtype) before each run, so an
// element the kernel never wrote fails the comparison.
// Cost: a few seconds, mostly the fp64 reference of the 1000^3 shapes on the CPU.
// FUSEBOX_GPU_TEST_SMALL=1 (compute-sanitizer runs) leaves out the 1000^3 shape;
// every kernel path (wgmma, both mma.sync configurations, FFMA, gather) stays.
// Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/matmul.h"
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
  EXPECT_EQ(cudaMemset(dout.get(misalign), 0xFF, p.m * p.n * es), cudaSuccess);  // poison
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
  absl::Status s;
  if (impl != Impl::kCublasLt) {
    s = CudaStatus(LaunchMatmulReluTiled(args, nullptr,
                                         impl == Impl::kTiled ? TiledKernel::kAuto
                                                              : TiledKernel::kMmaSync),
                   "tiled");
  } else {
    std::unique_ptr<CublasLtMatmul> own;
    if (lt == nullptr) {
      auto created = CublasLtMatmul::Create(NewMatmulAlgoCache());
      if (!created.ok()) return created.status();
      own = std::move(*created);
      lt = own.get();
    }
    s = lt->Run(args, nullptr);
  }
  if (!s.ok()) return s;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaStatus(e, "sync");
  out->assign(p.m * p.n * es, 0);
  EXPECT_EQ(cudaMemcpy(out->data(), dout.get(misalign), out->size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return absl::OkStatus();
}

void ExpectMatches(const Problem& p, Impl impl, bool tf32, size_t misalign = 0) {
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
