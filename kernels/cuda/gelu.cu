// GeLU (tanh form) on the GPU, float32 / float16 / bfloat16, computed in float32.
//
// Cost: reads n elements and writes n elements once (2 n sizeof(T) bytes); arithmetic is about
// 8 instructions and 2 special-function ops per element, well under the memory time on an H200.
// In place (in == out) is safe: each element is read and written by one thread, loads first.
// Parallelisation: one thread handles kUnroll (2) 16-byte vectors (4 fp32 or 8 half values each),
// all loads issued before any use; 128-thread blocks, one block per 128 * kUnroll vectors; tensors
// of up to 264 such blocks (1 MiB) one vector per thread (more blocks, less latency per block).
// When in and out share their offset modulo 16 bytes, the few elements before the first 16-byte
// boundary (head) and after the last full vector (tail) are done by the last block, scalar,
// loaded together with its vectors.
// Otherwise (different misalignment) a scalar, coalesced grid-stride kernel runs.
//
// Formula: 0.5 x (1 + tanh(u)) == x * sigmoid(2u) == x / (1 + 2^(x (kA + kB x^2))) with
// u = sqrt(2/pi) (x + 0.044715 x^3), kA = -2 sqrt(2/pi) log2(e), kB = 0.044715 kA. Limits:
// x = +inf -> inf, x = -inf -> NaN (as the tanh form: -inf * 0), NaN -> NaN, large negative -> -0.
#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"

namespace fusebox::cuda {
namespace {

// Measured on the H200: 128 threads x 2 vectors reach the copy ceiling (4274 | 4262 GB/s fp32 |
// bf16); 256 x 4 stayed at 97%. Plain loads and stores: streaming (.cs) stores lose 2-5% when L2
// holds ordinary lines, as in a process that runs other work.
constexpr int kThreads = 128;
constexpr int kUnroll = 2;
constexpr int kSmallWaveBlocks = 264;  // two 128-thread blocks per SM of the H200
constexpr bool kDefaultStreaming = false;
constexpr float kA = -2.0f * 0.7978845608028654f * 1.4426950408889634f;
constexpr float kB = 0.044715f * kA;

__device__ __forceinline__ float GeluF(float x) {
  const float t = x * fmaf(kB, x * x, kA);
  return __fdividef(x, 1.0f + Ex2(t));
}

// Vector body over [head, head + nvec * W); head / tail scalars by the last block.
template <typename T, int U>
__global__ __launch_bounds__(1024) void GeluVecKernel(const T* in, T* out, int64_t nvec, int head, int tail,
                                                      bool cs) {
  constexpr int W = 16 / sizeof(T);
  using R = uint4;
  const R* src = reinterpret_cast<const R*>(in + head);
  R* dst = reinterpret_cast<R*>(out + head);
  const int nt = blockDim.x;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (nt * U) + threadIdx.x;
  R v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + u * nt;
    if (i < nvec) v[u] = LoadHint(cs, src + i);
  }
  // The head / tail scalar is loaded with the vectors, not after them: a second dependent trip to
  // memory in the last block was most of the time of a small tensor (7x4096 fp16 +3: 0.82x).
  // U <= 2 only (the automatic choices; 0-5 more registers, still <= 32); the forced U = 4 / 8
  // variants keep the later load and their register counts.
  const int tid = static_cast<int>(threadIdx.x);
  const bool edge = blockIdx.x == gridDim.x - 1 && tid < head + tail;
  const int64_t ei = tid < head ? tid : head + nvec * W + (tid - head);
  T xe{};
  if constexpr (U <= 2) {
    if (edge) xe = LoadHint(cs, in + ei);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + u * nt;
    if (i < nvec) {
      float f[W];
      Unpack<T, W>(v[u], f);
#pragma unroll
      for (int e = 0; e < W; ++e) f[e] = GeluF(f[e]);
      StoreHint(cs, dst + i, PackFloats<T, W>(f));
    }
  }
  if (edge) {
    if constexpr (U > 2) xe = LoadHint(cs, in + ei);
    StoreHint(cs, out + ei, FromFloat<T>(GeluF(ToFloat<T>(xe))));
  }
}

template <typename T>
__global__ __launch_bounds__(kThreads) void GeluScalarKernel(const T* in, T* out, int64_t n, bool cs) {
  constexpr int U = 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * U;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * U + threadIdx.x; base < n; base += stride) {
    T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n) v[u] = LoadHint(cs, in + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n) StoreHint(cs, out + i, FromFloat<T>(GeluF(ToFloat<T>(v[u]))));
    }
  }
}

template <typename T>
cudaError_t LaunchGeluT(const KernelChoice& k, const void* in_v, void* out_v, int64_t n, cudaStream_t s) {
  const T* in = static_cast<const T*>(in_v);
  T* out = static_cast<T*>(out_v);
  constexpr int W = 16 / sizeof(T);
  const bool cs = k.streaming == 0 ? kDefaultStreaming : k.streaming > 0;
  // Tensors under one wave of 2-vector blocks (132 SMs x 2 blocks x 128 threads x 2 vectors: up to
  // 1 MiB): one vector per thread, twice the blocks, half the serial work per thread (latency, not
  // bandwidth, is their cost; 3x11008 bf16 ran 0.86x of Triton with 17 blocks).
  const int64_t nvec_all = n / W;
  const int unroll = k.vectors_per_thread ? k.vectors_per_thread
                     : nvec_all <= int64_t{kSmallWaveBlocks} * kThreads * kUnroll ? 1
                                                                                    : kUnroll;
  const int threads = k.threads ? k.threads : kThreads;
  if ((unroll != 1 && unroll != 2 && unroll != 4 && unroll != 8) || threads < 32 || threads > 1024 || threads % 32 != 0) {
    return cudaErrorInvalidValue;
  }
  const uintptr_t ia = reinterpret_cast<uintptr_t>(in), oa = reinterpret_cast<uintptr_t>(out);
  const bool elem_aligned = ia % sizeof(T) == 0 && oa % sizeof(T) == 0;
  if (elem_aligned && ia % 16 == oa % 16) {
    int head = static_cast<int>(((16 - ia % 16) % 16) / sizeof(T));
    if (head > n) head = static_cast<int>(n);
    const int64_t nvec = (n - head) / W;
    const int tail = static_cast<int>(n - head - nvec * W);
    const int64_t blocks = nvec > 0 ? CeilDiv(nvec, static_cast<int64_t>(threads) * unroll) : 1;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const unsigned g = static_cast<unsigned>(blocks);
    switch (unroll) {
      case 1: GeluVecKernel<T, 1><<<g, threads, 0, s>>>(in, out, nvec, head, tail, cs); break;
      case 2: GeluVecKernel<T, 2><<<g, threads, 0, s>>>(in, out, nvec, head, tail, cs); break;
      case 4: GeluVecKernel<T, 4><<<g, threads, 0, s>>>(in, out, nvec, head, tail, cs); break;
      default: GeluVecKernel<T, 8><<<g, threads, 0, s>>>(in, out, nvec, head, tail, cs); break;
    }
  } else {
    const int64_t blocks = std::min<int64_t>(CeilDiv(n, kThreads * 8), 132 * 64);
    GeluScalarKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(in, out, n, cs);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGeluWith(const KernelChoice& k, DType dt, const void* in, void* out, int64_t n, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: return LaunchGeluT<float>(k, in, out, n, s);
    case DType::kFloat16: return LaunchGeluT<__half>(k, in, out, n, s);
    case DType::kBFloat16: return LaunchGeluT<__nv_bfloat16>(k, in, out, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGelu(DType dt, const void* in, void* out, int64_t n, cudaStream_t s) {
  return LaunchGeluWith(KernelChoice{}, dt, in, out, n, s);
}

}  // namespace fusebox::cuda
