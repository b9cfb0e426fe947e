// CPU kernels (kernels/cpu) against the fp64 oracle (tests/reference.h): every op
// x every dtype x every instruction-set variant this CPU supports, on fresh
// random inputs (the seed is printed with any failure), odd sizes, special
// values and NaN. Outputs are poisoned with a signalling-NaN pattern first (no
// arithmetic result has it) so an element the op forgot to write is caught.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "tests/reference.h"

namespace fusebox::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using Bytes = std::vector<uint8_t>;

uint64_t FreshSeed() { return (uint64_t{std::random_device{}()} << 32) | std::random_device{}(); }

// Signalling NaN bit patterns: never produced by arithmetic or conversion.
uint16_t PoisonBits16(DType dt) { return dt == DType::kFloat16 ? 0x7d5a : 0x7f95; }
constexpr uint32_t kPoison32 = 0x7fa5a5a5u;

Bytes Poisoned(DType dt, int64_t n) {
  Bytes b(static_cast<size_t>(n) * ElementSize(dt));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::kFloat32) {
      std::memcpy(&b[i * 4], &kPoison32, 4);
    } else {
      const uint16_t p = PoisonBits16(dt);
      std::memcpy(&b[i * 2], &p, 2);
    }
  }
  return b;
}

// Index of the first element still holding the poison pattern, or -1.
int64_t FirstUnwritten(DType dt, const Bytes& b) {
  const int64_t n = static_cast<int64_t>(b.size() / ElementSize(dt));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::kFloat32) {
      uint32_t u;
      std::memcpy(&u, &b[i * 4], 4);
      if (u == kPoison32) return i;
    } else {
      uint16_t u;
      std::memcpy(&u, &b[i * 2], 2);
      if (u == PoisonBits16(dt)) return i;
    }
  }
  return -1;
}

Bytes FromFloats(DType dt, const std::vector<float>& v) {
  Bytes b(v.size() * ElementSize(dt));
  for (size_t i = 0; i < v.size(); ++i) StoreFromFloat(dt, b.data(), i, v[i]);
  return b;
}

// Smallest absolute error that can be asked of an output of dtype dt: half the
// subnormal spacing of fp16 (its outputs below 6e-5 are coarse), and for all
// dtypes 1e-15, the absolute error of the fp64 oracle's gelu for x < -5, where
// 1 + tanh(y) cancels in double (it returns -0 for x < -7.5; the kernels, which
// compute x / (1 + exp(-2y)), are the more accurate there).
double AbsFloor(DType dt) { return dt == DType::kFloat16 ? 0x1p-25 : 1e-15; }

// Passes when non-finite reference values are matched exactly (NaN by NaN, inf
// by the same inf, via ref::Compare), no finite one is met by NaN or inf, and
// ||out - ref||_2 <= tol * ||ref||_2 + AbsFloor(dt) * sqrt(n).
void ExpectMatches(DType dt, const Bytes& out, const std::vector<double>& want, double tol) {
  ASSERT_EQ(out.size(), want.size() * ElementSize(dt));
  EXPECT_EQ(FirstUnwritten(dt, out), -1) << "an output element was never written";
  const ref::Comparison c = ref::Compare(dt, out.data(), want, tol);
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    const double d = LoadAsFloat(dt, out.data(), i) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  const bool close = std::sqrt(num) <= tol * std::sqrt(den) + AbsFloor(dt) * std::sqrt(want.size());
  std::string where;
  if (c.first_bad >= 0) {
    where = " first non-finite mismatch at " + std::to_string(c.first_bad) + ": got " +
            std::to_string(LoadAsFloat(dt, out.data(), c.first_bad)) + ", want " +
            std::to_string(want[c.first_bad]);
  }
  EXPECT_TRUE(c.first_bad < 0 && close)
      << DTypeName(dt) << " rel L2 error " << c.rel_error << " (tolerance " << tol
      << ", abs error " << std::sqrt(num) << ")" << where;
}

// --- per (instruction set, dtype) -------------------------------------------

class CpuOps : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(simd::ForceIsa(isa()));
    seed_ = FreshSeed();
  }
  void TearDown() override { simd::ForceIsa(""); }
  const std::string& isa() const { return std::get<0>(GetParam()); }
  DType dt() const { return std::get<1>(GetParam()); }
  double tol() const { return ref::DefaultTolerance(dt()); }
  // A new seed per tensor; all derive from seed_, which failures print.
  Bytes Random(int64_t n, float lo, float hi) { return ref::RandomTensor(dt(), n, lo, hi, seed_ + salt_++); }
  std::string Trace() const { return "seed=" + std::to_string(seed_) + " isa=" + isa(); }

  uint64_t seed_ = 0;
  uint64_t salt_ = 0;
};

TEST_P(CpuOps, GeluMatchesReferenceOnRandomInputs) {
  SCOPED_TRACE(Trace());
  for (int64_t n : {1, 3, 17, 1000, 65537, 1 << 20}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const Bytes in = Random(n, -8.0f, 8.0f);
    Bytes out = Poisoned(dt(), n);
    ASSERT_TRUE(Gelu(dt(), in.data(), out.data(), n).ok());
    ExpectMatches(dt(), out, ref::Gelu(dt(), in.data(), n), tol());
  }
}

TEST_P(CpuOps, GeluFromPiecesCutAnywhereMatchesGeluOfTheWhole) {
  SCOPED_TRACE(Trace());
  const int64_t n = 3 * 4096 * 5 + 17;  // several L1 blocks and threads' chunks, odd
  const Bytes in = Random(n, -8.0f, 8.0f);
  Bytes want = Poisoned(dt(), n);
  ASSERT_TRUE(Gelu(dt(), in.data(), want.data(), n).ok());
  // Pieces as receive slices come: a 1-byte first one (cuts an element), empty ones, odd sizes.
  const auto* bytes = reinterpret_cast<const uint8_t*>(in.data());
  const size_t total = in.size();
  HostPieces pieces = {{bytes, 1}, {bytes + 1, 0}};
  std::mt19937_64 rng(seed_);
  for (size_t at = 1; at < total;) {
    const size_t len = std::min<size_t>(total - at, 1 + rng() % 9000);
    pieces.push_back({bytes + at, len});
    if (rng() % 7 == 0) pieces.push_back({bytes + at + len, 0});
    at += len;
  }
  Bytes got = Poisoned(dt(), n);
  ASSERT_TRUE(GeluPieces(dt(), pieces, got.data(), n).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), total)) << pieces.size() << " pieces";
  // Pieces short of n elements: refused, not read past.
  while (pieces.back().bytes == 0) pieces.pop_back();
  pieces.back().bytes -= 1;
  EXPECT_EQ(GeluPieces(dt(), pieces, got.data(), n).code(), absl::StatusCode::kInternal);
}

TEST_P(CpuOps, GeluRunsInPlace) {
  SCOPED_TRACE(Trace());
  const int64_t n = 100003;
  Bytes buf = Random(n, -5.0f, 5.0f);
  const std::vector<double> want = ref::Gelu(dt(), buf.data(), n);
  ASSERT_TRUE(Gelu(dt(), buf.data(), buf.data(), n).ok());
  ExpectMatches(dt(), buf, want, tol());
}

TEST_P(CpuOps, GeluOfLargeAndInfiniteInputsMatchesReference) {
  // +inf -> inf, -inf -> NaN (0.5 * -inf * 0 in the fp64 formula), huge negative -> -0.
  const float big = dt() == DType::kFloat16 ? 6e4f : 1e30f;
  const std::vector<float> v = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-4f, -1e-4f, 10.0f, -10.0f,
                                30.0f, -30.0f, 1e4f, -1e4f, big, -big, kInf, -kInf};
  const Bytes in = FromFloats(dt(), v);
  Bytes out = Poisoned(dt(), v.size());
  ASSERT_TRUE(Gelu(dt(), in.data(), out.data(), v.size()).ok());
  const std::vector<double> want = ref::Gelu(dt(), in.data(), v.size());
  ExpectMatches(dt(), out, want, tol());
  EXPECT_EQ(LoadAsFloat(dt(), out.data(), v.size() - 2), kInf);
  EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), v.size() - 1)));
  EXPECT_EQ(LoadAsFloat(dt(), out.data(), 11), 0.0f);  // gelu(-1e4)
}

TEST_P(CpuOps, GeluPropagatesNaN) {
  SCOPED_TRACE(Trace());
  const int64_t n = 1001;
  Bytes in = Random(n, -3.0f, 3.0f);
  for (int64_t i : {0, 7, 500, 1000}) StoreFromFloat(dt(), in.data(), i, kNaN);
  Bytes out = Poisoned(dt(), n);
  ASSERT_TRUE(Gelu(dt(), in.data(), out.data(), n).ok());
  ExpectMatches(dt(), out, ref::Gelu(dt(), in.data(), n), tol());
  for (int64_t i : {0, 7, 500, 1000}) EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), i)));
}

struct Shape {
  int64_t rows, cols;
};

TEST_P(CpuOps, SoftmaxMatchesReferenceOnRandomInputs) {
  SCOPED_TRACE(Trace());
  // Short rows (held in cache) and long rows (segmented, two passes).
  for (Shape s : std::vector<Shape>{{1, 1}, {1, 3}, {5, 1}, {7, 1000}, {2000, 3}, {300, 257},
                                    {3, 32768}, {3, 32769}, {2, 65537}, {1, 1 << 20}}) {
    SCOPED_TRACE("shape=" + std::to_string(s.rows) + "x" + std::to_string(s.cols));
    const Bytes in = Random(s.rows * s.cols, -10.0f, 10.0f);
    Bytes out = Poisoned(dt(), s.rows * s.cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), s.rows, s.cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), s.rows, s.cols), tol());
  }
}

TEST_P(CpuOps, SoftmaxRowOfNegativeInfinityIsNaN) {
  for (int64_t cols : {1, 5, 1000, 70000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    // Row 0 all -inf, row 1 ordinary.
    std::vector<float> v(2 * cols, -kInf);
    for (int64_t c = 0; c < cols; ++c) v[cols + c] = static_cast<float>(c % 7);
    const Bytes in = FromFloats(dt(), v);
    Bytes out = Poisoned(dt(), 2 * cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), 2, cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), 2, cols), tol());
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), c))) << "column " << c;
    }
  }
}

TEST_P(CpuOps, SoftmaxGivesZeroToNegativeInfinityEntries) {
  SCOPED_TRACE(Trace());
  // Long rows too, including one whose first blocks and first segment are all -inf
  // (the online max+sum must not turn that into NaN).
  for (int64_t cols : {4, 1000, 40000, 200000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    Bytes in = Random(3 * cols, -5.0f, 5.0f);
    for (int64_t c = 0; c < cols; c += 3) StoreFromFloat(dt(), in.data(), c, -kInf);
    for (int64_t c = 0; c < cols * 3 / 4; ++c) StoreFromFloat(dt(), in.data(), cols + c, -kInf);
    StoreFromFloat(dt(), in.data(), 2 * cols + cols - 1, -kInf);
    Bytes out = Poisoned(dt(), 3 * cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), 3, cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), 3, cols), tol());
    EXPECT_EQ(LoadAsFloat(dt(), out.data(), 0), 0.0f);
    EXPECT_EQ(LoadAsFloat(dt(), out.data(), cols), 0.0f);
  }
}

TEST_P(CpuOps, SoftmaxOfVeryLargeValuesDoesNotOverflow) {
  SCOPED_TRACE(Trace());
  const float big = dt() == DType::kFloat16 ? 6e4f : 1e30f;
  for (int64_t cols : {3, 1000, 50000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    Bytes in = Random(2 * cols, -1.0f, 1.0f);
    // Row 0: a few huge entries (ties) and one huge negative; row 1: all near `big`.
    StoreFromFloat(dt(), in.data(), 0, big);
    StoreFromFloat(dt(), in.data(), cols - 1, big);
    StoreFromFloat(dt(), in.data(), cols / 2, -big);
    for (int64_t c = 0; c < cols; ++c) {
      StoreFromFloat(dt(), in.data(), cols + c, big - static_cast<float>(c % 5) * big / 64);
    }
    Bytes out = Poisoned(dt(), 2 * cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), 2, cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), 2, cols), tol());
    if (cols > 3) {
      EXPECT_NEAR(LoadAsFloat(dt(), out.data(), 0), 0.5, 0.01);
    }
  }
}

TEST_P(CpuOps, SoftmaxWithPositiveInfinityMatchesReference) {
  for (int64_t cols : {1, 9, 40000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    std::vector<float> v(cols, 1.0f);
    v[cols / 2] = kInf;  // fp64: exp(inf - inf) = NaN, so the row is NaN
    const Bytes in = FromFloats(dt(), v);
    Bytes out = Poisoned(dt(), cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), 1, cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), 1, cols), tol());
  }
}

TEST_P(CpuOps, SoftmaxRowWithNaNIsNaNAndOtherRowsAreNot) {
  SCOPED_TRACE(Trace());
  for (int64_t cols : {1, 1000, 70000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    Bytes in = Random(3 * cols, -4.0f, 4.0f);
    StoreFromFloat(dt(), in.data(), cols + cols / 3, kNaN);
    Bytes out = Poisoned(dt(), 3 * cols);
    ASSERT_TRUE(Softmax(dt(), in.data(), out.data(), 3, cols).ok());
    ExpectMatches(dt(), out, ref::Softmax(dt(), in.data(), 3, cols), tol());
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), cols + c))) << "column " << c;
      ASSERT_FALSE(std::isnan(LoadAsFloat(dt(), out.data(), c))) << "column " << c;
    }
  }
}

TEST_P(CpuOps, RowSumMatchesReferenceOnRandomInputs) {
  SCOPED_TRACE(Trace());
  for (Shape s : std::vector<Shape>{{1, 1}, {1, 3}, {4, 1}, {7, 1000}, {5000, 3}, {3, 65537},
                                    {2, 200000}}) {
    SCOPED_TRACE("shape=" + std::to_string(s.rows) + "x" + std::to_string(s.cols));
    for (float lo : {0.0f, -1.0f}) {
      const Bytes in = Random(s.rows * s.cols, lo, 1.0f);
      Bytes out = Poisoned(DType::kFloat32, s.rows);
      ASSERT_TRUE(RowSum(dt(), in.data(), reinterpret_cast<float*>(out.data()), s.rows, s.cols).ok());
      // Output is float32 for every dtype; the inputs are exact, so only the
      // summation error counts.
      ExpectMatches(DType::kFloat32, out, ref::RowSum(dt(), in.data(), s.rows, s.cols), 1e-5);
    }
  }
}

TEST_P(CpuOps, RowSumStaysAccurateOverAMillionColumns) {
  SCOPED_TRACE(Trace());
  const int64_t cols = 1 << 20;
  for (int64_t rows : {1, 3}) {
    const Bytes in = Random(rows * cols, 0.0f, 1.0f);
    std::vector<float> out(rows, kNaN);
    ASSERT_TRUE(RowSum(dt(), in.data(), out.data(), rows, cols).ok());
    const std::vector<double> want = ref::RowSum(dt(), in.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(out[r], want[r], 1e-6 * want[r]) << "row " << r;
    }
  }
}

TEST_P(CpuOps, RowSumPropagatesNaNAndInfinity) {
  for (int64_t cols : {5, 1000, 70000}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    std::vector<float> v(4 * cols, 1.0f);
    v[cols / 2] = kNaN;                                // row 0: NaN
    v[cols + 1] = kInf;                                // row 1: +inf
    v[2 * cols] = kInf, v[2 * cols + cols - 1] = -kInf;  // row 2: inf - inf = NaN
    const Bytes in = FromFloats(dt(), v);
    std::vector<float> out(4, -1.0f);
    ASSERT_TRUE(RowSum(dt(), in.data(), out.data(), 4, cols).ok());
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_EQ(out[1], kInf);
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_EQ(out[3], static_cast<float>(cols));
  }
}

struct MatmulShape {
  int64_t m, n, k;
};

TEST_P(CpuOps, MatmulReluMatchesReferenceWithAndWithoutBias) {
  SCOPED_TRACE(Trace());
  for (MatmulShape s : std::vector<MatmulShape>{{1, 1, 1}, {3, 5, 7}, {7, 5, 3}, {65, 33, 129},
                                                {1, 300, 40}, {200, 1, 17}}) {
    SCOPED_TRACE("m,n,k=" + std::to_string(s.m) + "," + std::to_string(s.n) + "," +
                 std::to_string(s.k));
    const Bytes a = Random(s.m * s.k, -1.0f, 1.0f), b = Random(s.k * s.n, -1.0f, 1.0f),
                bias = Random(s.n, -1.0f, 1.0f);
    for (const void* bp : {static_cast<const void*>(nullptr), static_cast<const void*>(bias.data())}) {
      SCOPED_TRACE(bp ? "with bias" : "no bias");
      Bytes out = Poisoned(dt(), s.m * s.n);
      ASSERT_TRUE(MatmulRelu(dt(), a.data(), b.data(), bp, out.data(), s.m, s.n, s.k).ok());
      ExpectMatches(dt(), out, ref::MatmulRelu(dt(), a.data(), b.data(), bp, s.m, s.n, s.k), tol());
    }
  }
}

TEST_P(CpuOps, MatmulReluInSmallChunksMatchesReference) {
  // Half types widen A and B in chunks; tiny budgets make uneven row and column
  // chunks (float32 goes straight to sgemm and is unaffected).
  SCOPED_TRACE(Trace());
  const int64_t m = 37, n = 29, k = 11;
  const Bytes a = Random(m * k, -1.0f, 1.0f), b = Random(k * n, -1.0f, 1.0f),
              bias = Random(n, -1.0f, 1.0f);
  for (auto [operand, out_floats] : std::vector<std::pair<int64_t, int64_t>>{{100, 50}, {1, 1}, {300, 1000}}) {
    SCOPED_TRACE("budget=" + std::to_string(operand) + "," + std::to_string(out_floats));
    internal::SetMatmulChunkBudget(operand, out_floats);
    Bytes out = Poisoned(dt(), m * n);
    const absl::Status st = MatmulRelu(dt(), a.data(), b.data(), bias.data(), out.data(), m, n, k);
    internal::SetMatmulChunkBudget(0, 0);
    ASSERT_TRUE(st.ok()) << st;
    ExpectMatches(dt(), out, ref::MatmulRelu(dt(), a.data(), b.data(), bias.data(), m, n, k), tol());
  }
}

TEST_P(CpuOps, MatmulReluWithEmptyInnerDimensionIsReluOfBias) {
  const int64_t m = 3, n = 5;
  const Bytes bias = FromFloats(dt(), {-1.0f, 2.0f, 0.0f, kNaN, 0.5f});
  Bytes out = Poisoned(dt(), m * n);
  ASSERT_TRUE(MatmulRelu(dt(), nullptr, nullptr, bias.data(), out.data(), m, n, 0).ok());
  ExpectMatches(dt(), out, ref::MatmulRelu(dt(), nullptr, nullptr, bias.data(), m, n, 0), tol());
  EXPECT_EQ(LoadAsFloat(dt(), out.data(), 0), 0.0f);
  EXPECT_EQ(LoadAsFloat(dt(), out.data(), 1), 2.0f);
  EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), 3)));

  Bytes zeros = Poisoned(dt(), m * n);
  ASSERT_TRUE(MatmulRelu(dt(), nullptr, nullptr, nullptr, zeros.data(), m, n, 0).ok());
  for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(LoadAsFloat(dt(), zeros.data(), i), 0.0f);
}

TEST_P(CpuOps, MatmulReluPropagatesNaN) {
  SCOPED_TRACE(Trace());
  const int64_t m = 9, n = 11, k = 13;
  Bytes a = Random(m * k, -1.0f, 1.0f), b = Random(k * n, -1.0f, 1.0f), bias = Random(n, -1.0f, 1.0f);
  StoreFromFloat(dt(), a.data(), 2 * k + 5, kNaN);   // row 2 of the output
  StoreFromFloat(dt(), b.data(), 4 * n + 7, kNaN);   // column 7
  StoreFromFloat(dt(), bias.data(), 9, kNaN);        // column 9
  Bytes out = Poisoned(dt(), m * n);
  ASSERT_TRUE(MatmulRelu(dt(), a.data(), b.data(), bias.data(), out.data(), m, n, k).ok());
  ExpectMatches(dt(), out, ref::MatmulRelu(dt(), a.data(), b.data(), bias.data(), m, n, k), tol());
  for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), 2 * n + j)));
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), i * n + 7)));
    EXPECT_TRUE(std::isnan(LoadAsFloat(dt(), out.data(), i * n + 9)));
  }
}

TEST_P(CpuOps, EmptyTensorsWriteNothingAndSucceed) {
  Bytes out = Poisoned(dt(), 4);
  const Bytes before = out;
  EXPECT_TRUE(Gelu(dt(), nullptr, out.data(), 0).ok());
  EXPECT_TRUE(Softmax(dt(), nullptr, out.data(), 0, 7).ok());
  EXPECT_TRUE(Softmax(dt(), nullptr, out.data(), 7, 0).ok());
  EXPECT_TRUE(RowSum(dt(), nullptr, reinterpret_cast<float*>(out.data()), 0, 7).ok());
  EXPECT_TRUE(MatmulRelu(dt(), nullptr, nullptr, nullptr, out.data(), 0, 4, 3).ok());
  EXPECT_TRUE(MatmulRelu(dt(), nullptr, nullptr, nullptr, out.data(), 4, 0, 3).ok());
  EXPECT_EQ(out, before);
  // Rows of zero columns sum to 0.
  std::vector<float> sums(3, kNaN);
  EXPECT_TRUE(RowSum(dt(), nullptr, sums.data(), 3, 0).ok());
  EXPECT_EQ(sums, std::vector<float>(3, 0.0f));
}

std::string ParamName(const ::testing::TestParamInfo<CpuOps::ParamType>& info) {
  return std::get<0>(info.param) + "_" + DTypeName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllIsasAndDtypes, CpuOps,
                         ::testing::Combine(::testing::ValuesIn(simd::SupportedIsas()),
                                            ::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16)),
                         ParamName);

// --- the vector exp and fp32 gelu accuracy, per instruction set --------------

// The larger of a running worst error and a new one; a NaN stays (std::max would drop it).
double Worse(double worst, double err) { return std::isnan(err) || err > worst ? err : worst; }

class CpuMath : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(simd::ForceIsa(GetParam())); }
  void TearDown() override { simd::ForceIsa(""); }
};

TEST_P(CpuMath, ExpIsWithinTwoUlpsFromUnderflowToOverflow) {
  const simd::Kernels& k = simd::Active();
  double worst_ulps = 0;
  for (double x = -87.0; x <= 88.7; x += 0.000731) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_ulps = Worse(worst_ulps, std::abs(k.exp(xf) - want) / ulp);
  }
  EXPECT_LE(worst_ulps, 2.0);
  // Subnormal results: within one subnormal step.
  for (float x = -103.9f; x < -87.5f; x += 0.01f) {
    EXPECT_NEAR(k.exp(x), std::exp(static_cast<double>(x)), 1.5e-45) << x;
  }
  EXPECT_EQ(k.exp(-kInf), 0.0f);
  EXPECT_EQ(k.exp(-200.0f), 0.0f);
  EXPECT_EQ(k.exp(89.0f), kInf);
  EXPECT_EQ(k.exp(kInf), kInf);
  EXPECT_EQ(k.exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(k.exp(kNaN)));
}

TEST_P(CpuMath, GeluFloat32RelativeErrorIsAboutOneMillionth) {
  // Dense sweep. Per element, the error is about |u| * 1.2e-7 where u = -2y is
  // the exp argument (u is rounded to float32 before exp), so ~1e-6 for
  // x >= -3 and a few 1e-6 down to x = -5, where the output is below 3e-7.
  const int64_t n = 1 << 18;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -12.0f + 24.0f * static_cast<float>(i) / n;
  ASSERT_TRUE(Gelu(DType::kFloat32, x.data(), y.data(), n).ok());
  const std::vector<double> want = ref::Gelu(DType::kFloat32, x.data(), n);
  double worst_above_m3 = 0, worst_m5_m3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (want[i] == 0) continue;
    const double rel = std::abs(y[i] - want[i]) / std::abs(want[i]);
    if (x[i] >= -3.0f) worst_above_m3 = Worse(worst_above_m3, rel);
    else if (x[i] >= -5.0f) worst_m5_m3 = Worse(worst_m5_m3, rel);
  }
  EXPECT_LT(worst_above_m3, 1.5e-6);
  EXPECT_LT(worst_m5_m3, 4e-6);
  const ref::Comparison c = ref::Compare(DType::kFloat32, y.data(), want, 2e-7);
  EXPECT_TRUE(c.ok) << "rel_error " << c.rel_error << ", first non-finite at " << c.first_bad;
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CpuMath, ::testing::ValuesIn(simd::SupportedIsas()));

// --- threading ---------------------------------------------------------------

TEST(CpuParallel, ParallelForCoversTheRangeExactlyOnce) {
  for (int64_t n : {1, 2, 7, 1000, 123457}) {
    for (int64_t grain : {1, 10, 100000}) {
      std::vector<std::atomic<int>> hits(n);
      ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(CpuParallel, NestedAndConcurrentParallelForsComplete) {
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 50; ++rep) {
      ParallelFor(64, 1, [&](int64_t b, int64_t e) {
        ParallelFor(e - b, 1, [&](int64_t ib, int64_t ie) { total.fetch_add(ie - ib); });
      });
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 64);
}

TEST(CpuParallel, OpsFromSeveralThreadsWhileThePoolIsResizedGiveCorrectResults) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int64_t rows = 64, cols = 4099;
  const Bytes in = ref::RandomTensor(DType::kFloat32, rows * cols, -5, 5, seed);
  const std::vector<double> want = ref::Softmax(DType::kFloat32, in.data(), rows, cols);
  std::atomic<bool> stop{false};
  std::thread resizer([&] {
    for (int i = 0; !stop.load(); i = (i + 1) % 4) {
      SetCpuThreads(i + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        Bytes out = Poisoned(DType::kFloat32, rows * cols);
        if (!Softmax(DType::kFloat32, in.data(), out.data(), rows, cols).ok() ||
            !ref::Compare(DType::kFloat32, out.data(), want, 1e-5).ok) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  stop.store(true);
  resizer.join();
  SetCpuThreads(0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(CpuThreads(), 1);
}

}  // namespace
}  // namespace fusebox::cpu
