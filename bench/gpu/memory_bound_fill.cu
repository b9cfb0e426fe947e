// Device-side random fill for the memory-bound benchmark: uniform values in [lo, hi) from a
// hash of (seed, index), stored as float32 / float16 / bfloat16. About 0.3 ms per GiB; keeps a
// 1 GiB input from costing seconds of host-side generation and copying on the device machine.
#include "bench/gpu/memory_bound_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"

namespace fusebox::bench {
namespace {

__device__ __forceinline__ float Uniform01(uint64_t seed, int64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void FillKernel(T* p, int64_t n, float lo, float hi, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = cuda::FromFloat<T>(lo + (hi - lo) * Uniform01(seed, i));
  }
}

}  // namespace

cudaError_t FillUniform(DType dt, void* p, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t s) {
  const unsigned blocks = 132 * 16;
  switch (dt) {
    case DType::kFloat32: FillKernel<<<blocks, 256, 0, s>>>(static_cast<float*>(p), n, lo, hi, seed); break;
    case DType::kFloat16: FillKernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(p), n, lo, hi, seed); break;
    case DType::kBFloat16:
      FillKernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, lo, hi, seed);
      break;
  }
  return cudaGetLastError();
}

}  // namespace fusebox::bench
