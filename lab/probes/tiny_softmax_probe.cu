// Probe: a minimal softmax for tiny tensors (no shared memory, no barrier: each group of tpr lanes
// loads its row straight from global memory, reduces with shuffles, writes), to see whether our
// 2.1 us against Triton's 1.6 us (graph replay, 631x13 bf16) is the kernel's structure or
// something every one of our softmax kernels shares. Built by hand into a .so:
//   nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -o libtiny_probe.so lab/probes/tiny_softmax_probe.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace {
template <typename T> __device__ float F(T v);
template <> __device__ float F(float v) { return v; }
template <> __device__ float F(__half v) { return __half2float(v); }
template <> __device__ float F(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ T G(float v);
template <> __device__ float G(float v) { return v; }
template <> __device__ __half G(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 G(float v) { return __float2bfloat16_rn(v); }

template <typename T, int E>
__global__ void TinySoftmax(const T* in, T* out, int64_t rows, int cols, int lg) {
  const int tpr = 1 << lg;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> lg;
  const bool act = r < rows;
  const T* ip = in + (act ? r : 0) * cols;
  float x[E];
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    x[q] = act && c < cols ? F<T>(ip[c]) : -INFINITY;
    m = fmaxf(m, x[q]);
  }
  for (int o = tpr >> 1; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.f;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    x[q] = act && c < cols ? exp2f((x[q] - m) * 1.4426950408889634f) : 0.f;
    s += x[q];
  }
  for (int o = tpr >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = __fdividef(1.f, s);
  T* op = out + (act ? r : 0) * cols;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    if (act && c < cols) op[c] = G<T>(x[q] * inv);
  }
}

template <typename T>
int Launch(const void* in, void* out, int64_t rows, int cols, int tpr, int threads, cudaStream_t s) {
  int lg = 0;
  while ((1 << lg) < tpr) ++lg;
  const int e = (cols + tpr - 1) / tpr;
  const int64_t blocks = (rows * tpr + threads - 1) / threads;
  auto* i = static_cast<const T*>(in);
  auto* o = static_cast<T*>(out);
  if (e <= 1) TinySoftmax<T, 1><<<blocks, threads, 0, s>>>(i, o, rows, cols, lg);
  else if (e <= 2) TinySoftmax<T, 2><<<blocks, threads, 0, s>>>(i, o, rows, cols, lg);
  else if (e <= 4) TinySoftmax<T, 4><<<blocks, threads, 0, s>>>(i, o, rows, cols, lg);
  else if (e <= 8) TinySoftmax<T, 8><<<blocks, threads, 0, s>>>(i, o, rows, cols, lg);
  else if (e <= 16) TinySoftmax<T, 16><<<blocks, threads, 0, s>>>(i, o, rows, cols, lg);
  else return 1;
  return static_cast<int>(cudaGetLastError());
}
}  // namespace

extern "C" int tiny_softmax(int dtype, const void* in, void* out, int64_t rows, int cols, int tpr, int threads,
                            void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 1: return Launch<float>(in, out, rows, cols, tpr, threads, s);
    case 2: return Launch<__half>(in, out, rows, cols, tpr, threads, s);
    case 3: return Launch<__nv_bfloat16>(in, out, rows, cols, tpr, threads, s);
  }
  return 1;
}
