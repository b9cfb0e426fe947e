// The four fusebox ops on the CPU: the embedded backend on hosts without a GPU.
// Multi-threaded over rows or elements (the process-wide pool in parallel.h);
// half types are widened to float32 for arithmetic. Pointers are host memory;
// `out` must not overlap the inputs except for Gelu, which may run in place.
// Shapes were validated by the caller; these only fail on allocation.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/dtype.h"

namespace fusebox::cpu {

// out[i] = gelu_tanh(in[i]) for n elements.
absl::Status Gelu(DType dtype, const void* in, void* out, int64_t n);
// The same for an input that is the bytes of `pieces` in order (a message's receive slices, cut
// at any byte): read once through an L1 block, with no gather into one buffer first (which
// would read and write every byte once more). INTERNAL when the pieces hold fewer bytes.
absl::Status GeluPieces(DType dtype, const HostPieces& pieces, void* out, int64_t n);

// Softmax of each of `rows` rows of `cols` elements (max-subtracted).
absl::Status Softmax(DType dtype, const void* in, void* out, int64_t rows, int64_t cols);

// out[r] = sum of row r, accumulated in float32 or wider; out is float32.
absl::Status RowSum(DType dtype, const void* in, float* out, int64_t rows, int64_t cols);

// out[M,N] = relu(a[M,K] b[K,N] + bias[N]); bias may be null.
absl::Status MatmulRelu(DType dtype, const void* a, const void* b, const void* bias, void* out,
                        int64_t m, int64_t n, int64_t k);

}  // namespace fusebox::cpu
