// Row sum over the last axis on the GPU: float32 / float16 / bfloat16 in, float32 out,
// float32 accumulation (half types widened exactly).
//
// Cost: reads every element once (rows cols sizeof(T) bytes) and writes rows floats; about one
// add per element. Read-only streaming: each thread keeps several 16-byte loads in flight.
// Kernels, picked by row length in 16-byte accesses (nacc = cols / W, W = 16 / sizeof(T)):
//  - aligned rows of 1-7 whole 16-byte accesses (fp32 4-28 columns, 2-byte 8-56, by W): the
//    packed kernel, Pow2Ceil(nacc) lanes per row with one access each and R rows per lane (R
//    loads in flight), a block reading R spans of 4 KiB (RowSumPackedKernel).
//  - other rows of <= 64 columns under 128 bytes or not whole aligned vectors (cols = 1, 7, 33, ...):
//    the tile kernel, a block's ~8 KiB of consecutive rows read as one flat span of 16-byte
//    vectors into shared memory, then summed there (RowSumTileKernel).
//  - short rows (nacc < 1024; with fewer than 264 rows, nacc < 32): a group of `tpr` lanes
//    (8..32 for 16-byte accesses, 4..32 scalar) per row, each lane summing every tpr-th access,
//    4 or 8 loads in flight; shuffle reduction in the group; 256-thread blocks. Rows of exactly 2
//    accesses per lane (128 columns) are read without a loop or bounds checks.
//  - long rows: C blocks per row (C = 1 plain, else a thread-block cluster), 4, 8 or 16 loads
//    in flight per thread (as many as its accesses fill); each block sums its chunk, the
//    cluster's block 0 adds the C partial sums from distributed shared memory in rank order
//    (deterministic, no atomics, no workspace) and writes the row's result. 2-byte rows of one
//    block with 16 or more loads per thread (32768-65536 columns) read 8-byte accesses in blocks
//    of 512 threads x 16 loads, with the L2 evict-first cache policy (torch.compile's loads).
//    Rows of exactly 1024 or 2048 16-byte accesses (16 or 32 KiB) are one batch of 512 x 2 or 4
//    loads, read by a kernel without a loop or bounds checks.
//  - few long rows (rows x cluster < 132, rows of 16384+ accesses) given a workspace
//    (RowSumWorkspaceBytes): each row split over enough plain blocks for two per SM
//    (RowSumPartKernel, partial sums in the workspace), then RowSumFinishKernel adds each row's
//    partials in a fixed order: deterministic, one extra launch of a few microseconds.
// Rows whose start is not 16-byte aligned (odd row lengths, offset pointers) take the same kernels
// with a scalar head up to the first 16-byte boundary, the vectors, and a scalar tail (RowEdges in
// common.cuh): head and tail add at most 2 (W - 1) scalar loads per row. Only pointers that are
// not element-aligned use W = 1 (coalesced scalar access).
// The cache hint, the block size (the loads' stride) and "cluster or not" are template arguments:
// a block-per-row kernel starts its loads within ~25 instructions (in SASS).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"

namespace fusebox::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;      // short rows: loads in flight per lane
constexpr int kLongUnroll = 4;  // long rows: the fewest loads in flight per thread (32 registers)
constexpr bool kDefaultStreaming = true;  // .cs loads unless KernelChoice::streaming says
constexpr int kFillBlocks = 264;          // two blocks per SM of the H200 (132 SMs)
constexpr int kPackedRows = 4;            // the packed kernel's rows per lane (loads in flight)

template <typename T, int W>
__device__ __forceinline__ float SumAccess(const typename Pack<T, W>::Raw& r) {
  float f[W];
  Unpack<T, W>(r, f);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < W; ++e) s += f[e];
  return s;
}

// Sums accesses first, first + step, ... < n of src, U loads in flight; Cs: .cs (evict-first)
// loads, else plain (a constant, so LoadHint folds). Inlined, so a constant `step` folds into the
// addresses.
template <typename T, int W, bool Cs, int U = kUnroll>
__device__ __forceinline__ float StridedSum(const typename Pack<T, W>::Raw* src, int first, int n, int step) {
  using R = typename Pack<T, W>::Raw;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int a = first;
  for (; a + (U - 1) * step < n; a += U * step) {
    R x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = LoadHint(Cs, src + a + u * step);
    // Element-wise over the batch, last access first: fp32 262144x128 +4.6% against each access
    // summed in load order (ptxas orders the loads by its register target either way).
    float v[W];
    Unpack<T, W>(x[U - 1], v);
#pragma unroll
    for (int u = U - 2; u >= 0; --u) {
      float f[W];
      Unpack<T, W>(x[u], f);
#pragma unroll
      for (int e = 0; e < W; ++e) v[e] += f[e];
    }
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e & 3] += v[e];
  }
  // Tail: still issue the loads together. Skipped as a whole when empty (rows that are whole
  // batches: a predicated-off tail costs ~100 instructions per warp).
  if (a < n) {
    R x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (a + u * step < n) x[u] = LoadHint(Cs, src + a + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (a + u * step < n) acc[u & 3] += SumAccess<T, W>(x[u]);
    }
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// One batch: the U accesses src[0], src[Step], ... src[(U - 1) Step], loaded together, no bounds
// checks (the callers read rows of exactly that many accesses).
template <typename T, int W, bool Cs, int U, int Step>
__device__ __forceinline__ float BatchSum(const typename Pack<T, W>::Raw* src) {
  typename Pack<T, W>::Raw x[U];
#pragma unroll
  for (int u = 0; u < U; ++u) x[u] = LoadHint(Cs, src + u * Step);
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) s += SumAccess<T, W>(x[u]);
  return s;
}

// tpr (a power of two) lanes per row; 256-1024 threads per block; U loads in flight per lane.
// TPR > 0: tpr = TPR, fixed at compile time (the loads share one address register with immediate
// offsets); TPR = 0: tpr_arg. Exact (with TPR > 0): rows of exactly U x TPR accesses, each lane's
// U loads without a loop or bounds checks.
// E: rows not 16-byte aligned (RowEdges): each row's head and tail elements are added by its
// lanes e, e + tpr, ... and its vectors read as above (cols is used only then).
template <typename T, int W, bool Cs, int TPR, int U, bool Exact = false, bool E = false>
__global__ __launch_bounds__(1024) void RowSumSmallKernel(const T* in, float* out, int64_t rows, int nacc,
                                                          int tpr_arg, int64_t cols) {
  using R = typename Pack<T, W>::Raw;
  const int tpr = TPR ? TPR : tpr_arg;
  const int lg = __ffs(tpr) - 1;  // a power of two: rows by shifts, not a division
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> lg) + (threadIdx.x >> lg);
  float s = 0.f;
  if constexpr (E) {
    static_assert(!Exact, "edge rows vary in length");
    if (row < rows) {
      const T* rp = in + row * cols;
      const RowEdges g = EdgesOf(rp, cols);
      // The lane's first edge element is loaded before the vectors (in a loop after them it was a
      // second trip to memory, most of a small tensor's time); lanes have a second one only where
      // tpr < head + tail (4 or 8 lanes, rows of <= 512 columns).
      const float x0 = lane < g.edges() ? ToFloat<T>(LoadHint(Cs, rp + EdgeIndex<T>(g, lane))) : 0.f;
      s = StridedSum<T, W, Cs, U>(reinterpret_cast<const R*>(rp + g.head), lane, g.nvec, tpr);
      s += x0;
      for (int e = lane + tpr; e < g.edges(); e += tpr) s += ToFloat<T>(LoadHint(Cs, rp + EdgeIndex<T>(g, e)));
    }
  } else if constexpr (Exact) {
    static_assert(TPR > 0, "exact rows need tpr at compile time");
    if (row < rows) s = BatchSum<T, W, Cs, U, TPR>(reinterpret_cast<const R*>(in) + row * nacc + lane);
  } else {
    if (row < rows) s = StridedSum<T, W, Cs, U>(reinterpret_cast<const R*>(in) + row * nacc, lane, nacc, tpr);
  }
  s = GroupSum(s, tpr);
  if (lane == 0 && row < rows) out[row] = s;
}

// Rows of <= kTileMaxCols columns under 128 bytes or not whole aligned vectors (cols = 1, 16 bf16,
// 33, 63, or any offset): the block's tile_rows rows as one flat span read into shared memory with
// 16-byte vectors (TileLoad in common.cuh), then tpr = 1 << lg lanes per row add E
// elements each at stride tpr (consecutive lanes, consecutive elements) and one shuffle tree;
// lane 0 writes the row's sum. Passes over the tile's rows are uniform across the block (whole
// warps in the shuffles). cols = 1 is a widening copy.
template <typename T, int E>
__global__ __launch_bounds__(kTileThreads) void RowSumTileKernel(const T* in, float* out, int64_t rows, int cols,
                                                                 int tile_rows, int lg, bool cs) {
  extern __shared__ uint4 tile_smem[];
  T* sm = reinterpret_cast<T*>(tile_smem);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int nrows = static_cast<int>(rows - row0 < tile_rows ? rows - row0 : tile_rows);
  const int n = nrows * cols;
  const TileSpan t = TileSpanOf(in + row0 * cols, n);
  TileLoad<T>(cs, in + row0 * cols, n, sm, t);
  __syncthreads();
  const int tpr = 1 << lg;
  const int lane = threadIdx.x & (tpr - 1);
  const T* base = sm + t.lead;
  for (int r0 = 0; r0 < nrows; r0 += kTileThreads >> lg) {
    const int r = r0 + (threadIdx.x >> lg);
    const bool act = r < nrows;
    const T* rp = base + (act ? r : 0) * cols;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < E; ++q) {
      if (q * tpr >= cols) break;  // the same in every lane
      const int c = lane + q * tpr;
      if (act && c < cols) s += ToFloat<T>(rp[c]);
    }
    s = GroupSum(s, tpr);
    if (act && lane == 0) out[row0 + r] = s;
  }
}

// Aligned rows of nacc = 1-7 16-byte accesses (rows under 128 bytes of whole vectors): TPR =
// Pow2Ceil(nacc) lanes per row, lane l < nacc reading the row's access l; each lane sums R rows
// one block pass (kThreads / TPR rows) apart, its R loads issued before any add. Every pass of the
// block reads one contiguous span (kThreads / TPR rows of nacc accesses). The short-row kernel
// gave such rows 8+ lanes with at most one access each (bf16 16 columns: 0.33x of Triton), the
// tile kernel a trip through shared memory (bf16 / fp16 16 columns 0.64x of Triton, 73% of copy).
template <typename T, bool Cs, int TPR, int R>
__global__ __launch_bounds__(kThreads) void RowSumPackedKernel(const T* in, float* out, int64_t rows, int nacc) {
  constexpr int W = 16 / sizeof(T);
  using V = typename Pack<T, W>::Raw;
  constexpr int kPass = kThreads / TPR;
  const int lane = threadIdx.x & (TPR - 1);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (kPass * R) + threadIdx.x / TPR;
  const V* src = reinterpret_cast<const V*>(in);
  const bool reads = TPR == 1 || lane < nacc;
  V x[R];
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const int64_t row = r0 + static_cast<int64_t>(u) * kPass;
    x[u] = V{};
    if (reads && row < rows) x[u] = LoadHint(Cs, src + row * nacc + lane);
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const int64_t row = r0 + static_cast<int64_t>(u) * kPass;
    const float s = GroupSum(SumAccess<T, W>(x[u]), TPR);
    if (lane == 0 && row < rows) out[row] = s;
  }
}

template <typename T, bool Cs>
const void* PackedKernel(int tpr, int r) {
  auto k = [r](auto t) -> const void* {
    constexpr int TPR = decltype(t)::value;
    switch (r) {
      case 1: return reinterpret_cast<const void*>(RowSumPackedKernel<T, Cs, TPR, 1>);
      case 2: return reinterpret_cast<const void*>(RowSumPackedKernel<T, Cs, TPR, 2>);
      case 4: return reinterpret_cast<const void*>(RowSumPackedKernel<T, Cs, TPR, 4>);
      case 8: return reinterpret_cast<const void*>(RowSumPackedKernel<T, Cs, TPR, 8>);
    }
    return nullptr;
  };
  switch (tpr) {
    case 1: return k(std::integral_constant<int, 1>{});
    case 2: return k(std::integral_constant<int, 2>{});
    case 4: return k(std::integral_constant<int, 4>{});
    case 8: return k(std::integral_constant<int, 8>{});
  }
  return nullptr;
}

// The short-row kernel for tpr (fixed at compile time for 16-byte accesses, at run time for scalar
// ones) and U (4 only for .cs loads with tpr fixed, else kUnroll); exact: the Exact form, U = 2,
// 4 or 8, 16-byte accesses only.
template <typename T, int W, bool Cs, bool E = false>
const void* SmallKernel(int tpr, int unroll, bool exact) {
  auto k = [unroll, exact](auto t) {
    constexpr int TPR = decltype(t)::value;
    if constexpr (E) {
      if (exact) return static_cast<const void*>(nullptr);
      if constexpr (Cs && TPR > 0) {
        if (unroll == 4) return reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, 4, false, true>);
      }
      return unroll == kUnroll ? reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, kUnroll, false, true>)
                               : nullptr;
    } else if constexpr (TPR > 0) {
      if (exact) {
        switch (unroll) {
          case 2: return reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, 2, true>);
          case 4: return reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, 4, true>);
          case 8: return reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, 8, true>);
        }
        return static_cast<const void*>(nullptr);
      }
    }
    if (exact) return static_cast<const void*>(nullptr);
    if constexpr (Cs && TPR > 0) {
      if (unroll == 4) return reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, 4>);
    }
    return unroll == kUnroll ? reinterpret_cast<const void*>(RowSumSmallKernel<T, W, Cs, TPR, kUnroll>) : nullptr;
  };
  if constexpr (W > 1) {
    switch (tpr) {
      case 1: return k(std::integral_constant<int, 1>{});
      case 2: return k(std::integral_constant<int, 2>{});
      case 4: return k(std::integral_constant<int, 4>{});
      case 8: return k(std::integral_constant<int, 8>{});
      case 16: return k(std::integral_constant<int, 16>{});
      case 32: return k(std::integral_constant<int, 32>{});
    }
    return nullptr;  // MakePlan allows powers of two up to 32 only
  } else {
    return k(std::integral_constant<int, 0>{});
  }
}

// Blocks of MaxT threads (the launch's block size), U loads in flight per thread. Not Clustered:
// block b sums row b. Clustered: grid.x = rows * csize, cluster (csize, 1, 1); each block sums its
// chunk and the cluster's block 0 adds the partial sums in rank order.
// 4 loads in flight: at most 32 registers, a full SM (ptxas would take 34 for fp32 256 x 4 without
// the bound: 6 blocks instead of 8, -7% at 2048x32768).
template <int U, int MaxT>
constexpr int ChunkMinBlocks() {
  return U <= 4 ? 2048 / MaxT : 1;
}

// The vectors of row `row` (nv of them) and, for E rows (RowEdges; cols used only then), the sum of
// this thread's edge element if first_block and the thread has one.
template <typename T, int W, bool Cs, bool E>
__device__ __forceinline__ const typename Pack<T, W>::Raw* RowBody(const T* in, int64_t row, int nacc, int64_t cols,
                                                                   bool first_block, int& nv, float& edge) {
  using R = typename Pack<T, W>::Raw;
  edge = 0.f;
  if constexpr (E) {
    const T* rp = in + row * cols;
    const RowEdges g = EdgesOf(rp, cols);
    nv = g.nvec;
    if (first_block && static_cast<int>(threadIdx.x) < g.edges()) {
      edge = ToFloat<T>(LoadHint(Cs, rp + EdgeIndex<T>(g, threadIdx.x)));
    }
    return reinterpret_cast<const R*>(rp + g.head);
  } else {
    nv = nacc;
    return reinterpret_cast<const R*>(in) + row * nacc;
  }
}

template <typename T, int W, int U, int MaxT, bool Cs, bool Clustered, bool E = false>
__global__ __launch_bounds__(MaxT, ChunkMinBlocks<U, MaxT>()) void RowSumChunkKernel(const T* in, float* out,
                                                                                     int nacc, int chunk, int csize,
                                                                                     int64_t cols) {
  __shared__ float scratch[32];
  if constexpr (!Clustered) {
    const int64_t row = blockIdx.x;
    int nv;
    float edge;
    const auto* body = RowBody<T, W, Cs, E>(in, row, nacc, cols, true, nv, edge);
    const float s = BlockSumToFirst(edge + StridedSum<T, W, Cs, U>(body, threadIdx.x, nv, MaxT), scratch);
    if (threadIdx.x == 0) out[row] = s;
  } else {
    __shared__ float block_sum;
    const int rank = static_cast<int>(ClusterRank());
    const int64_t row = blockIdx.x / csize;
    int nv;
    float edge;
    const auto* body = RowBody<T, W, Cs, E>(in, row, nacc, cols, rank == 0, nv, edge);
    const int a0 = rank * chunk;
    const int n = max(0, min(nv - a0, chunk));
    const float s = BlockSumToFirst(edge + StridedSum<T, W, Cs, U>(body + a0, threadIdx.x, n, MaxT), scratch);
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
}

// Rows split over nb plain blocks (too few rows to fill the GPU): block b of row r sums accesses
// [b chunk, (b + 1) chunk) of the row's vectors (block 0 also its edges) into part[r nb + b];
// RowSumFinishKernel then adds each row's nb partial sums in a fixed order (deterministic, no
// atomics). The workspace holds the partial sums.
template <typename T, int W, int U, bool E>
__global__ __launch_bounds__(kThreads, ChunkMinBlocks<U, kThreads>()) void RowSumPartKernel(const T* in, float* part,
                                                                                           int nacc, int chunk,
                                                                                           int nb, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x / nb;
  const int b = static_cast<int>(blockIdx.x % nb);
  int nv;
  float edge;
  const auto* body = RowBody<T, W, true, E>(in, row, nacc, cols, b == 0, nv, edge);
  const int a0 = b * chunk;
  const int n = max(0, min(nv - a0, chunk));
  const float s = BlockSumToFirst(edge + StridedSum<T, W, true, U>(body + a0, threadIdx.x, n, kThreads), scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// One warp per row (8 per block): lane l adds partials l, l + 32, ... in order, then a fixed
// shuffle tree.
__global__ __launch_bounds__(256) void RowSumFinishKernel(const float* part, float* out, int64_t rows, int nb) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // the whole warp: one row per warp
  float s = 0.f;
  for (int i = lane; i < nb; i += 32) s += part[row * nb + i];
  s = GroupSum(s, 32);
  if (lane == 0) out[row] = s;
}
template <typename T, int W, bool E>
const void* PartKernel(int unroll) {
  switch (unroll) {
    case 4: return reinterpret_cast<const void*>(RowSumPartKernel<T, W, 4, E>);
    case 8: return reinterpret_cast<const void*>(RowSumPartKernel<T, W, 8, E>);
    case 16: return reinterpret_cast<const void*>(RowSumPartKernel<T, W, 16, E>);
  }
  return nullptr;
}

// Rows of exactly U x MaxT 16-byte accesses, one block per row: each thread's U loads, their sum,
// the block sum; no loop and no bounds checks (first load at the 13th instruction).
template <typename T, int W, int U, int MaxT, bool Cs>
__global__ __launch_bounds__(MaxT) void RowSumBatchKernel(const T* in, float* out, int nacc) {
  using R = typename Pack<T, W>::Raw;
  __shared__ float scratch[32];
  const R* src = reinterpret_cast<const R*>(in) + static_cast<int64_t>(blockIdx.x) * nacc + threadIdx.x;
  const float s = BlockSumToFirst(BatchSum<T, W, Cs, U, MaxT>(src), scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// The one-batch kernel for (threads, loads per thread), or null where it is not built: 512 x 2
// and 512 x 4 (the automatic choices, MakePlan), 256 x 4 and 256 x 8 (forced only, to compare).
template <typename T, int W>
const void* BatchKernel(int threads, int unroll, bool cs) {
  auto pick = [&](auto u, auto t) -> const void* {
    constexpr int U = decltype(u)::value, MaxT = decltype(t)::value;
    return cs ? reinterpret_cast<const void*>(RowSumBatchKernel<T, W, U, MaxT, true>)
              : reinterpret_cast<const void*>(RowSumBatchKernel<T, W, U, MaxT, false>);
  };
  using I = std::integral_constant<int, kThreads>;
  using J = std::integral_constant<int, 512>;
  if constexpr (Pack<T, W>::kVec) {
    if (threads == 512 && unroll == 2) return pick(std::integral_constant<int, 2>{}, J{});
    if (threads == 512 && unroll == 4) return pick(std::integral_constant<int, 4>{}, J{});
    if (threads == kThreads && unroll == 4) return pick(std::integral_constant<int, 4>{}, I{});
    if (threads == kThreads && unroll == 8) return pick(std::integral_constant<int, 8>{}, I{});
  }
  return nullptr;
}

// The long-row kernel for `threads` per block, `unroll` loads in flight, the hint and the cluster
// mode, or null where that pair is not built: 16-byte and scalar accesses 256 x 4 / 8 / 16 and
// 512 x 8; 8-byte accesses 512 x 16 only (the one pair MakePlan picks for them). Measured slower
// and not built: 1024-thread blocks (~30% at 8192 columns); 512 x 1 / 2 / 4, 256 x 2 and
// 128 x 8 (0.3-16%).
template <typename T, int W, bool E = false>
const void* LongKernel(int threads, int unroll, bool cs, bool clustered) {
  auto pick = [&](auto u, auto t) -> const void* {
    constexpr int U = decltype(u)::value, MaxT = decltype(t)::value;
    if (cs) {
      return clustered ? reinterpret_cast<const void*>(RowSumChunkKernel<T, W, U, MaxT, true, true, E>)
                       : reinterpret_cast<const void*>(RowSumChunkKernel<T, W, U, MaxT, true, false, E>);
    }
    return clustered ? reinterpret_cast<const void*>(RowSumChunkKernel<T, W, U, MaxT, false, true, E>)
                     : reinterpret_cast<const void*>(RowSumChunkKernel<T, W, U, MaxT, false, false, E>);
  };
  using I = std::integral_constant<int, kThreads>;
  using J = std::integral_constant<int, 512>;
  if constexpr (Pack<T, W>::kVec8) {
    if (threads == 512 && unroll == 16) return pick(std::integral_constant<int, 16>{}, J{});
  } else if (threads == kThreads) {
    switch (unroll) {
      case 4: return pick(std::integral_constant<int, 4>{}, I{});
      case 8: return pick(std::integral_constant<int, 8>{}, I{});
      case 16: return pick(std::integral_constant<int, 16>{}, I{});
    }
  } else if (threads == 512 && unroll == 8) {
    return pick(std::integral_constant<int, 8>{}, J{});
  }
  return nullptr;
}

struct Plan {
  bool vec = false;    // 16-byte aligned rows of whole vectors
  bool edges = false;  // other element-aligned rows: scalar head and tail around vectors (RowEdges)
  int split = 1;       // blocks per row that meet in the workspace (RowSumPartKernel)
  bool small = false;
  int nacc = 0;
  int tpr = 0;
  int csize = 1, threads = kThreads, chunk = 0;
  int unroll = kLongUnroll;  // loads in flight per thread (short rows: per lane)
  bool cs = true;
  bool w8 = false;     // 8-byte accesses (2-byte types, W = 4), 512 x 16
  bool batch = false;  // a row is exactly one batch: threads x unroll accesses (long rows,
                       // RowSumBatchKernel) or tpr x unroll (short rows, the Exact kernel)
  int tile_rows = 0;   // > 0: the tile kernel (rows per block; tpr lanes per row)
  int tile_elems = 4;  // the tile kernel: a row's elements per lane
  int packed = 0;      // > 0: the packed kernel (rows per lane; tpr lanes per row)
};

template <typename T, int W, bool E = false>
const void* SmallKernelFor(const Plan& p) {
  return p.cs ? SmallKernel<T, W, true, E>(p.tpr, p.unroll, p.batch)
              : SmallKernel<T, W, false, E>(p.tpr, p.unroll, p.batch);
}

// Blocks per row meeting in the workspace (1 = none): as forced (KernelChoice::split), or,
// automatically, for long rows (16384 or more 16-byte accesses) too few to give every SM one
// block with their clusters (rows x cluster < 132): enough blocks of >= 1024 accesses for two
// per SM. Before, 7x3000001 bf16 ran 56 blocks on 132 SMs. Arithmetic only (the server sizes the
// workspace with it, pointers unknown; the vector count is the aligned one, an upper bound).
template <typename T>
int SplitWanted(const KernelChoice& k, int64_t rows, int64_t cols) {
  constexpr int W = 16 / sizeof(T);
  const int64_t nacc = cols / W;
  if (k.split != 0) return std::max(1, k.split);
  if (k.long_rows < 0 || (k.long_rows == 0 && nacc < 1024) || k.cluster != 0 || k.threads != 0 ||
      k.vectors_per_thread != 0 || k.pipeline != 0 || k.streaming < 0 || nacc > kMaxRowAccesses) {
    return 1;
  }
  const int64_t csize = std::min(8, Pow2Ceil(CeilDiv(nacc, 8192)));
  if (nacc < 16384 || rows * csize >= kFillBlocks / 2) return 1;
  const int64_t nb = std::min(CeilDiv(kFillBlocks, rows), CeilDiv(nacc, 1024));
  return nb > csize ? static_cast<int>(nb) : 1;
}
size_t SplitBytes(int64_t rows, int split) {
  return split > 1 ? static_cast<size_t>(rows) * split * sizeof(float) : 0;
}

template <typename T>
cudaError_t MakePlan(const KernelChoice& k, const void* in, int64_t rows, int64_t cols, size_t ws_bytes,
                     Plan* p) {
  constexpr int W = 16 / sizeof(T);
  p->vec = cols % W == 0 && Aligned16(in);
  p->edges = !p->vec && EdgesOk<T>(in, in);
  const int64_t nacc64 = p->vec || p->edges ? cols / W : cols;
  if (nacc64 > kMaxRowAccesses) return cudaErrorInvalidValue;
  p->nacc = static_cast<int>(nacc64);
  p->cs = k.streaming == 0 ? kDefaultStreaming : k.streaming > 0;
  const int nacc = p->nacc;
  // Rows of <= 64 columns under 128 bytes (fewer than 8 vectors: the short-row kernel's 8+ lanes
  // left most idle, bf16 16 columns at 0.33x of Triton) or not whole aligned vectors (per-row
  // scalar heads and tails: fp16 33 columns at 41% of copy): the tile kernel. Aligned rows of 8-16
  // vectors keep the short-row kernel (98-110% of copy measured). Forcing any other field keeps
  // the kernel it forces.
  const bool others = k.threads_per_row != 0 || k.vectors_per_thread != 0 || k.threads != 0 ||
                      k.long_rows != 0 || k.pipeline != 0 || k.cluster != 0 || k.split != 0;
  // Aligned rows of 1-7 whole vectors: the packed kernel, kPackedRows rows per lane unless
  // KernelChoice::rows_per_lane says (-1: never; then the tile or the short-row kernel as before).
  // Sweep on an H100 (lab/notes/kernels.md): rows of 16 at 1.05-1.07x of Triton, from 0.64-0.88x.
  if (k.rows_per_lane > 0 || (k.rows_per_lane == 0 && k.tile == 0 && !others && p->vec && nacc < 8)) {
    if (!p->vec || nacc >= 8) return cudaErrorInvalidValue;
    p->packed = k.rows_per_lane > 0 ? k.rows_per_lane : kPackedRows;
    p->tpr = Pow2Ceil(nacc);
    p->small = true;
    const int64_t per_block = static_cast<int64_t>(kThreads / p->tpr) * p->packed;
    if (CeilDiv(rows, per_block) > INT_MAX) return cudaErrorInvalidValue;
    return PackedKernel<T, true>(p->tpr, p->packed) ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (k.rows_per_lane < -1) return cudaErrorInvalidValue;
  if (k.tile > 0 || (k.tile == 0 && !others && cols <= kTileMaxCols && (!p->vec || nacc < 8))) {
    if (cols > kTileMaxCols || k.tile > 1) return cudaErrorInvalidValue;
    const int elems = k.tile_elems ? k.tile_elems : TileElemsFor(false, cols, sizeof(T));
    if (elems != 4 && elems != 8 && elems != 16) return cudaErrorInvalidValue;
    const TileShape ts = TileShapeOf(rows, cols, sizeof(T), elems);
    if (CeilDiv(rows, ts.rows) > INT_MAX) return cudaErrorInvalidValue;
    p->small = true;
    p->tile_elems = elems;
    p->tpr = ts.tpr;
    p->tile_rows = ts.rows;
    p->threads = kTileThreads;
    return cudaSuccess;
  }
  if (k.tile < -1 || k.tile > 1) return cudaErrorInvalidValue;
  // 1024 accesses (16 KiB) and longer: a block per row beats a warp per row (bf16 8192 columns:
  // 4011 vs 3888 GB/s on the H200).
  // Fewer rows than two blocks per SM, of 32+ accesses each: a block per row too (127x4093 fp32 ran
  // 16 blocks of 8 rows, each lane 4 dependent batches of loads: 0.58x of Triton; under graph
  // replay fp32 120x1000 2.39 -> 1.88 us, Triton 1.85; bf16 9x1003 2.45 -> 1.96 us; fp32 17x251
  // 2.60 -> 1.67 us, Triton 2.15), unless a short-row field is forced.
  p->small = k.long_rows < 0 || (k.long_rows == 0 && nacc < 1024 && (others || rows >= kFillBlocks || nacc < 32));
  if (p->small) {
    // 16-byte accesses: one lane per 2, at least 8 and at most 32 lanes. In-process A/B against
    // one lane per 64 elements: bf16 128 columns 8 lanes +2.4-2.6%, fp32 1024 columns 32 lanes
    // +1.1-1.2%, bf16 1024 columns 32 lanes +0.4%; fp32 128 columns 16 lanes +0.7-1.2% over 8.
    // Scalar rows: one lane per 64 elements, at least 4 and at most 32.
    const int auto_tpr = p->vec ? std::min(32, std::max(8, Pow2Ceil(CeilDiv(nacc, 2))))
                                : std::min(32, std::max(4, Pow2Ceil(CeilDiv(cols, 64))));
    p->tpr = k.threads_per_row ? k.threads_per_row : auto_tpr;
    if (p->tpr < 1 || p->tpr > 32 || (p->tpr & (p->tpr - 1)) != 0) return cudaErrorInvalidValue;
    p->threads = k.threads ? k.threads : kThreads;
    if (p->threads != 256 && p->threads != 512 && p->threads != 1024) return cudaErrorInvalidValue;
    // Loads in flight per lane: 4 where a lane has at most 4 accesses (one batch, no tail: bf16
    // 262144x128), else 8.
    const bool four = p->cs && p->vec && CeilDiv(nacc, p->tpr) <= 4;
    p->unroll = k.vectors_per_thread ? k.vectors_per_thread : four ? 4 : kUnroll;
    // Rows of exactly 2 accesses per lane (128 columns) read them without a loop or bounds checks
    // (the 4-load batch left 2 loads predicated off). Kernel time bf16 262144x128 15.78 us against
    // 15.94-16.10 with the loop, fp32 29.70 against 29.86-30.18.
    // pipeline = 1 forces it for 2, 4 or 8 accesses per lane (rows of exactly tpr x that).
    const int per_lane = p->vec && nacc % p->tpr == 0 ? nacc / p->tpr : 0;
    p->batch = k.pipeline > 0 || (k.pipeline == 0 && k.vectors_per_thread == 0 && per_lane == 2);
    if (p->batch) {
      p->unroll = k.vectors_per_thread ? k.vectors_per_thread : per_lane;
      if (per_lane != p->unroll) return cudaErrorInvalidValue;
    }
    const void* kernel = p->vec ? SmallKernelFor<T, W>(*p) : p->edges ? SmallKernelFor<T, W, true>(*p) : SmallKernelFor<T, 1>(*p);
    return kernel ? cudaSuccess : cudaErrorInvalidValue;
  }
  // Too few rows to fill the GPU (SplitWanted), given the workspace: plain blocks of 256 threads
  // meeting in it, as many loads in flight per thread as its accesses fill (16, 8 or 4).
  const int split = SplitWanted<T>(k, rows, cols);
  if (split > 1 && (p->vec || p->edges) && SplitBytes(rows, split) <= ws_bytes) {
    if (split > 4096 || rows * split > INT_MAX) return cudaErrorInvalidValue;
    p->split = split;
    p->threads = kThreads;
    p->chunk = static_cast<int>(CeilDiv(nacc, split));
    const int per_thread = static_cast<int>(CeilDiv(p->chunk, kThreads));
    p->unroll = per_thread >= 16 ? 16 : per_thread >= 8 ? 8 : 4;
    return cudaSuccess;
  }
  if (k.split > 1) return cudaErrorInvalidValue;  // forced without the workspace (or on the scalar path)
  // Long rows: about 8192 accesses (128 KiB) or more per block, up to 8 blocks per row.
  p->csize = k.cluster ? k.cluster : std::min(8, Pow2Ceil(CeilDiv(nacc, 8192)));
  if (p->csize < 1 || p->csize > 8) return cudaErrorInvalidValue;
  if (rows * p->csize > INT_MAX) return cudaErrorInvalidValue;
  // 2-byte rows that one block reads with 16 or more 8-byte loads per thread in 512-thread blocks
  // (32768-65536 columns): torch.compile's loads, 8 bytes each with the L2 evict-first policy.
  // In-process A/B: bf16 2048x32768 +0.9 / +1.4%; at 8192 columns (4 per thread, -0.3%) and on
  // clusters (128x1048576, -0.8%) it loses, so it is not taken there.
  p->w8 = sizeof(T) == 2 && p->vec && p->cs && p->csize == 1 && k.cluster == 0 && k.threads == 0 &&
          k.vectors_per_thread == 0 && k.pipeline <= 0 && 2 * nacc >= 512 * 16;
  if (p->w8) {
    p->nacc = 2 * nacc;
    p->threads = 512;
    p->unroll = 16;
    p->chunk = p->nacc;
    return cudaSuccess;
  }
  // Rows of exactly 1024 16-byte accesses (16 KiB: 2-byte types' 8192 columns, fp32's 4096): one
  // batch of 512 threads x 2 loads (RowSumBatchKernel). In a standalone probe (400 rounds,
  // twice) bf16 8192^2 +1.3 / +1.2% over 256 x 4 through RowSumChunkKernel, whose loop
  // nvcc unrolls around a row of one batch. Rows of exactly 2048 (32 KiB: fp32's 8192 columns,
  // 2-byte 16384): one batch of 512 x 4 (fp32 8192^2 against the 256 x 8 loop: +0.1-0.3% as a
  // forced variant in four peers' processes, level in an A/B of the two builds).
  // KernelChoice::pipeline = 1 forces the kernel at the given (threads, vectors_per_thread) on rows
  // of exactly that many accesses, -1 never takes it.
  const bool forced = k.threads != 0 || k.vectors_per_thread != 0 || k.cluster != 0;
  p->batch = k.pipeline > 0 || (k.pipeline == 0 && !forced && p->vec && (nacc == 1024 || nacc == 2048));
  if (p->batch) {
    p->threads = k.threads ? k.threads : 512;
    p->unroll = k.vectors_per_thread ? k.vectors_per_thread : nacc / p->threads;
    p->chunk = nacc;
    const bool fits = p->vec && p->csize == 1 && nacc == p->unroll * p->threads;
    return fits && BatchKernel<T, 16 / sizeof(T)>(p->threads, p->unroll, p->cs) ? cudaSuccess : cudaErrorInvalidValue;
  }
  // Loads in flight per thread: 16, 8 or 4, the most that a thread's accesses fill (16-byte rows;
  // scalar rows 4). Measured (C++ bench): bf16 128x1048576 (64 per thread) u=16 +7.4%
  // over u=4, bf16 2048x32768 (16) +0.7%, fp32 8192^2 (8) u=8 +1.1%; bf16 8192^2 (4): u=8 -10%
  // (the whole row is the predicated tail). u=4 takes 32 registers (8 blocks of 256 per SM).
  // 512-thread blocks (forced only) come with 8, the one pair LongKernel builds for them.
  p->threads = k.threads ? k.threads : kThreads;
  const int per_thread = p->vec || p->edges ? CeilDiv(CeilDiv(nacc, p->csize), p->threads) : 0;
  const int fill = per_thread >= 16 ? 16 : per_thread >= 8 ? 8 : kLongUnroll;
  p->unroll = k.vectors_per_thread ? k.vectors_per_thread : p->threads == kThreads ? fill : 8;
  if (LongKernel<T, 1>(p->threads, p->unroll, p->cs, p->csize > 1) == nullptr) return cudaErrorInvalidValue;
  p->chunk = static_cast<int>(CeilDiv(nacc, p->csize));
  return cudaSuccess;
}

template <typename T, int W, bool E = false>
cudaError_t LaunchPlanW(const Plan& p, const void* in_v, float* out, int64_t rows, int64_t cols, void* ws,
                        cudaStream_t s) {
  const T* in = static_cast<const T*>(in_v);
  if constexpr (Pack<T, W>::kVec) {
    if (p.split > 1) {
      float* part = static_cast<float*>(ws);
      int nacc = p.nacc, chunk = p.chunk, nb = p.split;
      void* args[] = {&in, &part, &nacc, &chunk, &nb, &cols};
      cudaError_t e = cudaLaunchKernel(PartKernel<T, W, E>(p.unroll), dim3(static_cast<unsigned>(rows * nb)),
                                       dim3(kThreads), args, 0, s);
      if (e != cudaSuccess) return e;
      const int64_t blocks = CeilDiv(rows, 8);
      if (blocks > INT_MAX) return cudaErrorInvalidValue;
      RowSumFinishKernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(part, out, rows, nb);
      return cudaGetLastError();
    }
  }
  if constexpr (Pack<T, W>::kVec8) {
    if (p.small) return cudaErrorInvalidValue;  // 8-byte accesses are for long rows only
  } else if (p.small) {
    const int64_t blocks = CeilDiv(rows, p.threads / p.tpr);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const void* kernel = SmallKernelFor<T, W, E>(p);  // MakePlan checked it
    int nacc = p.nacc, tpr = p.tpr;
    void* args[] = {&in, &out, &rows, &nacc, &tpr, &cols};
    const cudaError_t e = cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(p.threads), args, 0, s);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
  if constexpr (Pack<T, W>::kVec && !E) {
    if (p.batch) {
      int nacc = p.nacc;
      void* args[] = {&in, &out, &nacc};
      const cudaError_t e = cudaLaunchKernel(BatchKernel<T, W>(p.threads, p.unroll, p.cs),  // MakePlan checked it
                                             dim3(static_cast<unsigned>(rows)), dim3(p.threads), args, 0, s);
      return e != cudaSuccess ? e : cudaGetLastError();
    }
  }
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg =
      ClusterLaunchConfig(static_cast<unsigned>(rows * p.csize), p.threads, 0, p.csize, s, attr);
  int nacc = p.nacc, chunk = p.chunk, csize = p.csize;
  void* args[] = {&in, &out, &nacc, &chunk, &csize, &cols};
  const void* kernel = LongKernel<T, W, E>(p.threads, p.unroll, p.cs, p.csize > 1);  // MakePlan checked it
  const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T>
cudaError_t LaunchRowSumT(const KernelChoice& k, const void* in, float* out, int64_t rows, int64_t cols,
                          cudaStream_t s, Workspace ws) {
  Plan p;
  const cudaError_t e = MakePlan<T>(k, in, rows, cols, ws.ptr ? ws.bytes : 0, &p);
  if (e != cudaSuccess) return e;
  if (p.packed > 0) {
    const int64_t per_block = static_cast<int64_t>(kThreads / p.tpr) * p.packed;
    const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, per_block));  // MakePlan checked it
    const void* kernel = p.cs ? PackedKernel<T, true>(p.tpr, p.packed) : PackedKernel<T, false>(p.tpr, p.packed);
    int nacc = p.nacc;
    void* args[] = {&in, &out, &rows, &nacc};
    const cudaError_t e = cudaLaunchKernel(kernel, dim3(blocks), dim3(kThreads), args, 0, s);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
  if (p.tile_rows > 0) {
    const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, p.tile_rows));  // MakePlan checked it
    const int smem = TileSmemBytes<T>(p.tile_rows * static_cast<int>(cols));    // <= 8 KiB + a pass
    auto* kernel = p.tile_elems == 16 ? RowSumTileKernel<T, 16>
                   : p.tile_elems == 8 ? RowSumTileKernel<T, 8>
                                       : RowSumTileKernel<T, 4>;
    kernel<<<blocks, kTileThreads, smem, s>>>(static_cast<const T*>(in), out, rows, static_cast<int>(cols),
                                              p.tile_rows, __builtin_ctz(p.tpr), p.cs);
    return cudaGetLastError();
  }
  constexpr int W = 16 / sizeof(T);
  if constexpr (sizeof(T) == 2) {
    if (p.w8) return LaunchPlanW<T, 4>(p, in, out, rows, cols, ws.ptr, s);
  }
  if (p.vec) return LaunchPlanW<T, W>(p, in, out, rows, cols, ws.ptr, s);
  if (p.edges) return LaunchPlanW<T, W, true>(p, in, out, rows, cols, ws.ptr, s);
  return LaunchPlanW<T, 1>(p, in, out, rows, cols, ws.ptr, s);
}

}  // namespace

cudaError_t LaunchRowSumWith(const KernelChoice& k, DType dt, const void* in, float* out, int64_t rows,
                             int64_t cols, cudaStream_t s, Workspace ws) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (out == nullptr || (cols > 0 && in == nullptr)) return cudaErrorInvalidValue;
  if (cols == 0) return cudaMemsetAsync(out, 0, static_cast<size_t>(rows) * sizeof(float), s);
  switch (dt) {
    case DType::kFloat32: return LaunchRowSumT<float>(k, in, out, rows, cols, s, ws);
    case DType::kFloat16: return LaunchRowSumT<__half>(k, in, out, rows, cols, s, ws);
    case DType::kBFloat16: return LaunchRowSumT<__nv_bfloat16>(k, in, out, rows, cols, s, ws);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchRowSum(DType dt, const void* in, float* out, int64_t rows, int64_t cols, cudaStream_t s,
                         Workspace ws) {
  return LaunchRowSumWith(KernelChoice{}, dt, in, out, rows, cols, s, ws);
}

size_t RowSumWorkspaceBytesWith(const KernelChoice& k, DType dt, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  switch (dt) {
    case DType::kFloat32: return SplitBytes(rows, SplitWanted<float>(k, rows, cols));
    case DType::kFloat16: return SplitBytes(rows, SplitWanted<__half>(k, rows, cols));
    case DType::kBFloat16: return SplitBytes(rows, SplitWanted<__nv_bfloat16>(k, rows, cols));
  }
  return 0;
}

size_t RowSumWorkspaceBytes(DType dt, int64_t rows, int64_t cols) {
  return RowSumWorkspaceBytesWith(KernelChoice{}, dt, rows, cols);
}

cudaError_t FlushL2(const void* buf, int64_t bytes, float* sums, cudaStream_t s) {
  if (bytes <= 0 || bytes % kFlushRowBytes != 0) return cudaErrorInvalidValue;
  KernelChoice plain;
  plain.streaming = -1;
  return LaunchRowSumWith(plain, DType::kFloat32, buf, sums, bytes / kFlushRowBytes,
                          kFlushRowBytes / static_cast<int64_t>(sizeof(float)), s);
}

void DescribeRowSum(DType dt, const void* in, int64_t rows, int64_t cols, const KernelChoice& k, char* buf,
                    int len, size_t workspace_bytes) {
  Plan p;
  cudaError_t e = cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: e = MakePlan<float>(k, in, rows, cols, workspace_bytes, &p); break;
    case DType::kFloat16: e = MakePlan<__half>(k, in, rows, cols, workspace_bytes, &p); break;
    case DType::kBFloat16: e = MakePlan<__nv_bfloat16>(k, in, rows, cols, workspace_bytes, &p); break;
  }
  if (e != cudaSuccess) {
    std::snprintf(buf, len, "rowsum/invalid");
  } else if (p.split > 1) {
    std::snprintf(buf, len, "rowsum/split %s b=%d t=%d u=%d cs", p.vec ? "vec" : "edges", p.split, p.threads,
                  p.unroll);
  } else if (p.packed > 0) {
    std::snprintf(buf, len, "rowsum/packed tpr=%d r=%d t=%d %s", p.tpr, p.packed, kThreads, p.cs ? "cs" : "plain");
  } else if (p.tile_rows > 0) {
    std::snprintf(buf, len, "rowsum/tile tpr=%d e=%d rows=%d t=%d %s", p.tpr, p.tile_elems, p.tile_rows,
                  p.threads, p.cs ? "cs" : "plain");
  } else if (p.small) {
    std::snprintf(buf, len, "rowsum/rows %s%s tpr=%d t=%d u=%d %s", p.vec ? "vec" : p.edges ? "edges" : "scalar",
                  p.batch ? " exact" : "", p.tpr, p.threads, p.unroll, p.cs ? "cs" : "plain");
  } else {
    const char* access = p.w8 ? "vec8" : p.batch ? "vec one-batch" : p.vec ? "vec" : p.edges ? "edges" : "scalar";
    std::snprintf(buf, len, "rowsum/cluster %s c=%d t=%d u=%d %s", access, p.csize, p.threads, p.unroll,
                  p.cs ? "cs" : "plain");
  }
}

}  // namespace fusebox::cuda
