// Device-side uniform random fill for the GPU benchmarks (memory_bound_fill.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace fusebox::bench {

cudaError_t FillUniform(DType dt, void* p, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t s);

}  // namespace fusebox::bench
