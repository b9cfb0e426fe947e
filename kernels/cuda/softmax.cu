// Softmax over the last axis on the GPU, float32 / float16 / bfloat16, float32 arithmetic.
//
// Cost: one read and one write of every element (2 rows cols sizeof(T) bytes) for rows up to
// 2^20 fp32 / 2^21 half elements, which are held on chip (registers + shared memory) between the
// reduction and the output pass. Longer rows read the part that does not fit a second time (from
// L2 where it still is). Arithmetic: two exp2 per element (sum, output), about 10 instructions.
//
// Kernels, picked by row length in 16-byte accesses (nacc = cols / W, W = 16 / sizeof(T)):
//  - short rows (nacc <= 512): a group of `tpr` lanes (1..32) per row, each lane holding VPT
//    accesses in registers; max and sum by warp shuffles within the group; 256-thread blocks.
//  - long rows: a thread-block cluster of C blocks per row (C = 1 is a plain block per row); each
//    block holds its chunk of the row in registers (threads x VPT accesses), then in shared memory
//    (filled by the bulk-copy engine, cp.async.bulk, completing on an mbarrier), and streams any
//    remainder twice. Each thread reduces its values to a (max, sum of e^(x-max)) pair, the block
//    combines pairs, the cluster combines the blocks' pairs through distributed shared memory
//    (one cluster barrier), then every block writes its chunk: e^(x - max) / sum.
//    C <= 8 and registers only up to 32768 accesses (512 KiB fp32); beyond that C = 16
//    (non-portable cluster, when the device can co-schedule it) or 8, with 224 KiB shared memory
//    per block: 16 x 256 KiB = 4 MiB, one 2^20 fp32 row, held on chip.
// Rows or pointers not 16-byte aligned use the same kernels with W = 1 (coalesced scalar access).
//
// Special values (as tests/reference.cc and PyTorch): a NaN or +inf in a row makes its sum NaN and
// so the whole row NaN; a row of only -inf has max -inf and e^(-inf - -inf) = NaN everywhere;
// -inf next to finite values gives 0. See MaxSum in common.cuh for the partial-state rules.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace fusebox::cuda {
namespace {

constexpr int kSmallThreads = 256;
constexpr int kChunkMaxThreads = 512;
constexpr int kBigSmemBytes = 224 * 1024;   // row data per block on the cluster path
constexpr uint32_t kBulkPiece = 32 * 1024;  // bytes per cp.async.bulk

// ------------------------------------------------------------------------------ short rows
template <typename T, int W, int VPT>
__global__ __launch_bounds__(kSmallThreads) void SoftmaxSmallKernel(const T* in, T* out, int64_t rows,
                                                                    int nacc, int tpr) {
  using R = typename Pack<T, W>::Raw;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kSmallThreads / tpr) + threadIdx.x / tpr;
  const bool active = row < rows;
  const R* src = reinterpret_cast<const R*>(in) + (active ? row : 0) * nacc;
  R* dst = reinterpret_cast<R*>(out) + (active ? row : 0) * nacc;
  R v[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = lane + j * tpr;
    if (active && a < nacc) v[j] = LoadStream(src + a);
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = lane + j * tpr;
    if (active && a < nacc) {
      float f[W];
      Unpack<T, W>(v[j], f);
#pragma unroll
      for (int e = 0; e < W; ++e) m = fmaxf(m, f[e]);
    }
  }
  m = GroupMax(m, tpr);  // the row max: no partial-state rules needed below
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = lane + j * tpr;
    if (active && a < nacc) {
      float f[W];
      Unpack<T, W>(v[j], f);
#pragma unroll
      for (int e = 0; e < W; ++e) s += ExpDiff(f[e], m);
    }
  }
  s = GroupSum(s, tpr);
  const float inv = 1.0f / s;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = lane + j * tpr;
    if (active && a < nacc) {
      float f[W];
      Unpack<T, W>(v[j], f);
#pragma unroll
      for (int e = 0; e < W; ++e) f[e] = ExpDiff(f[e], m) * inv;
      StoreStream(dst + a, PackFloats<T, W>(f));
    }
  }
}

// ------------------------------------------------------------------------------ long rows
template <typename T, int W>
__device__ __forceinline__ void AccumulateMax(const typename Pack<T, W>::Raw& r, float& m) {
  float f[W];
  Unpack<T, W>(r, f);
#pragma unroll
  for (int e = 0; e < W; ++e) m = fmaxf(m, f[e]);
}
template <typename T, int W>
__device__ __forceinline__ void AccumulateSum(const typename Pack<T, W>::Raw& r, float m, float& s) {
  float f[W];
  Unpack<T, W>(r, f);
#pragma unroll
  for (int e = 0; e < W; ++e) s += Term(f[e], m);
}
// Online update with one access: one rescale per access, not per element.
template <typename T, int W>
__device__ __forceinline__ void AccumulateOnline(const typename Pack<T, W>::Raw& r, MaxSum& st) {
  float f[W];
  Unpack<T, W>(r, f);
  float vm = f[0];
#pragma unroll
  for (int e = 1; e < W; ++e) vm = fmaxf(vm, f[e]);
  const float m = fmaxf(st.m, vm);
  float s = Rescale(st.s, st.m, m);
#pragma unroll
  for (int e = 0; e < W; ++e) s += Term(f[e], m);
  st = {m, s};
}
template <typename T, int W>
__device__ __forceinline__ typename Pack<T, W>::Raw Output(const typename Pack<T, W>::Raw& r, float m, float inv) {
  float f[W];
  Unpack<T, W>(r, f);
#pragma unroll
  for (int e = 0; e < W; ++e) f[e] = ExpDiff(f[e], m) * inv;
  return PackFloats<T, W>(f);
}

// grid.x = rows * csize; cluster (csize, 1, 1) when csize > 1. smem_acc: accesses of the chunk
// held in dynamic shared memory (vector path only).
template <typename T, int W, int VPT>
__global__ __launch_bounds__(kChunkMaxThreads) void SoftmaxChunkKernel(const T* in, T* out, int nacc, int chunk,
                                                                       int csize, int smem_acc) {
  using R = typename Pack<T, W>::Raw;
  extern __shared__ __align__(128) uint4 row_smem[];
  __shared__ MaxSum scratch[33];
  __shared__ MaxSum block_result, cluster_result;
  __shared__ __align__(8) uint64_t bar;

  const int rank = csize > 1 ? static_cast<int>(ClusterRank()) : 0;
  const int64_t row = blockIdx.x / csize;
  const int a0 = rank * chunk;
  const int n = max(0, min(nacc - a0, chunk));
  const R* src = reinterpret_cast<const R*>(in) + row * nacc + a0;
  R* dst = reinterpret_cast<R*>(out) + row * nacc + a0;
  const int t = threadIdx.x, nt = blockDim.x;
  const int nreg = min(n, nt * VPT);
  const int nsm = min(n - nreg, smem_acc);
  const int nstart = nreg + nsm;  // first streamed access
  const R* sm = reinterpret_cast<const R*>(row_smem);

  // 1. Issue every load: registers, the bulk copy into shared memory, then stream the rest.
  R v[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = t + j * nt;
    if (a < nreg) v[j] = LoadStream(src + a);
  }
  if constexpr (Pack<T, W>::kVec) {
    if (nsm > 0 && t == 0) {
      MbarInit(&bar, 1);
      const uint32_t bytes = static_cast<uint32_t>(nsm) * 16u;
      MbarArriveExpectTx(&bar, bytes);
      const char* g = reinterpret_cast<const char*>(src + nreg);
      char* d = reinterpret_cast<char*>(row_smem);
      for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
        BulkLoad(d + off, g + off, min(kBulkPiece, bytes - off), &bar);
      }
    }
    __syncthreads();  // the mbarrier is initialised before anyone waits on it
  }
  MaxSum st{-INFINITY, 0.f};
  {
    int a = nstart + t;
    for (; a + 3 * nt < n; a += 4 * nt) {
      R x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = LoadKeep(src + a + u * nt);
#pragma unroll
      for (int u = 0; u < 4; ++u) AccumulateOnline<T, W>(x[u], st);
    }
    for (; a < n; a += nt) AccumulateOnline<T, W>(LoadKeep(src + a), st);
  }

  // 2. This thread's (max, sum) over everything it holds.
  float m = st.m;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if (t + j * nt < nreg) AccumulateMax<T, W>(v[j], m);
  }
  if constexpr (Pack<T, W>::kVec) {
    if (nsm > 0) MbarWait(&bar, 0);
    for (int a = t; a < nsm; a += nt) AccumulateMax<T, W>(sm[a], m);
  }
  float s = Rescale(st.s, st.m, m);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if (t + j * nt < nreg) AccumulateSum<T, W>(v[j], m, s);
  }
  if constexpr (Pack<T, W>::kVec) {
    for (int a = t; a < nsm; a += nt) AccumulateSum<T, W>(sm[a], m, s);
  }

  // 3. Block, then cluster.
  MaxSum tot = BlockReduce(MaxSum{m, s}, scratch);
  if (csize > 1) {
    if (t == 0) block_result = tot;
    ClusterArrive();
    ClusterWait();
    if (t < 32) {
      MaxSum r{-INFINITY, 0.f};
      if (t < csize) {
        const float2 x = LoadRemoteF2(MapRank(&block_result, static_cast<uint32_t>(t)));
        r = {x.x, x.y};
      }
      r = WarpReduce(r);
      if (t == 0) cluster_result = r;
    }
    ClusterArrive();  // this block is done reading the others' shared memory
    __syncthreads();
    tot = cluster_result;
  }

  // 4. Output pass.
  const float M = tot.m;
  const float inv = 1.0f / tot.s;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = t + j * nt;
    if (a < nreg) StoreStream(dst + a, Output<T, W>(v[j], M, inv));
  }
  if constexpr (Pack<T, W>::kVec) {
    for (int a = t; a < nsm; a += nt) StoreStream(dst + nreg + a, Output<T, W>(sm[a], M, inv));
  }
  {
    int a = nstart + t;
    for (; a + 3 * nt < n; a += 4 * nt) {
      R x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = LoadStream(src + a + u * nt);
#pragma unroll
      for (int u = 0; u < 4; ++u) StoreStream(dst + a + u * nt, Output<T, W>(x[u], M, inv));
    }
    for (; a < n; a += nt) StoreStream(dst + a, Output<T, W>(LoadStream(src + a), M, inv));
  }
  if (csize > 1) ClusterWait();  // nobody leaves while another block may still read its result
}

// ------------------------------------------------------------------------------ host side
struct Plan {
  bool vec = false;
  bool small = false;
  int nacc = 0;
  int tpr = 0, vpt = 0;                      // short rows
  int csize = 1, threads = 0, smem_acc = 0;  // long rows
  int chunk = 0;
};

int CurrentDevice() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) d = 0;
  return d;
}

// Per kernel instance and device: raises the dynamic shared-memory limit and allows clusters of
// 16 once; returns the largest cluster size (16 or 8) that the device can co-schedule for the
// big configuration (512 threads, 224 KiB). Thread-safe (idempotent attribute calls; racing first
// calls compute the same answer).
template <typename T, int W, int VPT>
int PrepareBigKernel() {
  static std::atomic<int> cache[64];
  const int slot = CurrentDevice() & 63;
  int c = cache[slot].load(std::memory_order_acquire);
  if (c != 0) return c;
  auto kernel = SoftmaxChunkKernel<T, W, VPT>;
  c = 8;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigSmemBytes);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(16 * 16);
    cfg.blockDim = dim3(kChunkMaxThreads);
    cfg.dynamicSmemBytes = kBigSmemBytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 16;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters >= 1) c = 16;
  }
  cudaGetLastError();  // a refused query leaves no error behind for the caller's launch check
  cache[slot].store(c, std::memory_order_release);
  return c;
}

template <typename T, int W>
int BigClusterLimit(int vpt) {
  return vpt == 8 ? PrepareBigKernel<T, W, 8>() : PrepareBigKernel<T, W, 4>();
}

int RoundUp32(int64_t x) { return static_cast<int>(std::max<int64_t>(32, CeilDiv(x, 32) * 32)); }

template <typename T>
cudaError_t MakePlan(const KernelChoice& k, const void* in, const void* out, int64_t rows, int64_t cols,
                     Plan* p) {
  constexpr int W = 16 / sizeof(T);
  p->vec = cols % W == 0 && Aligned16(in) && Aligned16(out);
  const int64_t nacc64 = p->vec ? cols / W : cols;
  if (nacc64 > INT_MAX / 2) return cudaErrorInvalidValue;
  p->nacc = static_cast<int>(nacc64);
  const int nacc = p->nacc;
  p->small = k.long_rows < 0 || (k.long_rows == 0 && nacc <= 512);
  if (p->small) {
    p->vpt = k.vectors_per_thread ? k.vectors_per_thread : nacc <= 128 ? 4 : nacc <= 256 ? 8 : 16;
    if (p->vpt != 4 && p->vpt != 8 && p->vpt != 16) return cudaErrorInvalidValue;
    p->tpr = k.threads_per_row ? k.threads_per_row
                               : std::min(32, Pow2Ceil(CeilDiv(nacc, p->vpt)));
    if (p->tpr < 1 || p->tpr > 32 || (p->tpr & (p->tpr - 1)) != 0) return cudaErrorInvalidValue;
    if (static_cast<int64_t>(p->tpr) * p->vpt < nacc) return cudaErrorInvalidValue;
    return cudaSuccess;
  }
  // Long rows.
  int vpt, csize, threads, smem_acc = 0;
  if (nacc <= 8 * 2048) {
    vpt = 8;
    csize = std::min(8, Pow2Ceil(CeilDiv(nacc, 2048)));
  } else if (nacc <= 8 * 4096) {
    vpt = 8;
    csize = 8;
  } else {
    vpt = p->vec ? 4 : 8;  // vector path: the rest of the chunk goes to shared memory
    csize = 0;             // decided below: 16 if the device allows it
  }
  if (k.vectors_per_thread) vpt = k.vectors_per_thread;
  if (vpt != 4 && vpt != 8) return cudaErrorInvalidValue;
  if (k.cluster) csize = k.cluster;
  if (csize == 0) csize = p->vec ? BigClusterLimit<T, W>(vpt) : 8;
  if (csize < 1 || csize > 16) return cudaErrorInvalidValue;
  if (csize > 8 && BigClusterLimit<T, W>(vpt) < 16) return cudaErrorInvalidValue;
  const int64_t chunk = CeilDiv(nacc, csize);
  if (k.threads) {
    threads = k.threads;
  } else if (nacc <= 8 * 4096) {
    threads = std::min(kChunkMaxThreads, RoundUp32(CeilDiv(chunk, vpt)));
  } else {
    threads = kChunkMaxThreads;
  }
  if (threads < 32 || threads > kChunkMaxThreads || threads % 32 != 0) return cudaErrorInvalidValue;
  const int64_t rest = std::max<int64_t>(0, chunk - static_cast<int64_t>(threads) * vpt);
  if (p->vec) {
    if (k.smem_bytes > 0) {
      smem_acc = static_cast<int>(std::min<int64_t>(rest, std::min(k.smem_bytes, kBigSmemBytes) / 16));
    } else if (k.smem_bytes == 0) {
      smem_acc = static_cast<int>(std::min<int64_t>(rest, kBigSmemBytes / 16));
    }
  }
  if (rows * csize > INT_MAX) return cudaErrorInvalidValue;
  p->vpt = vpt;
  p->csize = csize;
  p->threads = threads;
  p->smem_acc = smem_acc;
  p->chunk = static_cast<int>(chunk);
  return cudaSuccess;
}

template <typename T, int W, int VPT>
cudaError_t LaunchChunk(const Plan& p, const void* in, void* out, int64_t rows, cudaStream_t s) {
  auto kernel = SoftmaxChunkKernel<T, W, VPT>;
  const int smem = p.smem_acc * 16;
  if (smem > 48 * 1024 || p.csize > 8) PrepareBigKernel<T, W, VPT>();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * p.csize));
  cfg.blockDim = dim3(p.threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = p.csize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = p.csize > 1 ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(in), static_cast<T*>(out), p.nacc,
                                           p.chunk, p.csize, p.smem_acc);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

template <typename T, int W>
cudaError_t LaunchPlanW(const Plan& p, const void* in, void* out, int64_t rows, cudaStream_t s) {
  if (p.small) {
    const int rows_per_block = kSmallThreads / p.tpr;
    const int64_t blocks = CeilDiv(rows, rows_per_block);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const T* i = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    const unsigned g = static_cast<unsigned>(blocks);
    switch (p.vpt) {
      case 4: SoftmaxSmallKernel<T, W, 4><<<g, kSmallThreads, 0, s>>>(i, o, rows, p.nacc, p.tpr); break;
      case 8: SoftmaxSmallKernel<T, W, 8><<<g, kSmallThreads, 0, s>>>(i, o, rows, p.nacc, p.tpr); break;
      default: SoftmaxSmallKernel<T, W, 16><<<g, kSmallThreads, 0, s>>>(i, o, rows, p.nacc, p.tpr); break;
    }
    return cudaGetLastError();
  }
  return p.vpt == 8 ? LaunchChunk<T, W, 8>(p, in, out, rows, s) : LaunchChunk<T, W, 4>(p, in, out, rows, s);
}

template <typename T>
cudaError_t LaunchSoftmaxT(const KernelChoice& k, const void* in, void* out, int64_t rows, int64_t cols,
                           cudaStream_t s) {
  Plan p;
  const cudaError_t e = MakePlan<T>(k, in, out, rows, cols, &p);
  if (e != cudaSuccess) return e;
  return p.vec ? LaunchPlanW<T, 16 / sizeof(T)>(p, in, out, rows, s) : LaunchPlanW<T, 1>(p, in, out, rows, s);
}

}  // namespace

cudaError_t LaunchSoftmaxWith(const KernelChoice& k, DType dt, const void* in, void* out, int64_t rows,
                              int64_t cols, cudaStream_t s) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: return LaunchSoftmaxT<float>(k, in, out, rows, cols, s);
    case DType::kFloat16: return LaunchSoftmaxT<__half>(k, in, out, rows, cols, s);
    case DType::kBFloat16: return LaunchSoftmaxT<__nv_bfloat16>(k, in, out, rows, cols, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSoftmax(DType dt, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  return LaunchSoftmaxWith(KernelChoice{}, dt, in, out, rows, cols, s);
}

void DescribeSoftmax(DType dt, const void* in, const void* out, int64_t rows, int64_t cols,
                     const KernelChoice& k, char* buf, int len) {
  Plan p;
  cudaError_t e = cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: e = MakePlan<float>(k, in, out, rows, cols, &p); break;
    case DType::kFloat16: e = MakePlan<__half>(k, in, out, rows, cols, &p); break;
    case DType::kBFloat16: e = MakePlan<__nv_bfloat16>(k, in, out, rows, cols, &p); break;
  }
  if (e != cudaSuccess) {
    std::snprintf(buf, len, "softmax/invalid");
  } else if (p.small) {
    std::snprintf(buf, len, "softmax/rows %s tpr=%d v=%d", p.vec ? "vec" : "scalar", p.tpr, p.vpt);
  } else {
    std::snprintf(buf, len, "softmax/cluster %s c=%d t=%d v=%d smem=%d", p.vec ? "vec" : "scalar", p.csize,
                  p.threads, p.vpt, p.smem_acc * 16);
  }
}

}  // namespace fusebox::cuda
