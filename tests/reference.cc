// fp64 reference ops and comparison helpers (see reference.h).
#include "tests/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace fusebox::ref {
namespace {
double In(DType dt, const void* p, int64_t i) { return LoadAsFloat(dt, p, static_cast<size_t>(i)); }
}  // namespace

std::vector<double> Gelu(DType dt, const void* in, int64_t n) {
  std::vector<double> out(n);
  const double c = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    // 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)): the same function without the
    // cancellation of 1 + tanh(y) for very negative x.
    const double x = In(dt, in, i);
    out[i] = x / (1.0 + std::exp(-2.0 * c * (x + 0.044715 * x * x * x)));
  }
  return out;
}

std::vector<double> Softmax(DType dt, const void* in, int64_t rows, int64_t cols) {
  std::vector<double> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = In(dt, in, r * cols + c);
      nan |= std::isnan(x);
      mx = std::max(mx, x);
    }
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      // A row of -inf has no max to subtract; it yields NaN, as in PyTorch.
      const double e = std::exp(In(dt, in, r * cols + c) - mx);
      out[r * cols + c] = e;
      sum += e;
    }
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = nan ? std::numeric_limits<double>::quiet_NaN() : out[r * cols + c] / sum;
    }
  }
  return out;
}

std::vector<double> RowSum(DType dt, const void* in, int64_t rows, int64_t cols) {
  std::vector<double> out(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r] += In(dt, in, r * cols + c);
  }
  return out;
}

std::vector<double> MatmulRelu(DType dt, const void* a, const void* b, const void* bias,
                               int64_t m, int64_t n, int64_t k) {
  std::vector<double> out(m * n);
  std::vector<double> bt(k * n);
  for (int64_t i = 0; i < k * n; ++i) bt[i] = In(dt, b, i);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> acc(n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double av = In(dt, a, i * k + p);
      const double* brow = &bt[p * n];
      for (int64_t j = 0; j < n; ++j) acc[j] += av * brow[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      double v = acc[j] + (bias ? In(dt, bias, j) : 0.0);
      out[i * n + j] = std::isnan(v) ? v : (v > 0 ? v : 0.0);
    }
  }
  return out;
}

std::vector<uint8_t> RandomTensor(DType dt, int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<uint8_t> bytes(n * ElementSize(dt));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < n; ++i) StoreFromFloat(dt, bytes.data(), i, dist(rng));
  return bytes;
}

Comparison Compare(DType dt, const void* out, const std::vector<double>& ref, double rel_tol) {
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = LoadAsFloat(dt, out, i), r = ref[i];
    if (!std::isfinite(r)) {
      const bool same = std::isnan(r) ? std::isnan(o) : o == r;
      if (!same && c.first_bad < 0) c.first_bad = static_cast<int64_t>(i);
      continue;
    }
    if (!std::isfinite(o)) {
      if (c.first_bad < 0) c.first_bad = static_cast<int64_t>(i);
      continue;
    }
    // float16 cannot hold anything below 2^-24 exactly: half a subnormal step
    // of absolute error is rounding, not a fault.
    const double slack = dt == DType::kFloat16 ? 0x1p-25 : 0.0;
    const double err = std::max(0.0, std::fabs(o - r) - slack);
    num += err * err;
    den += r * r;
  }
  c.rel_error = std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
  if (den == 0) c.rel_error = std::sqrt(num);
  c.ok = c.first_bad < 0 && c.rel_error <= rel_tol;
  return c;
}

double RowSumTolerance(DType dt, const void* in, int64_t rows, int64_t cols,
                       const std::vector<double>& want) {
  double abs_norm = 0, ref_norm = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double a = 0;
    for (int64_t j = 0; j < cols; ++j) a += std::fabs(In(dt, in, r * cols + j));
    if (std::isfinite(a)) abs_norm += a * a;
    if (std::isfinite(want[r])) ref_norm += want[r] * want[r];
  }
  const double cond = ref_norm > 0 ? std::max(1.0, std::sqrt(abs_norm / ref_norm)) : 1.0;
  return 1e-5 * cond;
}

double DefaultTolerance(DType dt) {
  switch (dt) {
    case DType::kFloat32: return 1e-5;
    case DType::kFloat16: return 2e-3;
    default: return 1e-2;
  }
}

}  // namespace fusebox::ref
