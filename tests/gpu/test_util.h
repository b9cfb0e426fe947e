// Device-side checks for the GPU tests whose outputs are too large to copy back and compare on
// the host (tensors over 2^31 elements). Each call is synchronous; returns -1 on a CUDA error.
#pragma once

#include <cstdint>

namespace fusebox::testing {

// Elements of a 16-bit buffer whose bit pattern differs from `expect` by more than `tol` (as
// unsigned integers: adjacent values of one sign), or that are NaN.
int64_t CountMismatch16(const void* d, int64_t n, uint16_t expect, int tol);
// Elements of a float buffer with |x - expect| > rel_tol |expect|, or NaN.
int64_t CountMismatchF32(const float* d, int64_t n, float expect, float rel_tol);

}  // namespace fusebox::testing
