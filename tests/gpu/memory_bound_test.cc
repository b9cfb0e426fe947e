// GPU tests of the memory-bound kernels (kernels/cuda/launch.h): GeLU, softmax and row sum for
// float32, float16 and bfloat16 against the fp64 oracle (tests/reference.h) on fresh random
// inputs (the seed is printed on failure). Covers every kernel path: short rows, block per row (the
// register-only kernel for rows of 513-2048 accesses and the general one), clusters, rows split
// over blocks meeting in a workspace (given garbage, as a pool would), shared-memory staging, the
// streamed remainder of very long rows, the scalar path for unaligned rows and pointers, special
// values (-inf, +inf, NaN, huge), more than 2^31 elements, and every variant the benchmark times.
// Each output buffer is poisoned (0xFF = NaN) before the launch, and the bytes around it and the
// input must be unchanged afterwards.
// Without a GPU every test is skipped. FUSEBOX_GPU_TEST_SMALL=1 leaves out the largest shapes
// (for compute-sanitizer runs).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpu/memory_bound_variants.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"
#include "tests/gpu/test_util.h"
#include "tests/reference.h"

namespace fusebox {
namespace {

using cuda::KernelChoice;

int GpuCount() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
}

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (GpuCount() == 0)                                                                     \
      GTEST_SKIP() << "no CUDA device on this host: GPU kernel tests skipped (they run on the " \
                      "device machine, bench/gpu/run_device.sh)";                             \
  } while (0)

bool SmallMode() {
  const char* e = std::getenv("FUSEBOX_GPU_TEST_SMALL");
  return e != nullptr && *e != '\0' && *e != '0';
}

uint64_t FreshSeed() {
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

constexpr size_t kGuard = 256;  // poisoned bytes before and after each output; keeps 256-B alignment

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { status_ = cudaMalloc(&p_, bytes ? bytes : 1); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  size_t bytes() const { return bytes_; }
  cudaError_t status() const { return status_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
  cudaError_t status_;
};

using Launch = std::function<cudaError_t(const void* in, void* out)>;

// Places `in` at byte offset kGuard + in_off of a device buffer, poisons an output buffer of
// kGuard + out_off + out_bytes + kGuard bytes, launches, synchronises, and checks that the launch
// succeeded, that only [kGuard + out_off, + out_bytes) of the output buffer changed and that the
// input is unchanged. Returns the output bytes in *out.
::testing::AssertionResult RunOp(const std::vector<uint8_t>& in, size_t in_off, size_t out_bytes,
                                 size_t out_off, const Launch& launch, std::vector<uint8_t>* out) {
  DeviceBuffer din(kGuard + in_off + in.size() + kGuard);
  DeviceBuffer dout(kGuard + out_off + out_bytes + kGuard);
  if (din.status() != cudaSuccess || dout.status() != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMalloc failed";
  }
  uint8_t* pin = din.get() + kGuard + in_off;
  uint8_t* pout = dout.get() + kGuard + out_off;
  if (cudaMemcpy(pin, in.data(), in.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemset(dout.get(), 0xFF, dout.bytes()) != cudaSuccess) {
    return ::testing::AssertionFailure() << "copy-in failed";
  }
  cudaError_t e = launch(pin, pout);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "launch: " << cudaGetErrorString(e);
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel: " << cudaGetErrorString(e);
  std::vector<uint8_t> all(dout.bytes());
  std::vector<uint8_t> in_back(in.size());
  if (cudaMemcpy(all.data(), dout.get(), all.size(), cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(in_back.data(), pin, in.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return ::testing::AssertionFailure() << "copy-out failed";
  }
  const size_t lo = kGuard + out_off, hi = lo + out_bytes;
  for (size_t i = 0; i < all.size(); ++i) {
    if ((i < lo || i >= hi) && all[i] != 0xFF) {
      return ::testing::AssertionFailure() << "byte " << static_cast<int64_t>(i) - static_cast<int64_t>(lo)
                                           << " relative to the output was written";
    }
  }
  if (in_back != in) return ::testing::AssertionFailure() << "the input was modified";
  out->assign(all.begin() + lo, all.begin() + hi);
  return ::testing::AssertionSuccess();
}

float Big(DType dt) { return dt == DType::kFloat16 ? 6.0e4f : 1.0e30f; }
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string Where(DType dt, int64_t rows, int64_t cols, size_t in_off, size_t out_off, uint64_t seed,
                  const std::string& extra = "") {
  return std::string(DTypeName(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " in+" +
         std::to_string(in_off) + "B out+" + std::to_string(out_off) + "B seed=" + std::to_string(seed) + " " +
         extra;
}

struct Offsets {
  size_t in_elems, out_elems;
};

class MemoryBound : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { REQUIRE_GPU(); }

  void CheckGelu(int64_t n, Offsets off, bool specials, const KernelChoice& k = KernelChoice{}) {
    const DType dt = GetParam();
    const size_t es = ElementSize(dt);
    const uint64_t seed = FreshSeed();
    // Tiny tensors: inputs where GeLU is well above the underflow of the output type (a single
    // element near -7 has a true value ~1e-15: 0 in float16, and the fp64 tanh form itself
    // loses its relative precision there).
    const float range = n < 64 ? 3.f : 8.f;
    std::vector<uint8_t> in = ref::RandomTensor(dt, n, -range, range, seed);
    if (specials && n >= 8) {
      const float v[] = {kNaN, kInf, -kInf, Big(dt), -Big(dt), 0.f, -0.f, 1e-30f};
      for (int i = 0; i < 8; ++i) StoreFromFloat(dt, in.data(), static_cast<size_t>(i * (n / 8)), v[i]);
    }
    const std::vector<double> want = ref::Gelu(dt, in.data(), n);
    std::vector<uint8_t> out;
    const std::string where = Where(dt, 1, n, off.in_elems * es, off.out_elems * es, seed, "gelu");
    ASSERT_TRUE(RunOp(in, off.in_elems * es, n * es, off.out_elems * es,
                      [&](const void* i, void* o) { return cuda::LaunchGeluWith(k, dt, i, o, n, nullptr); }, &out))
        << where;
    const ref::Comparison c = ref::Compare(dt, out.data(), want, ref::DefaultTolerance(dt));
    EXPECT_TRUE(c.ok) << where << " rel_error=" << c.rel_error << " first_bad=" << c.first_bad;
  }

  void CheckSoftmax(int64_t rows, int64_t cols, Offsets off, const KernelChoice& k,
                    const std::function<void(std::vector<uint8_t>&)>& edit = nullptr, bool workspace = true) {
    const DType dt = GetParam();
    const size_t es = ElementSize(dt);
    const uint64_t seed = FreshSeed();
    std::vector<uint8_t> in = ref::RandomTensor(dt, rows * cols, -10.f, 10.f, seed);
    if (edit) edit(in);
    const std::vector<double> want = ref::Softmax(dt, in.data(), rows, cols);
    std::vector<uint8_t> out;
    // The workspace the choice asks for, full of garbage (the launcher must set what it relies on).
    const size_t ws_bytes = workspace ? cuda::SoftmaxWorkspaceBytesWith(k, dt, rows, cols) : 0;
    DeviceBuffer ws(ws_bytes);
    ASSERT_EQ(ws.status(), cudaSuccess);
    ASSERT_EQ(cudaMemset(ws.get(), 0x5A, ws_bytes), cudaSuccess);
    char desc[128];
    cuda::DescribeSoftmax(dt, reinterpret_cast<const void*>(kGuard + off.in_elems * es),
                          reinterpret_cast<const void*>(kGuard + off.out_elems * es), rows, cols, k, desc,
                          sizeof desc, ws_bytes);
    if (!workspace) std::strncat(desc, " (no workspace)", sizeof desc - std::strlen(desc) - 1);
    const std::string where = Where(dt, rows, cols, off.in_elems * es, off.out_elems * es, seed, desc);
    ASSERT_TRUE(RunOp(in, off.in_elems * es, rows * cols * es, off.out_elems * es,
                      [&](const void* i, void* o) {
                        return cuda::LaunchSoftmaxWith(k, dt, i, o, rows, cols, nullptr, {ws.get(), ws_bytes});
                      },
                      &out))
        << where;
    const double tol = ref::DefaultTolerance(dt);
    const ref::Comparison c = ref::Compare(dt, out.data(), want, tol);
    EXPECT_TRUE(c.ok) << where << " rel_error=" << c.rel_error << " tol=" << tol << " first_bad=" << c.first_bad;
  }

  void CheckRowSum(int64_t rows, int64_t cols, Offsets off, const KernelChoice& k, float lo = -1.f,
                   float hi = 1.f, const std::function<void(std::vector<uint8_t>&)>& edit = nullptr,
                   bool workspace = true) {
    const DType dt = GetParam();
    const size_t es = ElementSize(dt);
    const uint64_t seed = FreshSeed();
    std::vector<uint8_t> in = ref::RandomTensor(dt, rows * cols, lo, hi, seed);
    if (edit) edit(in);
    const std::vector<double> want = ref::RowSum(dt, in.data(), rows, cols);
    std::vector<uint8_t> out;
    // The workspace the choice asks for, full of garbage (the launcher needs nothing set in it).
    const size_t ws_bytes = workspace ? cuda::RowSumWorkspaceBytesWith(k, dt, rows, cols) : 0;
    DeviceBuffer ws(ws_bytes);
    ASSERT_EQ(ws.status(), cudaSuccess);
    ASSERT_EQ(cudaMemset(ws.get(), 0x5A, ws_bytes), cudaSuccess);
    char desc[128];
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard + off.in_elems * es), rows, cols, k, desc,
                         sizeof desc, ws_bytes);
    if (!workspace) std::strncat(desc, " (no workspace)", sizeof desc - std::strlen(desc) - 1);
    const std::string where = Where(dt, rows, cols, off.in_elems * es, off.out_elems * 4, seed, desc);
    ASSERT_TRUE(RunOp(in, off.in_elems * es, rows * sizeof(float), off.out_elems * sizeof(float),
                      [&](const void* i, void* o) {
                        return cuda::LaunchRowSumWith(k, dt, i, static_cast<float*>(o), rows, cols, nullptr,
                                                      {ws.get(), ws_bytes});
                      },
                      &out))
        << where;
    const double tol = ref::RowSumTolerance(dt, in.data(), rows, cols, want);
    const ref::Comparison c = ref::Compare(DType::kFloat32, out.data(), want, tol);
    EXPECT_TRUE(c.ok) << where << " rel_error=" << c.rel_error << " tol=" << tol << " first_bad=" << c.first_bad;
  }
};

struct RowShape {
  int64_t rows, cols;
};

// Shapes that reach every kernel path for each dtype (fp32 W=4, half W=8 elements per access):
// short rows (<= 512 accesses), block per row, clusters of 2..4 in registers and with
// shared-memory staging, rows split over 8..64 blocks (> 73728 accesses, with a workspace) or
// clusters of 16 (without), a streamed remainder, and the scalar path (cols not a multiple of
// the vector width).
std::vector<RowShape> Shapes(DType dt) {
  std::vector<RowShape> s = {{1, 1},     {1, 3},      {1, 1000},   {1, 65537},   {1, 1 << 20},
                             {257, 1},   {513, 3},    {300, 1000}, {1000, 128},  {64, 2048},
                             {33, 2052}, {20, 4096},  {9, 8200},   {7, 32768},   {5, 65537},
                             {3, 131072}, {3, 131080}, {3, 1 << 20}, {2, 262152}};
  if (!SmallMode()) {
    if (dt == DType::kFloat32) s.push_back({1, 1 << 24});
    if (dt == DType::kBFloat16) s.push_back({2, 1 << 22});
  }
  return s;
}

TEST_P(MemoryBound, GeluSizesAndOffsets) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{65537}, int64_t{1} << 20, (int64_t{1} << 20) + 3}) {
    // (0,0) vector path; (1,1), (3,3) same misalignment: scalar head + vectors + tail;
    // (0,1) different misalignment: scalar kernel.
    for (Offsets off : {Offsets{0, 0}, Offsets{1, 1}, Offsets{3, 3}, Offsets{0, 1}}) {
      CheckGelu(n, off, /*specials=*/true);
    }
  }
}

TEST_P(MemoryBound, GeluInPlace) {
  const DType dt = GetParam();
  const int64_t n = 100003;
  const size_t es = ElementSize(dt);
  const uint64_t seed = FreshSeed();
  const std::vector<uint8_t> in = ref::RandomTensor(dt, n, -8.f, 8.f, seed);
  const std::vector<double> want = ref::Gelu(dt, in.data(), n);
  DeviceBuffer d(n * es);
  ASSERT_EQ(d.status(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d.get(), in.data(), n * es, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::LaunchGelu(dt, d.get(), d.get(), n, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> out(n * es);
  ASSERT_EQ(cudaMemcpy(out.data(), d.get(), n * es, cudaMemcpyDeviceToHost), cudaSuccess);
  const ref::Comparison c = ref::Compare(dt, out.data(), want, ref::DefaultTolerance(dt));
  EXPECT_TRUE(c.ok) << "seed=" << seed << " rel_error=" << c.rel_error;
}

TEST_P(MemoryBound, SoftmaxShapes) {
  for (const RowShape& s : Shapes(GetParam())) {
    CheckSoftmax(s.rows, s.cols, {0, 0}, KernelChoice{});
    // Long rows take the split path given a workspace (as above), clusters without one.
    if (s.cols >= (1 << 20)) CheckSoftmax(s.rows, s.cols, {0, 0}, KernelChoice{}, nullptr, /*workspace=*/false);
    if (s.rows * s.cols <= (1 << 20) + 8) {
      CheckSoftmax(s.rows, s.cols, {1, 1}, KernelChoice{});  // unaligned: scalar path
      CheckSoftmax(s.rows, s.cols, {0, 3}, KernelChoice{});
    }
  }
}

// Special rows: some -inf; all -inf (-> NaN); a NaN (-> NaN); +inf (-> NaN); huge values; all
// equal huge; and a plain row after them.
TEST_P(MemoryBound, SoftmaxSpecialRows) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{4096}, int64_t{65537}, int64_t{1} << 20}) {
    const int64_t rows = 7;
    auto edit = [&](std::vector<uint8_t>& in) {
      std::mt19937 rng(static_cast<uint32_t>(cols));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      for (int64_t c = 0; c < cols; c += 3) set(0, c, -kInf);
      for (int64_t c = 0; c < cols; ++c) set(1, c, -kInf);
      set(2, cols / 2, kNaN);
      set(3, cols - 1, kInf);
      for (int64_t c = 0; c < cols; ++c) set(4, c, u(rng) * Big(dt));
      for (int64_t c = 0; c < cols; ++c) set(5, c, Big(dt));
    };
    CheckSoftmax(rows, cols, {0, 0}, KernelChoice{}, edit);
    CheckSoftmax(rows, cols, {1, 1}, KernelChoice{}, edit);
    if (cols == (1 << 20)) {
      CheckSoftmax(rows, cols, {0, 0}, bench::Choice(0, 4, 8, 512, 0, 1, -1), edit);  // one-shot, streamed
      CheckSoftmax(rows, cols, {0, 0}, bench::Choice(0, 8, 8, 512, 0, 1, 1), edit);   // pipelined, streamed
    }
    if (cols == 4096) {  // pipelined, one block per row: registers + one shared-memory piece
      CheckSoftmax(rows, cols, {0, 0}, bench::Choice(0, 4, 1, 64, 0, 1, 1), edit);
    }
  }
}

// Rows 0-4 of a softmax input with `cols` columns: some -inf, all -inf (-> NaN), a NaN, a +inf,
// all Big (SoftmaxSpecialRows' rows without its random one).
std::function<void(std::vector<uint8_t>&)> SpecialSoftmaxRows(DType dt, int64_t cols) {
  return [dt, cols](std::vector<uint8_t>& in) {
    auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
    for (int64_t c = 0; c < cols; c += 3) set(0, c, -kInf);
    for (int64_t c = 0; c < cols; ++c) set(1, c, -kInf);
    set(2, cols / 2, kNaN);
    set(3, cols - 1, kInf);
    for (int64_t c = 0; c < cols; ++c) set(4, c, Big(dt));
  };
}

// Rows split over independent blocks that meet in the workspace: 2..64 blocks per row, pieces in
// registers only, with shared memory, with a streamed remainder, the scalar path, special rows,
// blocks that do not wait for their row-mates (each reads its row itself), and L2 prefetch of a
// later block's chunk; a forced split without enough workspace is refused.
TEST_P(MemoryBound, SoftmaxSplitRows) {
  const DType dt = GetParam();
  const bool f32 = dt == DType::kFloat32;
  const int64_t mega = int64_t{1} << 20;
  // (rows, cols, split, threads, vectors per thread, shared-memory bytes; 0 = automatic)
  struct Case {
    int64_t rows, cols;
    int split, threads, vpt, smem;
  };
  const Case cases[] = {
      {3, 4096, 2, 64, 4, 0},         {5, 65536, 8, 256, 8, -1},     {9, 65537, 4, 128, 2, 0},
      {4, mega, 32, 512, 4, 0},       {3, mega, 16, 512, 8, 0},      {2, mega + 8, 64, 256, 8, 0},
      {2, 2 * mega, 16, 256, 4, 32768}, {300, 8192, 2, 0, 0, 0},   {2, f32 ? mega : 2 * mega, 8, 128, 1, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "split " << c.split << " t=" << c.threads << " v=" << c.vpt);
    KernelChoice k = bench::Choice(0, c.vpt, 0, c.threads, c.smem, 1);
    k.split = c.split;
    CheckSoftmax(c.rows, c.cols, {0, 0}, k);
    if (c.rows * c.cols <= 4 * mega) CheckSoftmax(c.rows, c.cols, {1, 3}, k);  // scalar path
    k.split_wait_us = -1;
    CheckSoftmax(c.rows, c.cols, {0, 0}, k);
  }
  const auto edit = SpecialSoftmaxRows(dt, mega);
  KernelChoice k = bench::Choice(0, 4, 0, 512, 0, 1);
  k.split = 32;
  CheckSoftmax(6, mega, {0, 0}, k, edit);
  k.split_wait_us = -1;
  CheckSoftmax(6, mega, {0, 0}, k, edit);
  // L2 prefetch of a later block's chunk (split, block per row, cluster): the same results.
  for (int q : {1, 8}) {
    KernelChoice kp = bench::Choice(0, 8, 0, 256, 0, 1);
    kp.split = 2;
    kp.prefetch = q;
    CheckSoftmax(1000, 8192, {0, 0}, kp);
    kp.split = 0;
    CheckSoftmax(1000, 8192, {0, 0}, kp);
    KernelChoice kc;
    kc.prefetch = q;
    CheckSoftmax(SmallMode() ? 6 : 40, 1 << 20, {0, 0}, kc);
  }
  DeviceBuffer b(1 << 20);
  k.split_wait_us = 0;
  const size_t need = cuda::SoftmaxWorkspaceBytesWith(k, dt, 2, 65536);
  EXPECT_GT(need, 0u);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(k, dt, b.get(), b.get() + (1 << 19), 2, 65536, nullptr, {b.get(), need - 1}),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(k, dt, b.get(), b.get() + (1 << 19), 2, 65536, nullptr), cudaErrorInvalidValue);
  k.split = 129;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(k, dt, b.get(), b.get() + (1 << 19), 2, 65536, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Short rows with exp_once (e^(x - max) kept in registers) give the same bits as recomputing it,
// special rows included: the sum and the output see the same e^(x - max) either way (with the
// two-step exponent; the FFMA form's output is checked against the reference like every path).
TEST_P(MemoryBound, SoftmaxExpOnceSameBitsAsRecompute) {
  const DType dt = GetParam();
  const size_t es = ElementSize(dt);
  for (int64_t cols : {int64_t{1}, int64_t{3}, int64_t{100}, int64_t{128}, int64_t{1024}}) {
    const int64_t rows = 301;
    std::vector<uint8_t> in = ref::RandomTensor(dt, rows * cols, -10.f, 10.f, FreshSeed());
    auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
    for (int64_t c = 0; c < cols; ++c) set(0, c, -kInf);
    set(1, cols / 2, kNaN);
    set(2, cols - 1, kInf);
    for (int64_t c = 0; c < cols; c += 2) set(3, c, -kInf);
    const std::vector<double> want = ref::Softmax(dt, in.data(), rows, cols);
    for (size_t off : {size_t{0}, size_t{1}}) {  // vector and scalar paths
      std::vector<uint8_t> once, twice;
      KernelChoice k1, k2;
      k1.exp_once = 1;
      k2.exp_once = -1;
      k1.exp_fma = k2.exp_fma = -1;  // the FFMA output folds 1/sum into the exponent: other bits
      const std::string where = Where(dt, rows, cols, off * es, off * es, 0, "exp_once");
      ASSERT_TRUE(RunOp(in, off * es, rows * cols * es, off * es,
                        [&](const void* i, void* o) {
                          return cuda::LaunchSoftmaxWith(k1, dt, i, o, rows, cols, nullptr);
                        },
                        &once))
          << where;
      ASSERT_TRUE(RunOp(in, off * es, rows * cols * es, off * es,
                        [&](const void* i, void* o) {
                          return cuda::LaunchSoftmaxWith(k2, dt, i, o, rows, cols, nullptr);
                        },
                        &twice))
          << where;
      EXPECT_EQ(once, twice) << where;
      const ref::Comparison c = ref::Compare(dt, once.data(), want, ref::DefaultTolerance(dt));
      EXPECT_TRUE(c.ok) << where << " rel_error=" << c.rel_error << " first_bad=" << c.first_bad;
    }
  }
}

// The short-row softmax with smaller blocks (fewer rows per block), vector and scalar paths (the
// scalar path holds at most 512 elements per row in the short-row kernel); block sizes it cannot
// use are refused.
TEST_P(MemoryBound, SoftmaxShortRowBlockSizes) {
  for (int threads : {32, 64, 128}) {
    for (int64_t cols : {int64_t{3}, int64_t{128}, int64_t{1000}, int64_t{1024}}) {
      SCOPED_TRACE(::testing::Message() << "threads " << threads << " cols " << cols);
      CheckSoftmax(301, cols, {0, 0}, bench::Choice(0, 0, 0, threads, 0, -1));
      if (cols <= 512) CheckSoftmax(301, cols, {1, 3}, bench::Choice(0, 0, 0, threads, 0, -1));  // scalar path
    }
  }
  DeviceBuffer b(1 << 16);
  for (int threads : {16, 48, 512}) {
    EXPECT_EQ(cuda::LaunchSoftmaxWith(bench::Choice(0, 0, 0, threads, 0, -1), GetParam(), b.get(),
                                      b.get() + 32768, 4, 128, nullptr),
              cudaErrorInvalidValue)
        << threads;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The row-block kernel (a row in one block's registers) at 512 threads x 4 / x 2 (the chunk
// kernel where the row does not fit) and 1024-column rows in blocks of 32-256 threads: full rows,
// rows that leave threads idle, scalar rows; and the automatic choice at 8192 columns.
TEST_P(MemoryBound, SoftmaxRowBlockSizes) {
  for (int64_t cols : {int64_t{8192}, int64_t{6000}, int64_t{2047}}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    CheckSoftmax(7, cols, {0, 0}, bench::Choice(0, 4, 0, 512, 0, 1));
    CheckSoftmax(7, cols, {0, 0}, bench::Choice(0, 2, 0, 512, 0, 1));
  }
  for (int vpt : {1, 2, 4}) CheckSoftmax(9, 1024, {0, 0}, bench::Choice(0, vpt, 0, 0, 0, 1));
  DeviceBuffer b(1 << 20);
  char desc[128];
  cuda::DescribeSoftmax(GetParam(), b.get(), b.get(), 7, 2047, bench::Choice(0, 4, 0, 512, 0, 1), desc, sizeof desc);
  // 2047 columns: rows after the first start off a 16-byte boundary, so the forced 512 x 4
  // block takes the head/tail path around 16-byte vectors, not the scalar kernel.
  EXPECT_NE(std::string(desc).find("softmax/rowblock edges c=1 t=512 v=4"), std::string::npos) << desc;
  // The automatic choice at 8192 columns: 512 x 4 for 4-byte types, prefetching a later row where
  // the rows fill 12 waves of resident blocks (3 blocks of 512 per SM: on the H200 from 4752 rows);
  // the exact kernel at 512 x 2 without a prefetch for 2-byte ones; prefetch = -1 turns it off.
  const bool fp32 = GetParam() == DType::kFloat32;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const std::string want = fp32 ? "softmax/rowblock vec c=1 t=512 v=4 smem=0 plain"
                                : "softmax/rowblock vec c=1 t=512 v=2 smem=0 plain exact";
  for (int64_t rows : {int64_t{2048}, int64_t{8192}}) {  // 7 rows (under 8 MiB): the row program
    cuda::DescribeSoftmax(GetParam(), b.get(), b.get(), rows, 8192, KernelChoice{}, desc, sizeof desc);
    EXPECT_NE(std::string(desc).find(want), std::string::npos) << rows << " rows: " << desc;
    EXPECT_EQ(std::string(desc).find(" ahead=") != std::string::npos, fp32 && rows >= int64_t{12} * 3 * sms)
        << rows << " rows: " << desc;
  }
  KernelChoice off;
  off.prefetch = -1;
  cuda::DescribeSoftmax(GetParam(), b.get(), b.get(), 8192, 8192, off, desc, sizeof desc);
  EXPECT_EQ(std::string(desc).find("ahead="), std::string::npos) << desc;
  CheckSoftmax(7, 8192, {0, 0}, off);
}

// The row-block kernels prefetching a later block's row into L2 (prefetch = 1, 2, 8: 512-thread
// vector rows, fp32 8192 columns recomputing and exact, 2-byte 8192 columns exact): fewer rows than
// the distance, many more (the last blocks prefetch nothing), special rows, misaligned rows (the
// scalar path, no prefetch); a shape without the prefetching form (256 x 8) takes the chunk kernel.
TEST_P(MemoryBound, SoftmaxRowBlockPrefetch) {
  const DType dt = GetParam();
  const int64_t cols = 8192;
  auto describe = [dt](const KernelChoice& k) {
    char desc[128];
    cuda::DescribeSoftmax(dt, reinterpret_cast<const void*>(kGuard), reinterpret_cast<const void*>(kGuard), 7, cols,
                          k, desc, sizeof desc);
    return std::string(desc);
  };
  for (int q : {1, 2, 8}) {
    for (int exp_once : {0, 1}) {
      KernelChoice k;
      k.prefetch = q;
      k.exp_once = exp_once;
      const std::string desc = describe(k);
      SCOPED_TRACE(::testing::Message() << "prefetch " << q << " exp_once " << exp_once << ": " << desc);
      EXPECT_NE(desc.find("softmax/rowblock vec c=1 t=512"), std::string::npos);
      EXPECT_NE(desc.find(" ahead="), std::string::npos);
      CheckSoftmax(3, cols, {0, 0}, k);
      CheckSoftmax(SmallMode() ? 300 : 2000, cols, {0, 0}, k);
      CheckSoftmax(7, cols, {0, 0}, k, SpecialSoftmaxRows(dt, cols));
      CheckSoftmax(5, cols, {1, 3}, k);
    }
  }
  KernelChoice k = bench::Choice(0, 8, 0, 256, 0, 1);
  k.prefetch = 1;
  const int64_t cols256 = 256 * 8 * (16 / static_cast<int64_t>(ElementSize(dt)));
  char desc[128];
  cuda::DescribeSoftmax(dt, reinterpret_cast<const void*>(kGuard), reinterpret_cast<const void*>(kGuard), 7, cols256,
                        k, desc, sizeof desc);
  EXPECT_NE(std::string(desc).find("softmax/chunk vec c=1 t=256 v=8"), std::string::npos) << desc;
  CheckSoftmax(300, cols256, {0, 0}, k);
}

// The exact kernels: rows of exactly their shape, without bounds checks, one exp per element.
// One block per row (2-byte 8192 columns automatically, fp32 with exp_once = 1; 512 x 2, 256 x 4,
// 256 x 8, 512 x 4 forced) and the short-row Exact form (128 and 1024 columns automatically; 4-32
// lanes x 2, 4, 8 accesses forced), with the special rows of SoftmaxSpecialRows, row counts that
// leave a block's rows unused, and the refusals: an inexact or misaligned row forced onto the
// exact form.
TEST_P(MemoryBound, SoftmaxExactRows) {
  const DType dt = GetParam();
  const int64_t w = 16 / static_cast<int64_t>(ElementSize(dt));
  auto describe = [dt](int64_t cols, const KernelChoice& k) {
    char desc[128];
    // 4097 rows: past the row program's 1024 (the kernels below are what larger tensors get).
    cuda::DescribeSoftmax(dt, reinterpret_cast<const void*>(kGuard), reinterpret_cast<const void*>(kGuard), 4097,
                          cols, k, desc, sizeof desc);
    return std::string(desc);
  };
  const KernelChoice exp_once = bench::Choice(0, 0, 0, 0, 0, 0, 0, 0, 1);  // 4-byte one-block rows too
  for (int64_t cols : {int64_t{128}, int64_t{1024}, int64_t{8192}}) {
    for (const KernelChoice& k : {KernelChoice{}, exp_once}) {
      const std::string desc = describe(cols, k);
      SCOPED_TRACE(::testing::Message() << "cols " << cols << ": " << desc);
      // Automatically everywhere but 4-byte rows of one block (fp32 8192: the recomputing kernel).
      const bool want = k.exp_once > 0 || cols != 8192 || dt != DType::kFloat32;
      EXPECT_EQ(desc.find("exact") != std::string::npos, want);
      CheckSoftmax(cols == 8192 ? 37 : 1001, cols, {0, 0}, k);
      CheckSoftmax(7, cols, {0, 0}, k, SpecialSoftmaxRows(dt, cols));
    }
  }
  // One block per row, forced shapes (512-thread blocks hold at most 16 floats per thread).
  for (auto [threads, vpt] : {std::pair{512, 2}, std::pair{256, 4}, std::pair{256, 8}, std::pair{512, 4}}) {
    const int64_t cols = int64_t{threads} * vpt * w;
    const KernelChoice k = bench::Choice(0, vpt, 0, threads, 0, 1, 0, 0, 1);
    const std::string desc = describe(cols, k);
    SCOPED_TRACE(::testing::Message() << threads << " x " << vpt << ": " << desc);
    EXPECT_EQ(desc.find("exact") != std::string::npos, vpt * w <= (threads > 256 ? 16 : 32));
    CheckSoftmax(5, cols, {0, 0}, k);
    CheckSoftmax(7, cols, {0, 0}, k, SpecialSoftmaxRows(dt, cols));
  }
  // Short rows, the Exact form forced (pipeline = 1).
  for (int tpr : {4, 8, 16, 32}) {
    for (int per : {2, 4, 8}) {
      if (per * w > 32) continue;
      const int64_t cols = int64_t{tpr} * per * w;
      SCOPED_TRACE(::testing::Message() << "tpr " << tpr << " per lane " << per);
      const KernelChoice k = bench::Choice(tpr, std::max(per, 4), 0, 0, 0, -1, 1);
      CheckSoftmax(333, cols, {0, 0}, k);
      CheckSoftmax(7, cols, {0, 0}, k, SpecialSoftmaxRows(dt, cols));
    }
  }
  DeviceBuffer b(1 << 20);
  // 13 accesses fit 4 lanes x 4 but are not 4 lanes x whole accesses: the bounds-checked kernel
  // runs them, the Exact form refuses them, as it refuses a misaligned row (the scalar path).
  const KernelChoice checked = bench::Choice(4, 4, 0, 0, 0, -1), forced = bench::Choice(4, 4, 0, 0, 0, -1, 1);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(checked, dt, b.get(), b.get() + (1 << 19), 2, 13 * w, nullptr), cudaSuccess);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(forced, dt, b.get(), b.get() + (1 << 19), 2, 13 * w, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(forced, dt, b.get() + ElementSize(dt), b.get() + (1 << 19), 2, 16 * w, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The persistent pipelined softmax with many rows per cluster (every piece refilled many times),
// clusters of 1..16, shared memory in one or several pieces, and a streamed remainder.
TEST_P(MemoryBound, SoftmaxPipelinedRefills) {
  const int64_t cols = GetParam() == DType::kFloat32 ? 65536 : 131072;  // 16384 accesses per row
  for (auto [c, vpt] : {std::pair{1, 4}, std::pair{1, 8}, std::pair{2, 8}, std::pair{8, 4}, std::pair{16, 8}}) {
    CheckSoftmax(300, cols, {0, 0}, bench::Choice(0, vpt, c, 128, 0, 1, 1));
  }
  CheckSoftmax(97, cols, {0, 0}, bench::Choice(0, 8, 2, 64, 40000, 1, 1));  // smem + streamed
}

TEST_P(MemoryBound, RowSumShapes) {
  for (const RowShape& s : Shapes(GetParam())) {
    CheckRowSum(s.rows, s.cols, {0, 0}, KernelChoice{});
    if (s.rows * s.cols <= (1 << 20) + 8) CheckRowSum(s.rows, s.cols, {1, 3}, KernelChoice{});
  }
  CheckRowSum(1000, 1000, {0, 0}, KernelChoice{}, 0.f, 1.f);  // well-conditioned sums
}

TEST_P(MemoryBound, RowSumSpecialRows) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{65537}, int64_t{1} << 20}) {
    auto edit = [&](std::vector<uint8_t>& in) {
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      set(0, cols / 2, kNaN);
      set(1, 0, kInf);
      set(2, 0, -kInf);
      set(3, 0, -kInf);
      set(3, cols - 1, kInf);  // -inf + inf = NaN (when cols > 1)
      for (int64_t c = 0; c < cols; ++c) set(4, c, dt == DType::kFloat16 ? 6.0e4f : 1.0e30f);
    };
    CheckRowSum(6, cols, {0, 0}, KernelChoice{}, -1.f, 1.f, edit);
  }
}

// 2-byte rows that one block reads with 16 or more 8-byte loads per thread (32768-65536 columns)
// take 8-byte loads in 512-thread blocks: whole batches, a partial last batch, a row of NaN / inf
// and huge values; 4-byte types and misaligned rows take the other paths on the same shapes.
TEST_P(MemoryBound, RowSumEightByteAccessRows) {
  const DType dt = GetParam();
  for (int64_t cols : {int64_t{32768}, int64_t{40960}, int64_t{65528}, int64_t{65536}}) {
    char desc[128];
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), 5, cols, KernelChoice{}, desc, sizeof desc);
    EXPECT_EQ(std::string(desc).find("vec8") != std::string::npos, ElementSize(dt) == 2) << cols << ": " << desc;
    CheckRowSum(5, cols, {0, 0}, KernelChoice{});
    CheckRowSum(3, cols, {1, 3}, KernelChoice{});
    auto edit = [&](std::vector<uint8_t>& in) {
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      set(0, cols - 1, kNaN);
      set(1, cols / 2, kInf);
      set(2, 0, -kInf);
      set(2, cols - 1, kInf);
      for (int64_t c = 0; c < cols; ++c) set(3, c, dt == DType::kFloat16 ? 6.0e4f : 1.0e30f);
    };
    CheckRowSum(4, cols, {0, 0}, KernelChoice{}, -1.f, 1.f, edit);
  }
}

// Rows of exactly 1024 or 2048 16-byte accesses (2-byte 8192 or 16384 columns, fp32 4096 or 8192)
// are read in one batch of 512 x 2 or 4 loads: one row, several, a row of NaN / inf and one of huge
// values; a misaligned row takes the scalar path. The one-batch kernel's forced shapes on rows of exactly their size; a
// row of another length, or a shape it is not built for, is refused.
TEST_P(MemoryBound, RowSumOneBatchRows) {
  const DType dt = GetParam();
  for (int64_t nacc : {int64_t{1024}, int64_t{2048}}) {
    SCOPED_TRACE(::testing::Message() << nacc << " accesses per row");
    const int64_t cols = nacc * 16 / static_cast<int64_t>(ElementSize(dt));
    char desc[128];
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), 7, cols, KernelChoice{}, desc, sizeof desc);
    const std::string want = "one-batch c=1 t=512 u=" + std::to_string(nacc / 512);
    EXPECT_NE(std::string(desc).find(want), std::string::npos) << desc;
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), 7, cols + 8, KernelChoice{}, desc, sizeof desc);
    EXPECT_EQ(std::string(desc).find("one-batch"), std::string::npos) << desc;
    CheckRowSum(1, cols, {0, 0}, KernelChoice{});
    CheckRowSum(37, cols, {0, 0}, KernelChoice{});
    CheckRowSum(5, cols, {1, 3}, KernelChoice{});
    auto edit = [&](std::vector<uint8_t>& in) {
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      set(0, cols - 1, kNaN);
      set(1, 511, kInf);
      set(2, 0, -kInf);
      set(2, cols - 1, kInf);
      for (int64_t c = 0; c < cols; ++c) set(3, c, dt == DType::kFloat16 ? 6.0e4f : 1.0e30f);
    };
    CheckRowSum(4, cols, {0, 0}, KernelChoice{}, -1.f, 1.f, edit);
  }
  const std::pair<int, int> built[] = {{512, 2}, {512, 4}, {256, 4}, {256, 8}};
  for (const auto& [threads, unroll] : built) {
    SCOPED_TRACE(::testing::Message() << "threads " << threads << " unroll " << unroll);
    const int64_t exact = int64_t{threads} * unroll * 16 / static_cast<int64_t>(ElementSize(dt));
    CheckRowSum(9, exact, {0, 0}, bench::Choice(0, unroll, 0, threads, 0, 1, 1));
    CheckRowSum(9, exact, {0, 0}, bench::Choice(0, unroll, 0, threads, 0, 1, 1, -1));  // plain loads
  }
  const int64_t cols = 1024 * 16 / static_cast<int64_t>(ElementSize(dt));
  DeviceBuffer b(1 << 20);
  float* out = reinterpret_cast<float*>(b.get()) + (1 << 17);
  EXPECT_EQ(cuda::LaunchRowSumWith(bench::Choice(0, 2, 0, 512, 0, 1, 1), dt, b.get(), out, 2, cols + 8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchRowSumWith(bench::Choice(0, 8, 0, 512, 0, 1, 1), dt, b.get(), out, 2, cols * 4, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Short rows of exactly 2 accesses per lane (128 columns) are read without a loop or bounds
// checks; so are rows of exactly 4 or 8 per lane when forced (pipeline = 1). Many rows (a partial
// last block), special values, a misaligned row (scalar path); a forced count that does not divide
// the row is refused.
TEST_P(MemoryBound, RowSumExactShortRows) {
  const DType dt = GetParam();
  const int64_t w = 16 / static_cast<int64_t>(ElementSize(dt));
  char desc[128];
  cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), 1000, 128, KernelChoice{}, desc, sizeof desc);
  EXPECT_NE(std::string(desc).find("exact"), std::string::npos) << desc;
  CheckRowSum(1000, 128, {0, 0}, KernelChoice{});
  CheckRowSum(7, 128, {1, 3}, KernelChoice{});
  auto edit = [&](std::vector<uint8_t>& in) {
    auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * 128 + c, v); };
    set(0, 127, kNaN);
    set(1, 64, kInf);
    set(2, 0, -kInf);
    set(2, 127, kInf);
    for (int64_t c = 0; c < 128; ++c) set(3, c, dt == DType::kFloat16 ? 6.0e4f : 1.0e30f);
  };
  CheckRowSum(9, 128, {0, 0}, KernelChoice{}, -1.f, 1.f, edit);
  for (int tpr : {8, 32}) {
    for (int per_lane : {2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "tpr " << tpr << " per lane " << per_lane);
      const int64_t cols = int64_t{tpr} * per_lane * w;
      CheckRowSum(333, cols, {0, 0}, bench::Choice(tpr, per_lane, 0, 0, 0, -1, 1));
      CheckRowSum(33, cols, {0, 0}, bench::Choice(tpr, per_lane, 0, 0, 0, -1, 1, -1));  // plain loads
    }
  }
  DeviceBuffer b(1 << 20);
  EXPECT_EQ(cuda::LaunchRowSumWith(bench::Choice(8, 4, 0, 0, 0, -1, 1), dt, b.get(),
                                   reinterpret_cast<float*>(b.get()) + (1 << 17), 2, 16 * w, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Aligned rows of 1-7 whole 16-byte accesses through the packed kernel: every row length, every
// rows-per-lane count, row counts that leave the last block partly empty, special values, plain
// loads; and the packed kernel refused where rows are not whole aligned vectors or are 8+.
TEST_P(MemoryBound, RowSumPackedRows) {
  const DType dt = GetParam();
  const int64_t w = 16 / static_cast<int64_t>(ElementSize(dt));
  const int64_t many = SmallMode() ? 4099 : 300007;
  for (int64_t nacc = 1; nacc < 8; ++nacc) {
    const int64_t cols = nacc * w;
    char desc[128];
    KernelChoice four;
    four.rows_per_lane = 4;
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), many, cols, four, desc, sizeof desc);
    const std::string want = "rowsum/packed tpr=" + std::to_string(nacc == 1 ? 1 : nacc <= 2 ? 2 : nacc <= 4 ? 4 : 8) +
                             " r=4 t=256 cs";
    EXPECT_EQ(std::string(desc), want);
    cuda::DescribeRowSum(dt, reinterpret_cast<const void*>(kGuard), many, cols, KernelChoice{}, desc, sizeof desc);
    EXPECT_EQ(std::string(desc), want);  // the automatic choice
    for (int r : {1, 2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "x" << cols << " rows per lane " << r);
      KernelChoice k;
      k.rows_per_lane = r;
      for (int64_t rows : {int64_t{1}, int64_t{255}, int64_t{1031}, many}) CheckRowSum(rows, cols, {0, 0}, k);
      k.streaming = -1;
      CheckRowSum(1031, cols, {0, 0}, k);
    }
    auto edit = [&](std::vector<uint8_t>& in) {
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      set(0, cols - 1, kNaN);
      set(1, 0, kInf);
      set(2, 0, -kInf);
      set(3, 0, -kInf);
      set(3, cols - 1, kInf);
      for (int64_t c = 0; c < cols; ++c) set(4, c, Big(dt));
    };
    CheckRowSum(37, cols, {0, 0}, KernelChoice{}, -1.f, 1.f, edit);
  }
  DeviceBuffer b(1 << 20);
  float* out = reinterpret_cast<float*>(b.get()) + (1 << 17);
  KernelChoice k;
  k.rows_per_lane = 4;
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get(), out, 10, 8 * w, nullptr), cudaErrorInvalidValue);  // 8 vectors
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get(), out, 10, 3, nullptr), cudaErrorInvalidValue);  // not whole vectors
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get() + 2, out, 10, w, nullptr), cudaErrorInvalidValue);  // offset
  k.rows_per_lane = 3;
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get(), out, 10, w, nullptr), cudaErrorInvalidValue);
  k.rows_per_lane = -2;
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get(), out, 10, w, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The row sum's automatic kernel for each kind of row (host code only: runs without a GPU, so
// CI checks that the choices measured fastest on the H200 stay the automatic ones).
TEST(RowSumPlan, KernelForEachRowLength) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  const void* misaligned = reinterpret_cast<const void*>(uintptr_t{258});
  auto describe = [](DType dt, const void* in, int64_t rows, int64_t cols) {
    char desc[128];
    cuda::DescribeRowSum(dt, in, rows, cols, KernelChoice{}, desc, sizeof desc);
    return std::string(desc);
  };
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, f32 = DType::kFloat32;
  EXPECT_EQ(describe(bf16, aligned, 262144, 128), "rowsum/rows vec exact tpr=8 t=256 u=2 cs");
  EXPECT_EQ(describe(f32, aligned, 262144, 128), "rowsum/rows vec exact tpr=16 t=256 u=2 cs");
  EXPECT_EQ(describe(bf16, aligned, 65536, 1024), "rowsum/rows vec tpr=32 t=256 u=4 cs");
  EXPECT_EQ(describe(f32, aligned, 65536, 1024), "rowsum/rows vec tpr=32 t=256 u=8 cs");
  EXPECT_EQ(describe(bf16, aligned, 8192, 8192), "rowsum/cluster vec one-batch c=1 t=512 u=2 cs");
  EXPECT_EQ(describe(f16, aligned, 8192, 8192), "rowsum/cluster vec one-batch c=1 t=512 u=2 cs");
  EXPECT_EQ(describe(f32, aligned, 8192, 4096), "rowsum/cluster vec one-batch c=1 t=512 u=2 cs");
  EXPECT_EQ(describe(f32, aligned, 8192, 8192), "rowsum/cluster vec one-batch c=1 t=512 u=4 cs");
  EXPECT_EQ(describe(bf16, aligned, 8192, 16384), "rowsum/cluster vec one-batch c=1 t=512 u=4 cs");
  EXPECT_EQ(describe(f32, aligned, 8192, 8196), "rowsum/cluster vec c=1 t=256 u=8 cs");
  EXPECT_EQ(describe(bf16, aligned, 2048, 32768), "rowsum/cluster vec8 c=1 t=512 u=16 cs");
  EXPECT_EQ(describe(f32, aligned, 2048, 32768), "rowsum/cluster vec c=1 t=256 u=16 cs");
  EXPECT_EQ(describe(bf16, aligned, 128, 1048576), "rowsum/cluster vec c=8 t=256 u=16 cs");
  // Not 16-byte aligned, or not whole 16-byte accesses: the scalar path, never the exact kernels.
  EXPECT_EQ(describe(bf16, misaligned, 8192, 8192).find("one-batch"), std::string::npos);
  EXPECT_EQ(describe(bf16, misaligned, 1000, 128).find("exact"), std::string::npos);
  EXPECT_EQ(describe(bf16, aligned, 1000, 127).find("exact"), std::string::npos);
}

// The row program (a block per row of 65-16384 columns, the row in registers): every block size on
// rows up to 32 values per thread, aligned rows (vectors), odd rows and offsets (scalars), in and out
// at different offsets, special rows; the shape it picks; where it is automatic; refusals.
TEST_P(MemoryBound, SoftmaxRowPrograms) {
  const DType dt = GetParam();
  KernelChoice k;
  k.row_program = 1;
  for (int threads : {128, 256, 512}) {
    k.threads = threads;
    for (int64_t cols : {65, 127, 251, 1000, 1024, 4093, 4096, 8192, 11008, 16384}) {
      if (cols > 32 * threads) continue;
      SCOPED_TRACE(::testing::Message() << "threads " << threads << ", 33x" << cols);
      CheckSoftmax(33, cols, {0, 0}, k);
      CheckSoftmax(3, cols, {1, 1}, k);
      CheckSoftmax(2, cols, {1, 3}, k);
      CheckSoftmax(7, cols, {0, 0}, k, SpecialSoftmaxRows(dt, cols));
    }
  }
  KernelChoice on;  // block size chosen by the row length
  on.row_program = 1;
  for (int64_t cols : {65, 251, 4096, 16384}) {
    SCOPED_TRACE(::testing::Message() << "threads by row length, x" << cols);
    CheckSoftmax(5, cols, {0, 0}, on);
    CheckSoftmax(5, cols, {1, 1}, on, SpecialSoftmaxRows(dt, cols));
  }
  auto describe = [dt, on](int64_t rows, int64_t cols, size_t off, const KernelChoice& c_or_on = {}) {
    const KernelChoice& c = c_or_on.row_program != 0 ? c_or_on : on;
    char desc[128];
    const void* p = reinterpret_cast<const void*>(kGuard + off);
    cuda::DescribeSoftmax(dt, p, p, rows, cols, c, desc, sizeof desc);
    return std::string(desc);
  };
  EXPECT_EQ(describe(2, 4096, 0), dt == DType::kFloat32 ? "softmax/program vec t=512 j=2" : "softmax/program vec t=512 j=1");
  EXPECT_EQ(describe(33, 251, 0), "softmax/program scalar t=128 j=2");
  EXPECT_EQ(describe(1, 16384, 16), describe(1, 16384, 0));  // a vector's offset keeps vectors
  EXPECT_EQ(describe(7, 1000, ElementSize(dt)), "softmax/program scalar t=128 j=8");
  EXPECT_EQ(describe(5, 16385, 0), "softmax/invalid");  // past 16384 columns
  // The automatic choice: up to 1024 rows and 4 MiB, not 4-byte scalar rows past 4096 columns.
  const KernelChoice automatic;
  auto is_program = [&](int64_t rows, int64_t cols, size_t off = 0) {
    char desc[128];
    const void* p = reinterpret_cast<const void*>(kGuard + off);
    cuda::DescribeSoftmax(dt, p, p, rows, cols, automatic, desc, sizeof desc);
    return std::string(desc).rfind("softmax/program", 0) == 0;
  };
  EXPECT_TRUE(is_program(2, 4096));
  EXPECT_TRUE(is_program(33, 251));
  EXPECT_TRUE(is_program(1024, 127));
  EXPECT_FALSE(is_program(1025, 127));  // many rows: the short-row kernel
  EXPECT_FALSE(is_program(5, 64));      // the tiny / tile kernels
  EXPECT_FALSE(is_program(5, 16385));
  const int64_t es = static_cast<int64_t>(ElementSize(dt));
  EXPECT_FALSE(is_program(1024, ((int64_t{4} << 20) / (1024 * es)) + 1));  // past 4 MiB
  EXPECT_EQ(is_program(5, 7963), es != 4);  // scalar rows past 4096 columns: 2-byte types only
  EXPECT_TRUE(is_program(5, 8192));         // vectors
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(dt, 1, 16384), 0u);  // a row program needs none
  KernelChoice never;
  never.row_program = -1;
  EXPECT_EQ(describe(2, 4096, 0, never).rfind("softmax/program", 0), std::string::npos);
  DeviceBuffer b(1 << 20);
  KernelChoice bad;
  bad.row_program = 1;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(bad, dt, b.get(), b.get() + (1 << 19), 2, 16385, nullptr), cudaErrorInvalidValue);
  bad.threads = 64;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(bad, dt, b.get(), b.get() + (1 << 19), 2, 1000, nullptr), cudaErrorInvalidValue);
  bad.threads = 128;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(bad, dt, b.get(), b.get() + (1 << 19), 2, 8192, nullptr), cudaErrorInvalidValue);
  bad.threads = 0;
  bad.row_program = 2;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(bad, dt, b.get(), b.get() + (1 << 19), 2, 1000, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The softmax's automatic short-row kernel (host code only, as above): the Exact
// form on rows of exactly lanes x accesses, 128-thread blocks below 32 lanes per row.
TEST(SoftmaxPlan, ShortRowKernelForEachRowLength) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  const void* misaligned = reinterpret_cast<const void*>(uintptr_t{258});
  auto describe = [](DType dt, const void* in, int64_t cols, const KernelChoice& k = {}) {
    char desc[128];
    cuda::DescribeSoftmax(dt, in, in, 100000, cols, k, desc, sizeof desc);  // > 8 MiB: not a row program
    return std::string(desc);
  };
  const DType bf16 = DType::kBFloat16, f32 = DType::kFloat32;
  EXPECT_EQ(describe(f32, aligned, 128), "softmax/rows vec tpr=16 v=2 t=128 plain exp-once exact");
  EXPECT_EQ(describe(bf16, aligned, 128), "softmax/rows vec tpr=4 v=4 t=128 plain exp-once exact");
  EXPECT_EQ(describe(f32, aligned, 1024), "softmax/rows vec tpr=32 v=8 t=32 plain exp-once exact");
  EXPECT_EQ(describe(bf16, aligned, 1024), "softmax/rows vec tpr=32 v=4 t=32 plain exp-once exact");
  // Bounds-checked: as asked (pipeline = -1), rows of partial lanes, misaligned rows.
  EXPECT_EQ(describe(f32, aligned, 128, bench::Choice(0, 0, 0, 0, 0, 0, -1)),
            "softmax/rows vec tpr=16 v=4 t=256 plain exp-once");
  EXPECT_EQ(describe(f32, aligned, 120).find("exact"), std::string::npos);
  EXPECT_EQ(describe(bf16, misaligned, 128).find("exact"), std::string::npos);
}

// Every (threads, loads in flight) pair the long-row row sum is built for, on the vector path
// and the scalar one (an odd row length), with a block per row and with a cluster of 4; pairs it
// is not built for are refused.
TEST_P(MemoryBound, RowSumLongRowKernelShapes) {
  const std::pair<int, int> built[] = {{256, 4}, {256, 8}, {256, 16}, {512, 8}};
  for (const auto& [threads, unroll] : built) {
    for (int cluster : {1, 4}) {
      SCOPED_TRACE(::testing::Message() << "threads " << threads << " unroll " << unroll << " cluster " << cluster);
      CheckRowSum(5, 65536, {0, 0}, bench::Choice(0, unroll, cluster, threads, 0, 1));
      CheckRowSum(3, 65537, {1, 3}, bench::Choice(0, unroll, cluster, threads, 0, 1));
    }
  }
  DeviceBuffer b(1 << 16);
  EXPECT_EQ(cuda::LaunchRowSumWith(bench::Choice(0, 16, 0, 512, 0, 1), GetParam(), b.get(),
                                   reinterpret_cast<float*>(b.get()) + 12000, 2, 4096, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The short-row kernels for every lanes-per-row value (compiled per value for 16-byte accesses),
// with the default hints and forced ones (softmax: streaming, the two-step exponent; row sum:
// plain loads), and the row sum's 4- and 8-load batches: rows of exactly one batch per lane, of
// several, and of a partial last batch, on the vector and the scalar paths. A 4-load batch with
// plain loads is not built and is refused.
TEST_P(MemoryBound, ShortRowKernelsForEveryLaneCount) {
  const int64_t w = 16 / static_cast<int64_t>(ElementSize(GetParam()));
  for (int tpr : {1, 2, 4, 8, 16, 32}) {
    for (int64_t per_lane : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{11}}) {
      const int64_t cols = tpr * per_lane * w;
      SCOPED_TRACE(::testing::Message() << "tpr " << tpr << " cols " << cols);
      for (const Offsets off : {Offsets{0, 0}, Offsets{1, 3}}) {
        for (int unroll : {4, 8}) {
          if (unroll == 4 && (per_lane > 4 || off.in_elems != 0)) continue;  // 4 only where a lane has <= 4
          CheckRowSum(67, cols, off, bench::Choice(tpr, unroll, 0, 0, 0, -1));
        }
        CheckRowSum(67, cols, off, bench::Choice(tpr, 8, 0, 0, 0, -1, 0, -1));
        // The short-row softmax holds at most 16 accesses per lane (16-byte or scalar ones).
        if (cols <= 16 * tpr * (off.in_elems == 0 ? w : 1)) {
          KernelChoice twostep = bench::Choice(tpr, 16, 0, 0, 0, -1);
          twostep.exp_fma = -1;
          CheckSoftmax(67, cols, off, bench::Choice(tpr, 16, 0, 0, 0, -1));
          CheckSoftmax(67, cols, off, bench::Choice(tpr, 16, 0, 0, 0, -1, 0, 1));
          CheckSoftmax(67, cols, off, twostep);
        }
      }
    }
  }
  DeviceBuffer b(1 << 16);
  EXPECT_EQ(cuda::LaunchRowSumWith(bench::Choice(4, 4, 0, 0, 0, -1, 0, -1), GetParam(), b.get(),
                                   reinterpret_cast<float*>(b.get()) + 12000, 2, 128, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_P(MemoryBound, RowSumZeroColumns) {
  DeviceBuffer out(16 * sizeof(float));
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, out.bytes()), cudaSuccess);
  ASSERT_EQ(cuda::LaunchRowSum(GetParam(), nullptr, reinterpret_cast<float*>(out.get()), 16, 0, nullptr),
            cudaSuccess);
  std::vector<float> h(16);
  ASSERT_EQ(cudaMemcpy(h.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : h) EXPECT_EQ(v, 0.f);
}

TEST_P(MemoryBound, InvalidArguments) {
  const DType dt = GetParam();
  DeviceBuffer b(1024);
  EXPECT_EQ(cuda::LaunchGelu(dt, b.get(), b.get(), -1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmax(dt, b.get(), b.get(), -1, 4, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchRowSum(dt, b.get(), reinterpret_cast<float*>(b.get()), 4, -4, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(bench::Choice(3, 0, 0, 0, 0, -1), dt, b.get(), b.get(), 2, 64, nullptr),
            cudaErrorInvalidValue);  // lanes per row not a power of two
  EXPECT_EQ(cuda::LaunchGelu(dt, b.get(), b.get(), 0, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Every alignment of a row's start: input and output pointers offset by 0-15 bytes (in element
// steps: 4 for float32, 2 for the half types), with the same offset (vectors between a scalar head
// and tail) and with different ones (softmax's scalar path), on row lengths that make every row
// start at another offset (odd lengths and primes) and on aligned ones; short rows, rows of one
// block, clusters, split rows; GeLU on odd lengths at every offset.
TEST_P(MemoryBound, EveryAlignmentOffset) {
  const DType dt = GetParam();
  const int64_t es = static_cast<int64_t>(ElementSize(dt));
  const RowShape shapes[] = {{37, 1}, {37, 3}, {29, 8}, {33, 33}, {17, 64}, {65, 333},  {9, 1000},
                             {7, 1024}, {5, 4099}, {3, 50257}, {2, 100003}};
  for (int64_t k = 0; k < 16 / es; ++k) {
    const size_t e = static_cast<size_t>(k);
    for (const RowShape& s : shapes) {
      if (SmallMode() && s.cols > 5000 && k % 3 != 1) continue;
      SCOPED_TRACE(::testing::Message() << "offset " << k * es << " bytes, " << s.rows << "x" << s.cols);
      CheckSoftmax(s.rows, s.cols, {e, e}, KernelChoice{});
      CheckRowSum(s.rows, s.cols, {e, e}, KernelChoice{});
      if (k == 1 || k == 2) CheckSoftmax(s.rows, s.cols, {e, 0}, KernelChoice{});  // different offsets
    }
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{1001}, int64_t{65537}, int64_t{1000003}}) {
      if (SmallMode() && n > 100000) continue;
      CheckGelu(n, {e, e}, /*specials=*/true);
    }
  }
  // Special values in rows of every offset (odd length): -inf, NaN, +inf, huge.
  const int64_t cols = 1001;
  CheckSoftmax(7, cols, {1, 1}, KernelChoice{}, SpecialSoftmaxRows(dt, cols));
  CheckSoftmax(7, 50257, {0, 0}, KernelChoice{}, SpecialSoftmaxRows(dt, 50257));
}

// Few very long rows (1-8 rows of 10^6+ columns): split over many blocks given a workspace (the
// row sum's partial sums, the softmax's (max, sum) pairs), clusters without; aligned and offset
// starts; and the automatic plan that takes the split.
TEST_P(MemoryBound, FewLongRows) {
  const DType dt = GetParam();
  struct Case {
    int64_t rows, cols;
  };
  std::vector<Case> cases = {{1, 1000003}, {2, 1 << 20}, {3, 1000001}};
  if (!SmallMode()) {
    cases.push_back({7, 3000001});
    cases.push_back({8, 1000000});
    cases.push_back({1, 4194304 + 5});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols);
    for (size_t off : {size_t{0}, size_t{1}}) {
      CheckRowSum(c.rows, c.cols, {off, off}, KernelChoice{});
      CheckSoftmax(c.rows, c.cols, {off, off}, KernelChoice{});
    }
    CheckRowSum(c.rows, c.cols, {0, 0}, KernelChoice{}, -1.f, 1.f, nullptr, /*workspace=*/false);
    if (c.rows * c.cols <= 4 << 20) CheckSoftmax(c.rows, c.cols, {1, 1}, KernelChoice{}, nullptr, false);
  }
  CheckSoftmax(5, 1000003, {1, 1}, KernelChoice{}, SpecialSoftmaxRows(dt, 1000003));
  auto edit = [&](std::vector<uint8_t>& in) {
    StoreFromFloat(dt, in.data(), 1000003 / 2, kNaN);
    StoreFromFloat(dt, in.data(), 1000003 + 5, kInf);
  };
  CheckRowSum(3, 1000003, {1, 1}, KernelChoice{}, -1.f, 1.f, edit);
  // Forced splits of the row sum: a few, many; refused without the workspace.
  for (int split : {2, 37, 300}) {
    KernelChoice k;
    k.split = split;
    CheckRowSum(3, 1000003, {1, 1}, k);
    CheckRowSum(2, 1 << 20, {0, 0}, k);
  }
  KernelChoice k;
  k.split = 5;
  DeviceBuffer b(1 << 20);
  EXPECT_EQ(cuda::LaunchRowSumWith(k, dt, b.get(), reinterpret_cast<float*>(b.get()), 2, 65536, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Tiny tensors: a few elements to a few KiB, odd shapes, every path that such shapes reach.
TEST_P(MemoryBound, TinyTensors) {
  const RowShape shapes[] = {{1, 1}, {1, 2}, {2, 3}, {3, 5}, {21, 1000}, {7, 129}, {5, 513}, {1, 4097}, {64, 17}};
  for (const RowShape& s : shapes) {
    for (size_t off : {size_t{0}, size_t{1}}) {
      CheckSoftmax(s.rows, s.cols, {off, off}, KernelChoice{});
      CheckRowSum(s.rows, s.cols, {off, off}, KernelChoice{});
      CheckGelu(s.rows * s.cols, {off, off}, /*specials=*/false);
    }
  }
}

// Rows of 1-64 columns that take the tile kernel (softmax: rows that are not whole aligned
// vectors; row sum: also aligned rows under 128 bytes) or, softmax tensors up to 128 KiB, the tiny
// kernel: many rows (several full tiles and a partial last one), every alignment offset of the
// tensor's start (the span's scalar head and tail) with each softmax kernel forced too, in and
// out at different offsets (softmax's scalar stores), special rows (NaN, +inf, all -inf, huge)
// for every row length, and the tile forced on aligned rows.
TEST_P(MemoryBound, ShortRowTiles) {
  const DType dt = GetParam();
  const int64_t es = static_cast<int64_t>(ElementSize(dt));
  const int64_t many = SmallMode() ? 2003 : 100003;
  const int64_t some = SmallMode() ? 131 : 1003;
  const int64_t listed[] = {1, 2, 3, 7, 13, 16, 33, 62, 63, 64};
  for (int64_t cols : listed) {
    SCOPED_TRACE(::testing::Message() << many << "x" << cols);
    for (size_t off : {size_t{0}, size_t{1}}) {
      CheckSoftmax(many, cols, {off, off}, KernelChoice{});
      CheckRowSum(many, cols, {off, off}, KernelChoice{});
    }
  }
  const std::vector<int64_t> small_cols = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 33, 62, 63, 64};
  KernelChoice tile, tiny;  // each softmax kernel on every offset, whichever the size picks
  tile.tile = 1;
  tiny.tile = 2;
  for (int64_t k = 0; k < 16 / es; ++k) {
    if (SmallMode() && k > 1 && k != 16 / es - 1) continue;
    const size_t e = static_cast<size_t>(k);
    for (int64_t cols = 1; cols <= 64; ++cols) {
      if (SmallMode() && std::find(small_cols.begin(), small_cols.end(), cols) == small_cols.end()) continue;
      SCOPED_TRACE(::testing::Message() << "offset " << k * es << " bytes, " << some << "x" << cols);
      CheckSoftmax(some, cols, {e, e}, KernelChoice{});
      CheckSoftmax(some, cols, {e, e}, tile);
      CheckSoftmax(some, cols, {e, e}, tiny);
      CheckRowSum(some, cols, {e, e}, KernelChoice{});
      if (k == 1) {  // different offsets: scalar stores
        CheckSoftmax(some, cols, {e, 0}, KernelChoice{});
        CheckSoftmax(some, cols, {e, 0}, tile);
        CheckSoftmax(some, cols, {e, 0}, tiny);
      }
    }
  }
  for (int64_t cols : listed) {
    SCOPED_TRACE(::testing::Message() << "special rows, 37x" << cols);
    CheckSoftmax(37, cols, {0, 0}, KernelChoice{}, SpecialSoftmaxRows(dt, cols));
    CheckSoftmax(37, cols, {1, 1}, KernelChoice{}, SpecialSoftmaxRows(dt, cols));
    CheckSoftmax(37, cols, {1, 1}, tile, SpecialSoftmaxRows(dt, cols));
    CheckSoftmax(many, cols, {1, 1}, tiny);  // forced past its automatic size
    auto edit = [&](std::vector<uint8_t>& in) {
      auto set = [&](int64_t r, int64_t c, float v) { StoreFromFloat(dt, in.data(), r * cols + c, v); };
      set(0, cols / 2, kNaN);
      set(1, 0, kInf);
      set(2, 0, -kInf);
      set(3, 0, -kInf);
      set(3, cols - 1, kInf);  // -inf + inf = NaN (when cols > 1)
      for (int64_t c = 0; c < cols; ++c) set(4, c, Big(dt));
    };
    CheckRowSum(37, cols, {1, 1}, KernelChoice{}, -1.f, 1.f, edit);
  }
  for (int64_t cols : {int64_t{8}, int64_t{16}, int64_t{32}, int64_t{64}}) {
    CheckSoftmax(some, cols, {0, 0}, tile);
    CheckRowSum(some, cols, {0, 0}, tile);
  }
  // Every row length with 4, 8 and 16 elements per lane (fewer lanes per row), at an offset and
  // with special rows.
  for (int elems : {4, 8, 16}) {
    KernelChoice te = tile;
    te.tile_elems = elems;
    for (int64_t cols = 1; cols <= 64; ++cols) {
      if (SmallMode() && std::find(small_cols.begin(), small_cols.end(), cols) == small_cols.end()) continue;
      SCOPED_TRACE(::testing::Message() << "tile_elems " << elems << ", " << some << "x" << cols);
      CheckSoftmax(some, cols, {1, 1}, te);
      CheckRowSum(some, cols, {1, 1}, te);
      CheckSoftmax(37, cols, {1, 1}, te, SpecialSoftmaxRows(dt, cols));
    }
  }
  DeviceBuffer b(1 << 16);
  KernelChoice odd = tile;
  odd.tile_elems = 5;
  EXPECT_EQ(cuda::LaunchSoftmaxWith(odd, dt, b.get(), b.get() + 32768, 10, 7, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchRowSumWith(odd, dt, b.get(), reinterpret_cast<float*>(b.get() + 32768), 10, 7, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(tile, dt, b.get(), b.get() + 32768, 10, 65, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSoftmaxWith(tiny, dt, b.get(), b.get() + 32768, 10, 65, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchRowSumWith(tile, dt, b.get(), reinterpret_cast<float*>(b.get() + 32768), 10, 65, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Tensors of a few KiB to 1 MiB on the small-tensor paths: GeLU's one vector per thread (up to 264
// blocks of 128) with a head and a tail, short-row tiles of few rows, few softmax rows of 4096+
// accesses split over more blocks, row sums of few rows of 512-1023 accesses a block per row
// and few short edge rows.
TEST_P(MemoryBound, SmallTensorPaths) {
  for (int64_t n : {int64_t{14273}, int64_t{7 * 4096}, int64_t{3 * 11008}, int64_t{271374}, int64_t{67584 * 4 + 9}}) {
    for (size_t off : {size_t{0}, size_t{3}}) CheckGelu(n, {off, off}, /*specials=*/true);
  }
  const RowShape shapes[] = {{631, 13}, {1171, 7}, {191, 43}, {7, 128256}, {3, 65521}, {16, 50257}, {1, 32768},
                             {127, 4093}, {9, 1003}, {263, 8192 + 3}, {5, 64 + 3}};
  for (const RowShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols);
    for (size_t off : {size_t{0}, size_t{3}}) {
      CheckSoftmax(s.rows, s.cols, {off, off}, KernelChoice{});
      CheckRowSum(s.rows, s.cols, {off, off}, KernelChoice{});
    }
  }
  CheckSoftmax(7, 128256, {0, 0}, KernelChoice{}, SpecialSoftmaxRows(GetParam(), 128256));
}

// Any rank: the launchers take rows x cols, the caller flattens a rank 1-4 shape to rows = the
// product of all but the last dimension (1 for rank 1), cols = the last; GeLU takes the product.
// Each shape against the reference computed on the flattened rows.
TEST_P(MemoryBound, RanksOneToFourFlattened) {
  const std::vector<std::vector<int64_t>> shapes = {
      {100003}, {4096}, {3, 333}, {64, 1}, {1, 50257}, {3, 7, 1000}, {2, 5, 64}, {3, 5, 7, 1003}, {2, 3, 4, 64},
      {1, 1, 1, 11008}};
  for (const auto& dims : shapes) {
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
    const int64_t cols = dims.back();
    SCOPED_TRACE(::testing::Message() << "rank " << dims.size() << ": " << rows << "x" << cols);
    CheckSoftmax(rows, cols, {0, 0}, KernelChoice{});
    CheckRowSum(rows, cols, {0, 0}, KernelChoice{});
    CheckGelu(rows * cols, {0, 0}, /*specials=*/false);
  }
}

// The automatic plans for the shapes these paths were built for (host code only, runs without a
// GPU): odd row lengths take vectors with edges, few long rows take the split given a workspace.
TEST(EveryShapePlan, EdgesAndSplits) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  const DType f16 = DType::kFloat16, bf16 = DType::kBFloat16, f32 = DType::kFloat32;
  char desc[160];
  cuda::DescribeSoftmax(f16, aligned, aligned, 4096, 50257, KernelChoice{}, desc, sizeof desc,
                        cuda::SoftmaxWorkspaceBytes(f16, 4096, 50257));
  EXPECT_NE(std::string(desc).find(" edges "), std::string::npos) << desc;
  cuda::DescribeSoftmax(f32, aligned, aligned, 1000, 100003, KernelChoice{}, desc, sizeof desc, 0);
  EXPECT_NE(std::string(desc).find(" edges "), std::string::npos) << desc;
  cuda::DescribeSoftmax(f32, aligned, aligned, 30000, 333, KernelChoice{}, desc, sizeof desc, 0);  // > 8 MiB
  EXPECT_EQ(std::string(desc).rfind("softmax/rows edges", 0), 0u) << desc;
  EXPECT_GT(cuda::RowSumWorkspaceBytes(bf16, 7, 3000001), 0u);
  cuda::DescribeRowSum(bf16, aligned, 7, 3000001, KernelChoice{}, desc, sizeof desc,
                       cuda::RowSumWorkspaceBytes(bf16, 7, 3000001));
  EXPECT_EQ(std::string(desc).rfind("rowsum/split edges", 0), 0u) << desc;
  cuda::DescribeRowSum(f16, aligned, 100000, 333, KernelChoice{}, desc, sizeof desc, 0);
  EXPECT_EQ(std::string(desc).rfind("rowsum/rows edges", 0), 0u) << desc;
  EXPECT_EQ(cuda::RowSumWorkspaceBytes(f32, 65537, 64), 0u);
  EXPECT_EQ(cuda::RowSumWorkspaceBytes(bf16, 8192, 8192), 0u);
  const size_t ws = cuda::SoftmaxWorkspaceBytes(f32, 1, 1000000);
  EXPECT_GT(ws, 64u * sizeof(uint64_t));  // more blocks than the 31 of 128 KiB
  cuda::DescribeSoftmax(f32, aligned, aligned, 1, 1000000, KernelChoice{}, desc, sizeof desc, ws);
  EXPECT_NE(std::string(desc).find("split="), std::string::npos) << desc;
}

// The tile kernel takes the short rows the sweep lost on (host code only): rows of 1-64 columns that
// are not whole aligned vectors, and row-sum rows under 128 bytes; aligned softmax rows and
// row-sum rows of 8+ vectors keep the short-row kernel; the 22 benchmark shapes keep their plans
// (no tile, the same split workspace); few rows of 4096+ accesses split.
TEST(EveryShapePlan, ShortRowTilesAndBenchmarkShapes) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  const void* plus1 = reinterpret_cast<const void*>(uintptr_t{258});
  const DType f16 = DType::kFloat16, bf16 = DType::kBFloat16, f32 = DType::kFloat32;
  auto sm = [](DType dt, const void* p, int64_t rows, int64_t cols, size_t ws = 0) {
    char desc[160];
    cuda::DescribeSoftmax(dt, p, p, rows, cols, KernelChoice{}, desc, sizeof desc, ws);
    return std::string(desc);
  };
  auto rs = [](DType dt, const void* p, int64_t rows, int64_t cols) {
    char desc[160];
    cuda::DescribeRowSum(dt, p, rows, cols, KernelChoice{}, desc, sizeof desc, 0);
    return std::string(desc);
  };
  EXPECT_EQ(sm(bf16, aligned, 2 * 1652781, 1).rfind("softmax/tile tpr=1 ", 0), 0u);
  EXPECT_EQ(sm(f16, plus1, 1933946, 7).rfind("softmax/tile tpr=2 ", 0), 0u);
  EXPECT_EQ(sm(f32, aligned, 1259977, 7).rfind("softmax/tile tpr=2 ", 0), 0u);
  EXPECT_EQ(sm(f16, plus1, 1693008, 62).rfind("softmax/tile tpr=8 e=8 ", 0), 0u);
  // Tensors of such rows up to 128 KiB: the tiny kernel, aligned or not; larger ones the tile.
  EXPECT_EQ(sm(bf16, plus1, 631, 13), "softmax/tiny tpr=4 t=128");
  EXPECT_EQ(sm(f16, aligned, 1171, 7), "softmax/tiny tpr=2 t=128");
  EXPECT_EQ(sm(f16, plus1, 191, 43), "softmax/tiny tpr=16 t=128");
  EXPECT_EQ(sm(f32, aligned, 512, 64), "softmax/tiny tpr=16 t=128");
  EXPECT_EQ(sm(f32, aligned, 513, 64).rfind("softmax/rows vec", 0), 0u);
  EXPECT_EQ(sm(bf16, plus1, 73665, 13).rfind("softmax/tile tpr=2 e=8 ", 0), 0u);
  EXPECT_EQ(sm(bf16, aligned, 2 * 764180, 16).rfind("softmax/rows vec", 0), 0u);
  EXPECT_EQ(sm(f32, aligned, 1000724, 8).rfind("softmax/rows vec", 0), 0u);
  // Aligned rows of 1-7 whole vectors: the packed kernel (2 lanes per row of 2 vectors); at an
  // offset the same rows take the tile.
  EXPECT_EQ(rs(bf16, aligned, 4 * 441572, 16), "rowsum/packed tpr=2 r=4 t=256 cs");
  EXPECT_EQ(rs(f32, aligned, 1000, 4), "rowsum/packed tpr=1 r=4 t=256 cs");
  EXPECT_EQ(rs(f32, aligned, 1000, 28), "rowsum/packed tpr=8 r=4 t=256 cs");
  EXPECT_EQ(rs(f16, aligned, 1000, 24), "rowsum/packed tpr=4 r=4 t=256 cs");
  EXPECT_EQ(rs(bf16, plus1, 4 * 441572, 16).rfind("rowsum/tile tpr=4 e=4 ", 0), 0u);
  EXPECT_EQ(rs(bf16, aligned, 1000, 17).rfind("rowsum/tile ", 0), 0u);
  EXPECT_EQ(rs(f16, aligned, 2 * 1246135, 33).rfind("rowsum/tile tpr=4 e=16 ", 0), 0u);
  EXPECT_EQ(rs(bf16, aligned, 7 * 184637, 63).rfind("rowsum/tile tpr=4 e=16 ", 0), 0u);
  EXPECT_EQ(rs(f32, aligned, 1000, 1), "rowsum/tile tpr=1 e=4 rows=256 t=256 cs");
  EXPECT_EQ(rs(f32, aligned, 3365475, 44).rfind("rowsum/rows vec", 0), 0u);
  EXPECT_EQ(rs(f16, aligned, 2806056, 64).rfind("rowsum/rows vec", 0), 0u);
  EXPECT_EQ(rs(f32, aligned, 1962977, 64), "rowsum/rows vec exact tpr=8 t=256 u=2 cs");
  // Row sum, fewer than 264 rows of 32-1023 accesses: a block per row; fewer accesses or more
  // rows: the short-row kernel as before.
  const void* plus4 = reinterpret_cast<const void*>(uintptr_t{260});
  EXPECT_EQ(rs(f32, plus4, 127, 4093), "rowsum/cluster edges c=1 t=256 u=4 cs");
  EXPECT_EQ(rs(f32, aligned, 263, 2048), "rowsum/cluster vec c=1 t=256 u=4 cs");
  EXPECT_EQ(rs(f32, aligned, 264, 2048), "rowsum/rows vec tpr=32 t=256 u=8 cs");
  EXPECT_EQ(rs(f32, aligned, 120, 1000).rfind("rowsum/cluster vec c=1 t=256 ", 0), 0u);
  EXPECT_EQ(rs(bf16, aligned, 9, 1003).rfind("rowsum/cluster edges c=1 t=256 ", 0), 0u);
  EXPECT_EQ(rs(f32, aligned, 17, 251).rfind("rowsum/cluster edges c=1 t=256 ", 0), 0u);  // 62
  EXPECT_EQ(rs(f32, aligned, 120, 124).rfind("rowsum/rows vec ", 0), 0u);  // 31 accesses
  EXPECT_EQ(rs(f32, aligned, 264, 1000), "rowsum/rows vec tpr=32 t=256 u=8 cs");
  // The benchmark's shapes: none takes a tile; softmax's split workspace as before (32 blocks per
  // row of 128x1048576, none elsewhere).
  const std::pair<int64_t, int64_t> bench_shapes[] = {
      {262144, 128}, {65536, 1024}, {8192, 8192}, {2048, 32768}, {128, 1048576}};
  for (DType dt : {f32, bf16}) {
    for (const auto& [rows, cols] : bench_shapes) {
      const size_t ws = cuda::SoftmaxWorkspaceBytes(dt, rows, cols);
      EXPECT_EQ(ws, cols == 1048576 ? size_t{128 * 32 * 8} : size_t{0}) << rows << "x" << cols;
      EXPECT_EQ(sm(dt, aligned, rows, cols, ws).find("tile"), std::string::npos) << rows << "x" << cols;
      EXPECT_EQ(rs(dt, aligned, rows, cols).find("tile"), std::string::npos) << rows << "x" << cols;
      EXPECT_EQ(cuda::RowSumWorkspaceBytes(dt, rows, cols), 0u) << rows << "x" << cols;
    }
  }
  // Few rows of 4096+ accesses: the split path with more blocks (bf16 7x128256: 8 per row).
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(bf16, 7, 128256), size_t{7 * 8 * 8});
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(f32, 3, 65521), size_t{3 * 8 * 8});
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(f32, 1, 16384), 0u);  // a row program (64 KiB)
  EXPECT_GT(cuda::SoftmaxWorkspaceBytes(f32, 1, 16388), 0u);
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(f32, 1, 16380), 0u);  // 4095 accesses
  EXPECT_EQ(cuda::SoftmaxWorkspaceBytes(bf16, 132, 128256), 0u);  // enough rows
}

// Every forced variant the benchmark times, on fewer rows.
TEST_P(MemoryBound, BenchmarkVariants) {
  const DType dt = GetParam();
  for (const bench::Variant& v : bench::Variants()) {
    if (v.dtype != dt) continue;
    const int64_t rows = std::min<int64_t>(v.shape.rows, v.shape.cols >= (1 << 20) ? 2 : 300);
    if (v.op == "gelu") {
      CheckGelu((1 << 20) + 5, {0, 0}, true, v.choice);
      CheckGelu(1000, {1, 1}, true, v.choice);
    } else if (v.op == "softmax") {
      CheckSoftmax(rows, v.shape.cols, {0, 0}, v.choice);
    } else {
      CheckRowSum(rows, v.shape.cols, {0, 0}, v.choice);
    }
  }
}

// The benchmarks' L2 flush (FlushL2): every row of the buffer summed, nothing past the sums written,
// sizes that are not whole rows refused.
TEST(TimingFlush, FlushL2SumsEveryRowAndRefusesPartialRows) {
  REQUIRE_GPU();
  const int64_t rows = 3, row_floats = cuda::kFlushRowBytes / 4;
  std::vector<float> host(rows * row_floats, 0.5f);
  for (int64_t c = 0; c < row_floats; ++c) host[row_floats + c] = (c % 2) ? 1.0f : -1.0f;
  DeviceBuffer buf(rows * cuda::kFlushRowBytes), sums((rows + 1) * sizeof(float));
  ASSERT_EQ(buf.status(), cudaSuccess);
  ASSERT_EQ(sums.status(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(buf.get(), host.data(), rows * cuda::kFlushRowBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(sums.get(), 0xFF, (rows + 1) * sizeof(float)), cudaSuccess);  // NaN
  float* out = reinterpret_cast<float*>(sums.get());
  ASSERT_EQ(cuda::FlushL2(buf.get(), rows * cuda::kFlushRowBytes, out, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float got[4];
  ASSERT_EQ(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got[0], 0.5f * row_floats);
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(got[2], 0.5f * row_floats);
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_EQ(cuda::FlushL2(buf.get(), cuda::kFlushRowBytes + 16, out, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::FlushL2(buf.get(), 0, out, nullptr), cudaErrorInvalidValue);
}

// ---- More than 2^31 elements (64-bit indexing): inputs filled on the device with one value,
// outputs checked on the device. bfloat16 only (4 GiB per tensor); not for the sanitizer runs.
constexpr uint16_t kFillBits = 0x3F3F;  // bfloat16 0.74609375, from a memset of 0x3F bytes
uint16_t Bf16Bits(double v) { return FloatToBF16(static_cast<float>(v)); }

class HugeTensors : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_GPU(); }
};

TEST_F(HugeTensors, GeluOver2Pow31) {
  const int64_t n = (int64_t{1} << 31) + (1 << 20) + 3;
  DeviceBuffer in(n * 2), out(n * 2);
  ASSERT_EQ(in.status(), cudaSuccess);
  ASSERT_EQ(out.status(), cudaSuccess);
  ASSERT_EQ(cudaMemset(in.get(), 0x3F, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, n * 2), cudaSuccess);
  ASSERT_EQ(cuda::LaunchGelu(DType::kBFloat16, in.get(), out.get(), n, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const uint16_t x = kFillBits;
  const std::vector<double> g = ref::Gelu(DType::kBFloat16, &x, 1);
  EXPECT_EQ(testing::CountMismatch16(out.get(), n, Bf16Bits(g[0]), 1), 0);
}

TEST_F(HugeTensors, SoftmaxRowsOf2Pow24) {
  const int64_t rows = 129, cols = int64_t{1} << 24, n = rows * cols;
  DeviceBuffer in(n * 2), out(n * 2);
  ASSERT_EQ(in.status(), cudaSuccess);
  ASSERT_EQ(out.status(), cudaSuccess);
  ASSERT_EQ(cudaMemset(in.get(), 0x3F, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, n * 2), cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmax(DType::kBFloat16, in.get(), out.get(), rows, cols, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::CountMismatch16(out.get(), n, Bf16Bits(1.0 / cols), 0), 0);
}

TEST_F(HugeTensors, SoftmaxOver2Pow31Rows) {
  const int64_t rows = (int64_t{1} << 31) + 5;
  DeviceBuffer in(rows * 2), out(rows * 2);
  ASSERT_EQ(in.status(), cudaSuccess);
  ASSERT_EQ(out.status(), cudaSuccess);
  ASSERT_EQ(cudaMemset(in.get(), 0x3F, rows * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, rows * 2), cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmax(DType::kBFloat16, in.get(), out.get(), rows, 1, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::CountMismatch16(out.get(), rows, Bf16Bits(1.0), 0), 0);
}

TEST_F(HugeTensors, RowSumOver2Pow31) {
  const int64_t rows = 65537, cols = 32768, n = rows * cols;
  DeviceBuffer in(n * 2), out(rows * 4);
  ASSERT_EQ(in.status(), cudaSuccess);
  ASSERT_EQ(out.status(), cudaSuccess);
  ASSERT_EQ(cudaMemset(in.get(), 0x3F, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(out.get(), 0xFF, rows * 4), cudaSuccess);
  ASSERT_EQ(cuda::LaunchRowSum(DType::kBFloat16, in.get(), reinterpret_cast<float*>(out.get()), rows, cols, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::CountMismatchF32(reinterpret_cast<float*>(out.get()), rows,
                                      static_cast<float>(cols * BF16ToFloat(kFillBits)), 1e-6f),
            0);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MemoryBound,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

}  // namespace
}  // namespace fusebox
