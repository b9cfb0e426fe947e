// Row sum over the last axis on the GPU: float32 / float16 / bfloat16 in, float32 out,
// float32 accumulation (half types widened exactly).
//
// Cost: reads every element once (rows cols sizeof(T) bytes) and writes rows floats; about one
// add per element. Read-only streaming: each thread keeps several 16-byte loads in flight.
// Kernels, picked by row length in 16-byte accesses (nacc = cols / W, W = 16 / sizeof(T)):
//  - short rows (nacc < 1024): a group of `tpr` lanes (4..32) per row, each lane summing every
//    tpr-th access, kUnroll loads in flight; shuffle reduction in the group; 256-thread blocks.
//  - long rows: C blocks per row (C = 1 plain, else a thread-block cluster), kLongUnroll loads in
//    flight per thread (16 on long fp32 chunks); each block sums its chunk, the cluster's block 0
//    adds the C partial sums from distributed shared memory in rank order (deterministic, no
//    atomics, no workspace) and writes the row's result.
// Rows or pointers not 16-byte aligned use the same kernels with W = 1 (coalesced scalar access).
#include <algorithm>
#include <climits>
#include <cstdio>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace fusebox::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;      // short rows: loads in flight per lane
constexpr int kLongUnroll = 4;  // long rows: loads in flight per thread (32 registers: 64 warps/SM)
constexpr bool kDefaultStreaming = true;  // .cs loads unless KernelChoice::streaming says

template <typename T, int W>
__device__ __forceinline__ float SumAccess(const typename Pack<T, W>::Raw& r) {
  float f[W];
  Unpack<T, W>(r, f);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < W; ++e) s += f[e];
  return s;
}

// Sums accesses first, first + step, ... < n of src, U loads in flight.
template <typename T, int W, int U = kUnroll>
__device__ __forceinline__ float StridedSum(const typename Pack<T, W>::Raw* src, int first, int n, int step,
                                            bool cs) {
  using R = typename Pack<T, W>::Raw;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int a = first;
  for (; a + (U - 1) * step < n; a += U * step) {
    R x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = LoadHint(cs, src + a + u * step);
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u & 3] += SumAccess<T, W>(x[u]);
  }
  // Tail: still issue the loads together.
  R x[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (a + u * step < n) x[u] = LoadHint(cs, src + a + u * step);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (a + u * step < n) acc[u & 3] += SumAccess<T, W>(x[u]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <typename T, int W>
__global__ __launch_bounds__(1024) void RowSumSmallKernel(const T* in, float* out, int64_t rows, int nacc,
                                                          int tpr, bool cs) {
  using R = typename Pack<T, W>::Raw;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  float s = 0.f;
  if (row < rows) s = StridedSum<T, W>(reinterpret_cast<const R*>(in) + row * nacc, lane, nacc, tpr, cs);
  s = GroupSum(s, tpr);
  if (lane == 0 && row < rows) out[row] = s;
}

// grid.x = rows * csize; cluster (csize, 1, 1) when csize > 1. U loads in flight per thread, at
// most MaxT threads per block (the default is U = kLongUnroll, MaxT = kThreads; others are variants).
template <typename T, int W, int U = kLongUnroll, int MaxT = kThreads>
__global__ __launch_bounds__(MaxT) void RowSumChunkKernel(const T* in, float* out, int nacc, int chunk,
                                                              int csize, bool cs) {
  using R = typename Pack<T, W>::Raw;
  __shared__ float scratch[33];
  __shared__ float block_sum;
  const int rank = csize > 1 ? static_cast<int>(ClusterRank()) : 0;
  const int64_t row = blockIdx.x / csize;
  const int a0 = rank * chunk;
  const int n = max(0, min(nacc - a0, chunk));
  const float s = BlockSum(StridedSum<T, W, U>(reinterpret_cast<const R*>(in) + row * nacc + a0,
                                            threadIdx.x, n, blockDim.x, cs),
                           scratch);
  if (csize == 1) {
    if (threadIdx.x == 0) out[row] = s;
    return;
  }
  if (threadIdx.x == 0) block_sum = s;
  ClusterArrive();
  ClusterWait();
  if (rank == 0 && threadIdx.x == 0) {
    float total = 0.f;
    for (int r = 0; r < csize; ++r) total += LoadRemoteF(MapRank(&block_sum, static_cast<uint32_t>(r)));
    out[row] = total;
  }
  ClusterArrive();  // block 0 has read every partial before anyone leaves
  ClusterWait();
}

// The long-row kernel for `threads` per block and `unroll` loads in flight, or null where that pair
// is not built: 256 x 4 / 8 / 16 and 512 x 8. Measured slower and not built: 1024-thread blocks
// (~30% at 8192 columns, run 5); 512 x 1 / 2 / 4, 256 x 2 and 128 x 8 (0.3-16%, runs 21-22).
template <typename T, int W>
const void* LongKernel(int threads, int unroll) {
  auto k = [](auto kernel) { return reinterpret_cast<const void*>(kernel); };
  if (threads == kThreads) {
    switch (unroll) {
      case 4: return k(RowSumChunkKernel<T, W, 4, kThreads>);
      case 8: return k(RowSumChunkKernel<T, W, 8, kThreads>);
      case 16: return k(RowSumChunkKernel<T, W, 16, kThreads>);
    }
  } else if (threads == 512 && unroll == 8) {
    return k(RowSumChunkKernel<T, W, 8, 512>);
  }
  return nullptr;
}

struct Plan {
  bool vec = false;
  bool small = false;
  int nacc = 0;
  int tpr = 0;
  int csize = 1, threads = kThreads, chunk = 0;
  int unroll = kLongUnroll;  // long rows: loads in flight per thread
  bool cs = true;
};

template <typename T>
cudaError_t MakePlan(const KernelChoice& k, const void* in, int64_t rows, int64_t cols, Plan* p) {
  constexpr int W = 16 / sizeof(T);
  p->vec = cols % W == 0 && Aligned16(in);
  const int64_t nacc64 = p->vec ? cols / W : cols;
  if (nacc64 > INT_MAX / 2) return cudaErrorInvalidValue;
  p->nacc = static_cast<int>(nacc64);
  p->cs = k.streaming == 0 ? kDefaultStreaming : k.streaming > 0;
  const int nacc = p->nacc;
  // 1024 accesses (16 KiB) and longer: a block per row beats a warp per row (bf16 8192 columns:
  // 4011 vs 3888 GB/s in one run, NOTES.md run 4).
  p->small = k.long_rows < 0 || (k.long_rows == 0 && nacc < 1024);
  if (p->small) {
    // One lane per 64 elements, at least 4 and at most 32 (measured best on the H200 for 128,
    // 1024 and 8192 columns, fp32 and bf16; NOTES.md).
    p->tpr = k.threads_per_row ? k.threads_per_row : std::min(32, std::max(4, Pow2Ceil(CeilDiv(cols, 64))));
    if (p->tpr < 1 || p->tpr > 32 || (p->tpr & (p->tpr - 1)) != 0) return cudaErrorInvalidValue;
    p->threads = k.threads ? k.threads : kThreads;
    if (p->threads != 256 && p->threads != 512 && p->threads != 1024) return cudaErrorInvalidValue;
    return cudaSuccess;
  }
  // Long rows: about 8192 accesses (128 KiB) or more per block, up to 8 blocks per row.
  p->csize = k.cluster ? k.cluster : std::min(8, Pow2Ceil(CeilDiv(nacc, 8192)));
  if (p->csize < 1 || p->csize > 8) return cudaErrorInvalidValue;
  p->threads = k.threads ? k.threads : kThreads;
  // 4 loads in flight x 256 threads: 32 registers, 8 blocks per SM. Against 8 loads (56 registers,
  // 4 blocks): fp32 8192^2 +2%, 128x1048576 +3%, bf16 128x1048576 +1%, bf16 8192^2 equal (run 5).
  // 4-byte types with >= 64 accesses per thread: 16 loads in flight, fp32 128x1048576 +1.4-1.8%
  // more (bf16 there loses 9%: twice the conversions per byte, 2 blocks per SM do not hide them).
  const bool deep =
      sizeof(T) == 4 && p->vec && p->threads == kThreads && CeilDiv(nacc, p->csize) >= 64 * kThreads;
  p->unroll = k.vectors_per_thread ? k.vectors_per_thread : deep ? 16 : kLongUnroll;
  if (LongKernel<T, 1>(p->threads, p->unroll) == nullptr) return cudaErrorInvalidValue;
  if (rows * p->csize > INT_MAX) return cudaErrorInvalidValue;
  p->chunk = static_cast<int>(CeilDiv(nacc, p->csize));
  return cudaSuccess;
}

template <typename T, int W>
cudaError_t LaunchPlanW(const Plan& p, const void* in_v, float* out, int64_t rows, cudaStream_t s) {
  const T* in = static_cast<const T*>(in_v);
  if (p.small) {
    const int64_t blocks = CeilDiv(rows, p.threads / p.tpr);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    RowSumSmallKernel<T, W><<<static_cast<unsigned>(blocks), p.threads, 0, s>>>(in, out, rows, p.nacc, p.tpr, p.cs);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * p.csize));
  cfg.blockDim = dim3(p.threads);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = p.csize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = p.csize > 1 ? 1 : 0;
  int nacc = p.nacc, chunk = p.chunk, csize = p.csize;
  bool cs = p.cs;
  void* args[] = {&in, &out, &nacc, &chunk, &csize, &cs};
  const cudaError_t e = cudaLaunchKernelExC(&cfg, LongKernel<T, W>(p.threads, p.unroll), args);  // MakePlan checked it
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T>
cudaError_t LaunchRowSumT(const KernelChoice& k, const void* in, float* out, int64_t rows, int64_t cols,
                          cudaStream_t s) {
  Plan p;
  const cudaError_t e = MakePlan<T>(k, in, rows, cols, &p);
  if (e != cudaSuccess) return e;
  return p.vec ? LaunchPlanW<T, 16 / sizeof(T)>(p, in, out, rows, s) : LaunchPlanW<T, 1>(p, in, out, rows, s);
}

}  // namespace

cudaError_t LaunchRowSumWith(const KernelChoice& k, DType dt, const void* in, float* out, int64_t rows,
                             int64_t cols, cudaStream_t s) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (out == nullptr || (cols > 0 && in == nullptr)) return cudaErrorInvalidValue;
  if (cols == 0) return cudaMemsetAsync(out, 0, static_cast<size_t>(rows) * sizeof(float), s);
  switch (dt) {
    case DType::kFloat32: return LaunchRowSumT<float>(k, in, out, rows, cols, s);
    case DType::kFloat16: return LaunchRowSumT<__half>(k, in, out, rows, cols, s);
    case DType::kBFloat16: return LaunchRowSumT<__nv_bfloat16>(k, in, out, rows, cols, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchRowSum(DType dt, const void* in, float* out, int64_t rows, int64_t cols, cudaStream_t s) {
  return LaunchRowSumWith(KernelChoice{}, dt, in, out, rows, cols, s);
}

void DescribeRowSum(DType dt, const void* in, int64_t rows, int64_t cols, const KernelChoice& k, char* buf,
                    int len) {
  Plan p;
  cudaError_t e = cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: e = MakePlan<float>(k, in, rows, cols, &p); break;
    case DType::kFloat16: e = MakePlan<__half>(k, in, rows, cols, &p); break;
    case DType::kBFloat16: e = MakePlan<__nv_bfloat16>(k, in, rows, cols, &p); break;
  }
  if (e != cudaSuccess) {
    std::snprintf(buf, len, "rowsum/invalid");
  } else if (p.small) {
    std::snprintf(buf, len, "rowsum/rows %s tpr=%d t=%d %s", p.vec ? "vec" : "scalar", p.tpr, p.threads,
                  p.cs ? "cs" : "plain");
  } else {
    std::snprintf(buf, len, "rowsum/cluster %s c=%d t=%d u=%d %s", p.vec ? "vec" : "scalar", p.csize, p.threads,
                  p.unroll, p.cs ? "cs" : "plain");
  }
}

}  // namespace fusebox::cuda
