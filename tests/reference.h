// The oracle every kernel test compares with: plain loops in double precision
// over inputs widened from their dtype. Slow on purpose; never used to serve.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusebox::ref {

std::vector<double> Gelu(DType dt, const void* in, int64_t n);
std::vector<double> Softmax(DType dt, const void* in, int64_t rows, int64_t cols);
std::vector<double> RowSum(DType dt, const void* in, int64_t rows, int64_t cols);
std::vector<double> MatmulRelu(DType dt, const void* a, const void* b, const void* bias,
                               int64_t m, int64_t n, int64_t k);

// Random inputs: n values of dtype dt, uniform in [lo, hi), as raw bytes.
std::vector<uint8_t> RandomTensor(DType dt, int64_t n, float lo, float hi, uint64_t seed);

// Compares a computed buffer (dtype dt, n elements) against a reference.
// Passes when ||out - ref|| / ||ref|| <= rel_tol over finite references and
// every non-finite reference is matched exactly (NaN by NaN, +-inf by itself).
// A NaN in `out` where the reference is finite always fails. float16 outputs
// get 2^-25 of absolute slack per element (half its smallest subnormal step).
struct Comparison {
  bool ok = false;
  double rel_error = 0;  // ||out - ref||_2 / max(||ref||_2, tiny)
  int64_t first_bad = -1;  // first index with NaN / mismatched non-finite
};
Comparison Compare(DType dt, const void* out, const std::vector<double>& ref, double rel_tol);

// Tolerance for an op's output stored in dtype dt (rounding of one store).
double DefaultTolerance(DType dt);

// Tolerance for row sums accumulated in float32 against `want` (RowSum's): the error scales with
// sum |x|, not with |sum x| (a row of random signs can sum to nearly zero), so 1e-5 is scaled by
// the condition number ||row sums of |x| || / ||want||.
double RowSumTolerance(DType dt, const void* in, int64_t rows, int64_t cols,
                       const std::vector<double>& want);

}  // namespace fusebox::ref
