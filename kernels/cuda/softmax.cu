// Softmax over the last axis on the GPU, float32 / float16 / bfloat16, float32 arithmetic.
//
// Cost: one read and one write of every element (2 rows cols sizeof(T) bytes) while a row's
// chunks fit on chip (registers + shared memory) between the reduction and the output pass: rows
// up to ~4M fp32 / ~8M half elements on the split path, 2^20 / 2^21 on clusters. Longer rows read
// the part that does not fit a second time (from L2 where it still is). Arithmetic per element:
// a packed max, two exp2 (sum, output) each one FFMA from the input where |max| <= 32, about 8
// instructions; one exp2 on short rows whose values fit in registers (the sum's e^(x - max) kept).
//
// Kernels, picked by row length in 16-byte accesses (nacc = cols / W, W = 16 / sizeof(T)):
//  - short rows (nacc <= 512): a group of `tpr` lanes (1..32) per row, each lane holding VPT
//    accesses in registers; max and sum by warp shuffles within the group; 256-thread blocks (one
//    warp where a warp holds a row). Rows of exactly tpr x 2 / 4 / 8 accesses take the Exact form
//    (no bounds checks, the shape fixed at compile time; below 32 lanes in 128-thread blocks).
//  - long rows (one-shot kernel): each block holds its chunk of a row in registers (up to 512
//    threads x 8 accesses = 64 KiB), then in shared memory (up to 224 KiB, filled by the bulk-copy
//    engine, cp.async.bulk, in 32 KiB pieces with one mbarrier each, so each piece is reduced as
//    soon as it lands), and streams any remainder twice. Each thread reduces its values to a (max,
//    sum of e^(x-max)) pair, the block combines pairs, the row's blocks combine theirs, then every
//    block writes its chunk: e^(x - max) / sum. The row's blocks are
//      * one block (rows up to 18432 accesses; rows of up to 2048 accesses, all in the registers
//        of <= 256 threads x 8 or 512 x 4, take a lean copy of the kernel with <= 48 registers and
//        the default hints fixed; fp32 8192 columns: 512 x 4, 38 registers, with 12 or more
//        waves of rows thread 0 prefetching into L2 the row a quarter of the resident blocks
//        ahead; 2-byte rows of exactly 1024 accesses: the exact kernel at 512 x 2, one exp per
//        element, no bounds checks), or a
//        thread-block cluster of C = 2 or 4 combining through distributed shared memory (one
//        cluster barrier);
//      * from 8 such blocks up, with a workspace (SoftmaxWorkspaceBytes): the split path, N plain
//        blocks of 128 KiB (4-byte types) / 64 KiB (2-byte) that publish their pairs in global
//        memory and read the row's pairs until all are there (Split, below). No gang-scheduling:
//        all 132 SMs and 2-4 blocks per SM whose load / reduce / store phases drift apart. Blocks
//        also prefetch into L2 the chunk a quarter of the resident blocks ahead. 128x1048576:
//        ~90% (fp32) and ~86% (bf16) of copy bandwidth on the H200;
//      * without a workspace, a cluster of 16 (non-portable; 16 x 288 KiB covers a 2^20 fp32 row).
//        The H200 fits only 7 at once (112 of 132 SMs), one block per SM alternating load / reduce
//        / store: 128x1048576 at ~75% of copy bandwidth.
//  - long rows, pipelined (forced only, KernelChoice::pipeline = 1 in tuning.h): persistent
//    clusters that consume shared-memory pieces as they land and refill them with the next row;
//    measured slower than the one-shot kernel on every benchmark shape, so never chosen
//    automatically; kept as the variant the one-shot kernel is compared with.
//  - few long rows (4096+ accesses, rows x blocks < 132) with a workspace: the split path with
//    more blocks, two per SM (up to 128 per row): 1-8 rows of 10^6 columns no longer leave most
//    SMs idle, nor 7 rows of 128256 bf16 columns 7 of them busy.
//  - rows of <= 64 columns that are not whole aligned vectors: the tile kernel (a block's rows as
//    one flat span of 16-byte vectors through shared memory; see SoftmaxTileKernel). Tensors of
//    rows of <= 64 columns up to 128 KiB, aligned or not: lanes read straight from global memory
//    (SoftmaxTinyKernel), latency, not bandwidth, being their cost.
// Rows whose start is not 16-byte aligned (odd row lengths, offset pointers), with in and out at the
// same offset modulo 16, use the same kernels (E = true) on the row's 16-byte vectors plus a scalar
// head up to the first boundary and a scalar tail (RowEdges in common.cuh; <= 2 (W - 1) scalars
// per row, done by the short-row lanes, or by the first threads of the row's first block). Only
// pointers at different offsets use W = 1 (coalesced scalar access).
//
// Special values (as tests/reference.cc and PyTorch): a NaN or +inf in a row makes its sum NaN and
// so the whole row NaN; a row of only -inf has max -inf and e^(-inf - -inf) = NaN everywhere;
// -inf next to finite values gives 0. See MaxSum in common.cuh for the partial-state rules.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"

namespace fusebox::cuda {
namespace {

constexpr int kSmallThreads = 256;
constexpr int kChunkMaxThreads = 512;
constexpr int kBigSmemBytes = 224 * 1024;   // row data per block on the cluster path
constexpr uint32_t kBulkPiece = 32 * 1024;  // bytes per cp.async.bulk
constexpr int kMaxSplit = 128;               // blocks per row on the split path
constexpr int kFillBlocks = 264;             // two blocks per SM of the H200 (132 SMs)
constexpr uint32_t kSplitWaitNs = 1000000;    // a split block reads its row itself after 1 ms
constexpr bool kDefaultStreaming = false;   // plain loads/stores; .cs stores measured 2-5% slower
// Few rows (rows x blocks < 132) of at least this many accesses take the split path with more
// blocks (SplitWanted): one block per row of 64-256 KiB left most SMs idle (bf16 1x7x128256, a
// chunk kernel with 190 KB of shared memory per block on 7 SMs: 0.83x of torch.compile).
constexpr int kFewRowsSplitMin = 4096;
// Tensors of short rows up to this many bytes take SoftmaxTinyKernel (latency-bound: ~1.6-1.8 us
// under graph replay) instead of the tile; 128-thread blocks (the probe: 64-256 alike).
constexpr int64_t kTinyMaxBytes = 128 * 1024;
constexpr int kTinyThreads = 128;
// Tensors up to kProgramMaxBytes of at most kProgramMaxRows rows of kTileMaxCols + 1 ..
// kProgramMaxCols columns take SoftmaxProgramKernel (a block per row, few values per thread:
// latency-bound sizes, where the short-row kernel's warp per row with up to 128 values per lane
// lost to Triton's one-row program, fp16 2x4096 0.53x, bf16 33x251 0.66x, under graph replay).
// The limits are where it won in the sweep (lab/notes/kernels.md): with 4093 rows of 127 columns
// a block per row of one value per thread ran 0.65x against the short-row kernel's 1.12x; fp32
// rows of scalars past 4096 columns (5x7963, 36x8505: 16-32 loads per thread) 0.93-0.96x against
// the row-block kernel's vectors and edges 1.01-1.02x; 7 MiB of fp16 11008-column rows 0.78x.
constexpr int64_t kProgramMaxBytes = 4 << 20;
constexpr int64_t kProgramMaxRows = 1024;
constexpr int kProgramMaxCols = 16384;
constexpr int kProgramMaxScalarCols4 = 4096;  // 4-byte rows read as scalars

// e^(x - m) for a fixed m, in the form that m allows: Term (m = -inf: -inf inputs give 0 without
// making -inf - -inf), ExpFma (one FFMA; finite |m| <= kFmaExpMaxAbs, and only when `fma`), else
// ExpDiff. WithExp calls f with the functor, so each form is its own loop (no per-element choice).
// Where m is the row max itself (short rows), NoTerm = true: a row of only -inf must become NaN.
struct ExpTermOp {
  float m;
  __device__ __forceinline__ float operator()(float x) const { return Term(x, m); }
};
struct ExpDiffOp {
  float m;
  __device__ __forceinline__ float operator()(float x) const { return ExpDiff(x, m); }
};
struct ExpFmaOp {
  float ml;
  __device__ __forceinline__ float operator()(float x) const { return ExpFma(x, ml); }
};
// The output e^(x - m) / s, likewise: with the FFMA form 1/s goes into the exponent,
// 2^(x log2e - (m log2e + log2 s)), one FFMA and one ex2 per element and no multiply (adds the
// rounding of m log2e + log2 s: <= 70 x 2^-24 in the exponent, 3e-6 relative, for s <= 2^24).
struct OutFmaOp {
  float c;
  __device__ __forceinline__ float operator()(float x) const { return Ex2(fmaf(x, kLog2e, -c)); }
};
struct OutDiffOp {
  float m, inv;
  __device__ __forceinline__ float operator()(float x) const { return ExpDiff(x, m) * inv; }
};
template <typename F>
__device__ __forceinline__ void WithOut(float m, float s, bool fma, F&& f) {
  if (fma && FmaExpOk(m)) {
    f(OutFmaOp{fmaf(m, kLog2e, log2f(s))});
  } else {
    f(OutDiffOp{m, 1.0f / s});
  }
}
template <bool NoTerm = false, typename F>
__device__ __forceinline__ void WithExp(float m, bool fma, F&& f) {
  if (!NoTerm && m == -INFINITY) {
    f(ExpTermOp{m});
  } else if (fma && FmaExpOk(m)) {
    f(ExpFmaOp{m * kLog2e});
  } else {
    f(ExpDiffOp{m});
  }
}

// One access out: op(x) for each of its values.
template <typename T, int W, typename O>
__device__ __forceinline__ typename Pack<T, W>::Raw Output(const typename Pack<T, W>::Raw& r, const O& op) {
  float f[W];
  Unpack<T, W>(r, f);
#pragma unroll
  for (int e = 0; e < W; ++e) f[e] = op(f[e]);
  return PackFloats<T, W>(f);
}

// ------------------------------------------------------------------------------ short rows
// KeepExp: the sum pass keeps each e^(x - max) in registers and the output pass multiplies it by
// 1/sum (one exp per element; bitwise the same result as recomputing it with the same two-step
// output, exp_fma = -1); VPT x W <= 32 floats. Defaults: the default hints (plain loads and stores,
// the FFMA exponent) fixed at compile time, the arguments cs_arg / fma_arg ignored (one copy of each
// load and store, fewer registers); otherwise they are taken at run time. TPR > 0: lanes per row
// fixed at compile time (the loads share one address register with immediate offsets); TPR = 0:
// tpr_arg. Exact (with TPR): rows of exactly TPR x VPT accesses (nacc_arg ignored), no bounds checks.
// E: rows not 16-byte aligned (RowEdges; cols used only then): the row's vectors as above, and its
// head and tail elements e = lane and lane + tpr (tpr >= W, so 2 tpr >= head + tail), one scalar
// each, in the same max, sum and output.
template <typename T, int W, int VPT, bool KeepExp, bool Defaults, int TPR = 0, bool Exact = false, bool E = false>
__global__ __launch_bounds__(kSmallThreads) void SoftmaxSmallKernel(const T* in, T* out, int64_t rows,
                                                                    int nacc_arg, int tpr_arg, bool cs_arg,
                                                                    bool fma_arg, int64_t cols) {
  using R = typename Pack<T, W>::Raw;
  static_assert(!Exact || TPR > 0, "an exact row's length is known at compile time");
  const bool cs = Defaults ? kDefaultStreaming : cs_arg;
  const bool fma = Defaults || fma_arg;
  static_assert(!(E && Exact), "edge rows vary in length");
  const int tpr = TPR ? TPR : tpr_arg;
  const int lg = __ffs(tpr) - 1;  // tpr is a power of two: rows by shifts, not a division
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> lg) + (threadIdx.x >> lg);
  const bool active = row < rows;
  int nacc;
  const R* src;
  R* dst;
  RowEdges g{0, 0, 0};
  const T* irow = nullptr;
  T* orow = nullptr;
  if constexpr (E) {
    irow = in + (active ? row : 0) * cols;
    orow = out + (active ? row : 0) * cols;
    g = EdgesOf(irow, cols);
    nacc = g.nvec;
    src = reinterpret_cast<const R*>(irow + g.head);
    dst = reinterpret_cast<R*>(orow + g.head);
  } else {
    nacc = Exact ? TPR * VPT : nacc_arg;
    src = reinterpret_cast<const R*>(in) + (active ? row : 0) * nacc;
    dst = reinterpret_cast<R*>(out) + (active ? row : 0) * nacc;
  }
  constexpr int NE = E ? 2 : 1;  // edge elements per lane
  float xe[NE];
  bool he[NE];
#pragma unroll
  for (int q = 0; q < NE; ++q) {
    const int e = lane + q * tpr;
    he[q] = E && active && e < g.edges();
    xe[q] = -INFINITY;
    if constexpr (E) {
      if (he[q]) xe[q] = ToFloat<T>(LoadHint(cs, irow + EdgeIndex<T>(g, e)));
    }
  }
  R v[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int a = lane + j * tpr;
    if (active && (Exact || a < nacc)) v[j] = LoadHint(cs, src + a);
  }
  // Last access first: ptxas then issues every load before the first max (in load order it put
  // the first max between the loads, stalling the rest behind the first load's latency).
  float m = -INFINITY;
#pragma unroll
  for (int j = VPT - 1; j >= 0; --j) {
    const int a = lane + j * tpr;
    if (active && (Exact || a < nacc)) m = fmaxf(m, MaxOf<T, W>(v[j]));
  }
  if constexpr (E) m = fmaxf(m, fmaxf(xe[0], xe[1]));
  m = GroupMax(m, tpr);  // the row max: no partial-state rules needed below (-inf rows are NaN)
  static_assert(!KeepExp || VPT * W <= 32, "KeepExp holds VPT x W floats");
  float kept[KeepExp ? VPT * W : 1];
  float s = 0.f;
  WithExp<true>(m, fma, [&](const auto& ex) {
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int a = lane + j * tpr;
      if (active && (Exact || a < nacc)) {
        float f[W];
        Unpack<T, W>(v[j], f);
#pragma unroll
        for (int e = 0; e < W; ++e) {
          const float x = ex(f[e]);
          if constexpr (KeepExp) kept[j * W + e] = x;
          s += x;
        }
      }
    }
    if constexpr (E) {
#pragma unroll
      for (int q = 0; q < NE; ++q) {
        if (he[q]) {
          const float x = ex(xe[q]);
          if constexpr (KeepExp) xe[q] = x;
          s += x;
        }
      }
    }
  });
  s = GroupSum(s, tpr);  // outside WithExp: rows of one warp may take different forms
  if constexpr (KeepExp) {
    const float inv = 1.0f / s;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int a = lane + j * tpr;
      if (active && (Exact || a < nacc)) {
        float f[W];
#pragma unroll
        for (int e = 0; e < W; ++e) f[e] = kept[j * W + e] * inv;
        StoreHint(cs, dst + a, PackFloats<T, W>(f));
      }
    }
    if constexpr (E) {
#pragma unroll
      for (int q = 0; q < NE; ++q) {
        if (he[q]) StoreHint(cs, orow + EdgeIndex<T>(g, lane + q * tpr), FromFloat<T>(xe[q] * inv));
      }
    }
  } else {
    WithOut(m, s, fma, [&](const auto& op) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int a = lane + j * tpr;
        if (active && (Exact || a < nacc)) StoreHint(cs, dst + a, Output<T, W>(v[j], op));
      }
      if constexpr (E) {
#pragma unroll
        for (int q = 0; q < NE; ++q) {
          if (he[q]) StoreHint(cs, orow + EdgeIndex<T>(g, lane + q * tpr), FromFloat<T>(op(xe[q])));
        }
      }
    });
  }
}

// ------------------------------------------------------------------------------ long rows
template <typename T, int W, typename E>
__device__ __forceinline__ void AccumulateSum(const typename Pack<T, W>::Raw& r, const E& ex, float& s) {
  float f[W];
  Unpack<T, W>(r, f);
#pragma unroll
  for (int e = 0; e < W; ++e) s += ex(f[e]);
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

// Online update with accesses first, first + step, ... < n of src (L2-kept loads), 4 in flight.
template <typename T, int W>
__device__ __forceinline__ void StreamOnline(const typename Pack<T, W>::Raw* src, int first, int n, int step,
                                             MaxSum& st) {
  using R = typename Pack<T, W>::Raw;
  int a = first;
  for (; a + 3 * step < n; a += 4 * step) {
    R x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = LoadKeep(src + a + u * step);
#pragma unroll
    for (int u = 0; u < 4; ++u) AccumulateOnline<T, W>(x[u], st);
  }
  for (; a < n; a += step) AccumulateOnline<T, W>(LoadKeep(src + a), st);
}

// A row split over `blocks` independent blocks (no cluster) that combine their (max, sum) pairs
// through global memory: each block stores its pair as one 64-bit word in part[row * blocks + rank]
// (every word set to kUnsetPart before the launch) and its warp 0 reads the row's words until none
// is unset, so the wait's last read already brings the pairs (relaxed accesses suffice: nothing
// else is published). A block that waits longer than timeout_ns (its row-mates not scheduled: the
// GPU shared with other work) reads the whole row itself instead, so progress never depends on
// co-scheduling; only speed does.
struct Split {
  int blocks = 1;
  uint64_t* part = nullptr;
  uint32_t timeout_ns = 0;
};
constexpr unsigned char kUnsetByte = 0xFF;  // memset value: m's bits 0xFFFFFFFF, a NaN no max is
constexpr uint32_t kUnsetPart = 0xFFFFFFFFu;

// Split path, one row's blocks. Publish (thread 0): this block's pair (m is never NaN: fmaxf drops
// NaN; the check keeps the marker unambiguous anyway).
__device__ __forceinline__ void SplitPublish(const Split& sp, int64_t row, int rank, MaxSum tot) {
  uint32_t m = __float_as_uint(tot.m);
  if (m == kUnsetPart) m = 0x7FC00000u;
  StoreRelaxedGpu(&sp.part[row * sp.blocks + rank], (uint64_t{__float_as_uint(tot.s)} << 32) | m);
}
// Combine (the whole block): warp 0 reads the row's pairs until all are set and combines them;
// after the timeout the block reads the whole row instead. `slot` and `flag` are the block's shared
// scratch (free again when this returns).
template <typename T, int W, bool E = false>
__device__ MaxSum SplitCombine(const Split& sp, int64_t row, const T* in, int nacc, int64_t cols, MaxSum* scratch,
                               MaxSum* slot, int* flag) {
  const int t = threadIdx.x;
  if (t < 32) {
    const uint64_t t0 = GlobalTimerNs();
    const uint64_t* words = sp.part + row * sp.blocks;
    MaxSum r;
    bool ok;
    for (;;) {
      r = {-INFINITY, 0.f};
      bool set = true;
      for (int i = t; i < sp.blocks; i += 32) {
        const uint64_t w = LoadRelaxedGpu(&words[i]);
        set = set && static_cast<uint32_t>(w) != kUnsetPart;
        const MaxSum x{__uint_as_float(static_cast<uint32_t>(w)), __uint_as_float(static_cast<uint32_t>(w >> 32))};
        r = Combine(r, x);
      }
      ok = __all_sync(0xffffffffu, set);
      if (ok || __shfl_sync(0xffffffffu, GlobalTimerNs() - t0 >= sp.timeout_ns, 0)) break;
      __nanosleep(32);
    }
    r = WarpReduce(r);
    if (t == 0) {
      *slot = r;
      *flag = ok;
    }
  }
  __syncthreads();
  if (*flag) return *slot;
  using R = typename Pack<T, W>::Raw;  // the whole row, read from global memory by this block
  const R* whole = reinterpret_cast<const R*>(in) + row * nacc;
  int nv = nacc;
  MaxSum w{-INFINITY, 0.f};
  if constexpr (E) {
    const T* irow = in + row * cols;
    const RowEdges g = EdgesOf(irow, cols);
    whole = reinterpret_cast<const R*>(irow + g.head);
    nv = g.nvec;
    if (t < g.edges()) AccumulateOnline<T, 1>(LoadKeep(irow + EdgeIndex<T>(g, t)), w);
  }
  for (int a = t; a < nv; a += blockDim.x) AccumulateOnline<T, W>(LoadKeep(whole + a), w);
  return BlockReduce(w, scratch);
}

// Output of the accesses a, a + blockDim.x, ... < n read from global memory (the part of a chunk
// that is not held on chip), four loads in flight.
template <typename T, int W, typename O>
__device__ __forceinline__ void WriteStreamed(const typename Pack<T, W>::Raw* src, typename Pack<T, W>::Raw* dst,
                                              int a, int n, const O& op, bool cs) {
  using R = typename Pack<T, W>::Raw;
  const int nt = blockDim.x;
  for (; a + 3 * nt < n; a += 4 * nt) {
    R x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = LoadHint(cs, src + a + u * nt);
#pragma unroll
    for (int u = 0; u < 4; ++u) StoreHint(cs, dst + a + u * nt, Output<T, W>(x[u], op));
  }
  for (; a < n; a += nt) StoreHint(cs, dst + a, Output<T, W>(LoadHint(cs, src + a), op));
}

// Shared-memory row data filled by the bulk-copy engine in pieces of kBulkPiece bytes, one
// mbarrier each. IssuePieces (one thread): the n accesses at src into sm, one piece per barrier.
// FoldPieces (every thread): folds its share of the n accesses into st, each piece as soon as its
// barrier completes phase `parity`, so the exp work runs under the remaining copies.
constexpr int kPieceAccesses = static_cast<int>(kBulkPiece / 16);
__host__ __device__ __forceinline__ int PiecesOf(int n) { return (n + kPieceAccesses - 1) / kPieceAccesses; }
__device__ __forceinline__ void IssuePieces(const uint4* sm, const uint4* src, int n, uint64_t* bars) {
  for (int lo = 0, p = 0; lo < n; lo += kPieceAccesses, ++p) {
    const uint32_t bytes = static_cast<uint32_t>(min(n, lo + kPieceAccesses) - lo) * 16u;
    MbarArriveExpectTx(&bars[p], bytes);
    BulkLoad(const_cast<uint4*>(sm + lo), src + lo, bytes, &bars[p]);
  }
}
template <typename T>
__device__ __forceinline__ void FoldPieces(const uint4* sm, int n, uint64_t* bars, uint32_t parity, bool fma,
                                           MaxSum& st) {
  constexpr int W = 16 / sizeof(T);
  const int t = threadIdx.x, nt = blockDim.x;
  float m = st.m, s = st.s;
  for (int lo = 0, p = 0; lo < n; lo += kPieceAccesses, ++p) {
    const int hi = min(n, lo + kPieceAccesses);
    MbarWait(&bars[p], parity);
    float pm = m;
    for (int b = lo + t; b < hi; b += nt) pm = fmaxf(pm, MaxOf<T, W>(sm[b]));
    s = Rescale(s, m, pm);
    m = pm;
    WithExp(m, fma, [&](const auto& ex) {
      for (int b = lo + t; b < hi; b += nt) AccumulateSum<T, W>(sm[b], ex, s);
    });
  }
  st = {m, s};
}

// One block's chunk of one row: n accesses at src (out: dst), the first nreg in registers (VPT per
// thread), the next nsm in shared memory at sm (bulk copies of kBulkPiece, one mbarrier each in
// bars), the rest streamed from global memory (read again for the output). RegsOnly: the caller
// guarantees n <= blockDim.x x VPT, and the other paths are not compiled (fewer registers).
// E: the row is not 16-byte aligned (RowEdges); src / dst are its vectors' part, and the block
// that owns the edges (SetEdges) folds one head / tail element per thread into its reduction and
// writes it with the output.
template <typename T, int W, int VPT, bool RegsOnly = false, bool E = false>
struct ChunkPart {
  using R = typename Pack<T, W>::Raw;
  const R* src;
  R* dst;
  int n, nreg, nsm;
  const R* sm;
  uint64_t* bars;
  R v[VPT];
  T* edge_out = nullptr;  // E: this thread's edge element's output, if it has one
  const T* edge_in = nullptr;
  T edge_raw;

  __device__ __forceinline__ void SetEdges(const T* irow, T* orow, const RowEdges& g, bool owner) {
    const int t = threadIdx.x;
    if (owner && t < g.edges()) {
      const int64_t i = EdgeIndex<T>(g, t);
      edge_in = irow + i;
      edge_out = orow + i;
    }
  }

  __device__ __forceinline__ ChunkPart(const R* src_, R* dst_, int n_, int smem_acc, uint4* smem, uint64_t* bars_)
      : src(src_), dst(dst_), n(n_), sm(reinterpret_cast<const R*>(smem)), bars(bars_) {
    nreg = min(n, static_cast<int>(blockDim.x) * VPT);
    nsm = min(n - nreg, smem_acc);
  }
  // Issues the register loads (every thread) and the bulk copies (thread 0; the caller syncs
  // before anyone waits on the mbarriers).
  __device__ __forceinline__ void Issue(bool cs) {
    const int t = threadIdx.x, nt = blockDim.x;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int a = t + j * nt;
      if (a < nreg) v[j] = LoadHint(cs, src + a);
    }
    if constexpr (E) {
      if (edge_in != nullptr) edge_raw = LoadHint(cs, edge_in);
    }
    if constexpr (Pack<T, W>::kVec && !RegsOnly) {
      if (nsm > 0 && t == 0) {
        for (int p = 0; p < PiecesOf(nsm); ++p) MbarInit(&bars[p], 1);
        IssuePieces(sm, src + nreg, nsm, bars);
      }
    }
  }
  // This thread's (max, sum): the streamed remainder, the registers, then each shared-memory piece
  // as soon as it lands, so the exp work runs under the remaining loads.
  __device__ __forceinline__ MaxSum Reduce(bool fma) const {
    const int t = threadIdx.x, nt = blockDim.x;
    MaxSum st{-INFINITY, 0.f};
    if constexpr (E) {
      if (edge_in != nullptr) AccumulateOnline<T, 1>(edge_raw, st);
    }
    if constexpr (!RegsOnly) StreamOnline<T, W>(src, nreg + nsm + t, n, nt, st);
    float m = st.m;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (t + j * nt < nreg) m = fmaxf(m, MaxOf<T, W>(v[j]));
    }
    float s = Rescale(st.s, st.m, m);
    WithExp(m, fma, [&](const auto& ex) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (t + j * nt < nreg) AccumulateSum<T, W>(v[j], ex, s);
      }
    });
    MaxSum r{m, s};
    if constexpr (Pack<T, W>::kVec && !RegsOnly) FoldPieces<T>(sm, nsm, bars, 0, fma, r);
    return r;
  }
  // The output e^(x - max) / sum of the whole chunk, given the row's (max, sum).
  __device__ __forceinline__ void Write(MaxSum tot, bool fma, bool cs) const {
    const int t = threadIdx.x, nt = blockDim.x;
    WithOut(tot.m, tot.s, fma, [&](const auto& ex) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int a = t + j * nt;
        if (a < nreg) StoreHint(cs, dst + a, Output<T, W>(v[j], ex));
      }
      if constexpr (E) {
        if (edge_out != nullptr) StoreHint(cs, edge_out, FromFloat<T>(ex(ToFloat<T>(edge_raw))));
      }
      if constexpr (!RegsOnly) {
        if constexpr (Pack<T, W>::kVec) {
          for (int a = t; a < nsm; a += nt) StoreHint(cs, dst + nreg + a, Output<T, W>(sm[a], ex));
        }
        WriteStreamed<T, W>(src, dst, nreg + nsm + t, n, ex, cs);
      }
    });
  }
};

// One thread's L2 prefetch of n 16-byte accesses at g (cp.async.bulk.prefetch in kBulkPiece
// pieces): the DRAM reads of a block that starts later go on while this block reduces and stores.
__device__ __forceinline__ void PrefetchL2(const void* g, int64_t n) {
  const uint32_t bytes = static_cast<uint32_t>(n) * 16u;
  for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
    BulkPrefetchL2(static_cast<const char*>(g) + off, min(kBulkPiece, bytes - off));
  }
}

// One block per row of nacc accesses at `in`: thread 0 prefetches the row `ahead` blocks later, if
// the grid has it (the row-block kernels' prefetching form).
template <typename R>
__device__ __forceinline__ void PrefetchRowAhead(const R* in, int nacc, int ahead) {
  if (threadIdx.x == 0 && blockIdx.x + static_cast<int64_t>(ahead) < gridDim.x) {
    PrefetchL2(in + (blockIdx.x + static_cast<int64_t>(ahead)) * nacc, nacc);
  }
}

// grid.x = rows * csize (rows * sp.blocks when split); cluster (csize, 1, 1) when csize > 1.
// smem_acc: accesses of the chunk held in dynamic shared memory (vector path only).
// E: rows not 16-byte aligned (RowEdges; cols used only then): the chunks are of the row's vectors,
// and block 0 of the row also does its head and tail.
template <typename T, int W, int VPT, bool E = false>
__global__ __launch_bounds__(kChunkMaxThreads) void SoftmaxChunkKernel(const T* in, T* out, int nacc, int chunk,
                                                                       int csize, int smem_acc, bool cs,
                                                                       bool fma, Split sp, int ahead, int64_t cols) {
  using R = typename Pack<T, W>::Raw;
  extern __shared__ __align__(128) uint4 row_smem[];
  __shared__ MaxSum scratch[33];
  __shared__ MaxSum block_result, cluster_result;
  __shared__ __align__(8) uint64_t bars[kBigSmemBytes / kBulkPiece];  // one per bulk-copy piece
  __shared__ int all_arrived;

  const bool split = sp.blocks > 1;
  const int per_row = split ? sp.blocks : csize;
  const int rank = split ? static_cast<int>(blockIdx.x % per_row) : csize > 1 ? static_cast<int>(ClusterRank()) : 0;
  const int64_t row = blockIdx.x / per_row;
  const int a0 = rank * chunk;
  const int t = threadIdx.x;
  // The row's vectors (nv of them) in and out.
  auto body_of = [&](int64_t r, int& nv, RowEdges& g) -> int64_t {  // element offset of vector 0
    if constexpr (E) {
      g = EdgesOf(in + r * cols, cols);
      nv = g.nvec;
      return r * cols + g.head;
    } else {
      nv = nacc;
      return r * nacc * W;
    }
  };
  int nv;
  RowEdges g{0, 0, 0};
  const int64_t body = body_of(row, nv, g);
  ChunkPart<T, W, VPT, false, E> part(reinterpret_cast<const R*>(in + body) + a0, reinterpret_cast<R*>(out + body) + a0,
                                      max(0, min(nv - a0, chunk)), smem_acc, row_smem, bars);
  if constexpr (E) part.SetEdges(in + row * cols, out + row * cols, g, rank == 0);

  // 1. Issue every load: registers, the bulk copy into shared memory (the rest is streamed).
  part.Issue(cs);
  if constexpr (Pack<T, W>::kVec) {
    // The chunk of block blockIdx.x + ahead into L2: DRAM reads keep going while the blocks
    // on chip reduce, wait for their row-mates and store (that block then loads from L2).
    if (ahead > 0 && t == 0 && blockIdx.x + static_cast<int64_t>(ahead) < gridDim.x) {
      const int64_t fb = blockIdx.x + static_cast<int64_t>(ahead);
      const int fa0 = static_cast<int>(fb % per_row) * chunk;
      int fnv;
      RowEdges fg;
      const int64_t fbody = body_of(fb / per_row, fnv, fg);
      PrefetchL2(reinterpret_cast<const R*>(in + fbody) + fa0, max(0, min(fnv - fa0, chunk)));
    }
    __syncthreads();  // the mbarriers are initialised before anyone waits on them
  }

  // 2. This thread's (max, sum), then the block's.
  MaxSum tot = BlockReduce(part.Reduce(fma), scratch);

  // 3. The row's: the cluster's, or the split row's.
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
  } else if (split) {
    if (t == 0) SplitPublish(sp, row, rank, tot);
    tot = SplitCombine<T, W, E>(sp, row, in, nacc, cols, scratch, &cluster_result, &all_arrived);
  }

  // 4. Output pass.
  part.Write(tot, fma, cs);
  if (csize > 1) ClusterWait();  // nobody leaves while another block may still read its result
}

// ------------------------------------------------------------------------------ rows of one block
// A row that one block holds in registers (nacc <= threads x VPT; grid.x = rows): the same chunk
// code without the shared-memory, streamed, cluster and split paths, and with the default hints
// (plain loads and stores, the FFMA exponent) fixed at compile time: run-time flags cost fp32
// VPT 4 six registers. MaxT = 256 is held to 48 registers (5 blocks of 256 per SM where
// SoftmaxChunkKernel's 64 allow 4); MaxT = 512 (VPT <= 4) to 40 (fp32 VPT 4: 39,
// no spill), 3 blocks of 512 as Triton's 8192-column row program. Prefetch (512-thread vector
// kernels): after its loads, thread 0 prefetches into L2 the row `ahead` blocks later, as the chunk
// kernel does; `ahead` is unused otherwise.
constexpr int kRowBlockThreads = 256, kRowBlockWideThreads = 512;
constexpr int kPrefetchMinWaves = 12;  // the automatic row-block prefetch: rows / resident blocks
template <int MaxT>
constexpr int RowBlockMinBlocks() { return MaxT > kRowBlockThreads ? 3 : 5; }

// E: rows not 16-byte aligned (RowEdges; cols used only then).
template <typename T, int W, int VPT, int MaxT = kRowBlockThreads, bool Prefetch = false, bool E = false>
__global__ __launch_bounds__(MaxT, RowBlockMinBlocks<MaxT>()) void SoftmaxRowBlockKernel(const T* in, T* out,
                                                                                          int nacc, int ahead,
                                                                                          int64_t cols) {
  using R = typename Pack<T, W>::Raw;
  __shared__ MaxSum scratch[33];
  static_assert(!(E && Prefetch), "no prefetching form for edge rows");
  int64_t off;  // element offset of the row's first vector
  int nv;
  RowEdges g{0, 0, 0};
  if constexpr (E) {
    g = EdgesOf(in + static_cast<int64_t>(blockIdx.x) * cols, cols);
    off = static_cast<int64_t>(blockIdx.x) * cols + g.head;
    nv = g.nvec;
  } else {
    off = static_cast<int64_t>(blockIdx.x) * nacc * W;
    nv = nacc;
  }
  ChunkPart<T, W, VPT, true, E> part(reinterpret_cast<const R*>(in + off), reinterpret_cast<R*>(out + off), nv, 0,
                                     nullptr, nullptr);
  if constexpr (E) {
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * cols;
    part.SetEdges(in + r0, out + r0, g, true);
  }
  part.Issue(false);
  if constexpr (Prefetch) PrefetchRowAhead(reinterpret_cast<const R*>(in), nacc, ahead);
  const MaxSum tot = BlockReduce(part.Reduce(true), scratch);
  part.Write(tot, true, false);
}

// Rows of exactly blockDim.x x VPT accesses (vector path; VPT x W <= 32 floats per thread): the
// row-block kernel without bounds checks and with one exp per element, as Triton's one-row program.
// Each thread loads its VPT accesses, the block's max (plain fmaxf, one barrier), e^(x - max) in
// place of x, the block's sum (one barrier), then x times 1/sum. The max is the row's max, so
// special values need no partial-state rules (as the short-row KeepExp kernel).
template <typename T, int W, int VPT, int MaxT = kRowBlockThreads, bool Prefetch = false>
__global__ __launch_bounds__(MaxT, RowBlockMinBlocks<MaxT>()) void SoftmaxRowExactKernel(const T* in, T* out,
                                                                                          int nacc, int ahead,
                                                                                          int64_t /*cols*/) {
  using R = typename Pack<T, W>::Raw;
  static_assert(W > 1 && VPT * W <= 32, "the row's values are held as floats");
  __shared__ float slots[2][MaxT / 32];
  const int nt = blockDim.x;  // nacc == nt * VPT
  const int64_t off = static_cast<int64_t>(blockIdx.x) * nt * VPT + threadIdx.x;
  R v[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) v[j] = LoadHint(kDefaultStreaming, reinterpret_cast<const R*>(in) + off + j * nt);
  if constexpr (Prefetch) PrefetchRowAhead(reinterpret_cast<const R*>(in), nacc, ahead);
  float m = -INFINITY;
#pragma unroll
  for (int j = VPT - 1; j >= 0; --j) m = fmaxf(m, MaxOf<T, W>(v[j]));  // last first: every load issued
  m = BlockAllReduce<MaxT>(m, slots[0], -INFINITY, [](float a, float b) { return fmaxf(a, b); });
  float f[VPT][W];
  float s = 0.f;
  WithExp<true>(m, true, [&](const auto& ex) {
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      Unpack<T, W>(v[j], f[j]);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        f[j][e] = ex(f[j][e]);
        s += f[j][e];
      }
    }
  });
  s = BlockAllReduce<MaxT>(s, slots[1], 0.f, [](float a, float b) { return a + b; });
  const float inv = 1.0f / s;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
#pragma unroll
    for (int e = 0; e < W; ++e) f[j][e] *= inv;
    StoreHint(kDefaultStreaming, reinterpret_cast<R*>(out) + off + j * nt, PackFloats<T, W>(f[j]));
  }
}

// ------------------------------------------------------------------------------ row programs
// One block of MaxT threads per row (grid.x = rows), each thread holding J accesses (W elements:
// 16-byte vectors on aligned rows of whole vectors, else scalars, any alignment and offsets) at
// stride MaxT, as Triton's one-row program: loads, the block's max (one barrier), e^(x - max) kept
// in registers, the block's sum (one barrier), x times 1/sum. J x W <= 32 floats per thread. The
// max is the row's max, so special values need no partial-state rules (as SoftmaxRowExactKernel).
// Cost: one read and one write of the row; ~10 instructions per element; its latency chain is
// two loads-to-barrier trips, which is what a tensor of a few MiB or less pays for.
template <typename T, int W, int MaxT, int J>
__global__ __launch_bounds__(MaxT) void SoftmaxProgramKernel(const T* in, T* out, int64_t cols, int n) {
  using R = typename Pack<T, W>::Raw;
  static_assert(J * W <= 32, "the row's values are held as floats");
  __shared__ float slots[2][MaxT / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * cols;
  const R* src = reinterpret_cast<const R*>(in + row);
  R* dst = reinterpret_cast<R*>(out + row);
  R v[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int a = threadIdx.x + j * MaxT;
    if (a < n) v[j] = LoadHint(kDefaultStreaming, src + a);
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = J - 1; j >= 0; --j) {
    if (threadIdx.x + j * MaxT < n) m = fmaxf(m, MaxOf<T, W>(v[j]));
  }
  m = BlockAllReduce<MaxT>(m, slots[0], -INFINITY, [](float a, float b) { return fmaxf(a, b); });
  float f[J][W];
  float sum = 0.f;
  WithExp<true>(m, true, [&](const auto& ex) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (threadIdx.x + j * MaxT < n) {
        Unpack<T, W>(v[j], f[j]);
#pragma unroll
        for (int e = 0; e < W; ++e) {
          f[j][e] = ex(f[j][e]);
          sum += f[j][e];
        }
      }
    }
  });
  sum = BlockAllReduce<MaxT>(sum, slots[1], 0.f, [](float a, float b) { return a + b; });
  const float inv = 1.0f / sum;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int a = threadIdx.x + j * MaxT;
    if (a < n) {
#pragma unroll
      for (int e = 0; e < W; ++e) f[j][e] *= inv;
      StoreHint(kDefaultStreaming, dst + a, PackFloats<T, W>(f[j]));
    }
  }
}

// The row program for (W, threads, J), or nullptr where none is built (J x W > 32).
template <typename T, int W>
const void* ProgramKernel(int threads, int j) {
  auto with_t = [j](auto t) -> const void* {
    constexpr int MaxT = decltype(t)::value;
    switch (j) {
      case 1: return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 1>);
      case 2: return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 2>);
      case 4: return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 4>);
    }
    if constexpr (W <= 4) {
      if (j == 8) return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 8>);
    }
    if constexpr (W == 1) {
      if (j == 16) return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 16>);
      if (j == 32) return reinterpret_cast<const void*>(SoftmaxProgramKernel<T, W, MaxT, 32>);
    }
    return nullptr;
  };
  switch (threads) {
    case 128: return with_t(std::integral_constant<int, 128>{});
    case 256: return with_t(std::integral_constant<int, 256>{});
    case 512: return with_t(std::integral_constant<int, 512>{});
  }
  return nullptr;
}

// ------------------------------------------------------------------------------ long rows, pipelined
// Persistent version for rows that need shared memory: grid = nclusters * csize (as many clusters
// as the device holds at once); cluster c handles rows c, c + nclusters, ... Per block, the part of
// its chunk beyond the registers lives in shared memory as pieces of kPieceAccesses accesses, each
// filled by one bulk copy completing on its own mbarrier (one phase per row). The reduction
// consumes each piece as it lands, so the exp work hides under the loads; the output pass refills
// each piece with the next row's data as soon as every thread has read it, and reloads the
// registers after writing them, so the next row's reads overlap this row's writes.
constexpr int kMaxPieces = kBigSmemBytes / kBulkPiece;  // 7

template <typename T, int VPT>
__global__ __launch_bounds__(kChunkMaxThreads) void SoftmaxPipeKernel(const T* in, T* out, int64_t rows, int nacc,
                                                                      int chunk, int csize, int smem_acc,
                                                                      int nclusters) {
  constexpr int W = 16 / sizeof(T);
  constexpr bool cs = true;
  using R = uint4;
  extern __shared__ __align__(128) uint4 row_smem[];
  __shared__ MaxSum scratch[33];
  __shared__ MaxSum block_result[2];
  __shared__ MaxSum cluster_result;
  __shared__ __align__(8) uint64_t full[kMaxPieces];

  const int rank = csize > 1 ? static_cast<int>(ClusterRank()) : 0;
  const int64_t first_row = blockIdx.x / csize;
  const int a0 = rank * chunk;
  const int n = max(0, min(nacc - a0, chunk));
  const int t = threadIdx.x, nt = blockDim.x;
  const int nreg = min(n, nt * VPT);
  const int nsm = min(n - nreg, smem_acc);
  const int nstart = nreg + nsm;
  const int npieces = PiecesOf(nsm);
  const R* sm = row_smem;

  auto src_of = [&](int64_t row) { return reinterpret_cast<const R*>(in) + row * nacc + a0; };
  auto issue_piece = [&](const R* src, int p) {  // thread 0 only
    const int lo = p * kPieceAccesses, hi = min(nsm, lo + kPieceAccesses);
    const uint32_t bytes = static_cast<uint32_t>(hi - lo) * 16u;
    MbarArriveExpectTx(&full[p], bytes);
    BulkLoad(row_smem + lo, src + nreg + lo, bytes, &full[p]);
  };

  if (t == 0) {
    for (int p = 0; p < npieces; ++p) MbarInit(&full[p], 1);
  }
  __syncthreads();
  R v[VPT];
  if (first_row < rows) {
    const R* src = src_of(first_row);
    if (t == 0) {
      for (int p = 0; p < npieces; ++p) issue_piece(src, p);
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (t + j * nt < nreg) v[j] = LoadHint(cs, src + t + j * nt);
    }
  }
  int iter = 0;
  for (int64_t row = first_row; row < rows; row += nclusters, ++iter) {
    const R* src = src_of(row);
    R* dst = reinterpret_cast<R*>(out) + row * nacc + a0;
    const uint32_t parity = iter & 1;

    // Pass 1: registers, the streamed remainder (rows too long for the cluster), then each piece
    // as it lands.
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (t + j * nt < nreg) m = fmaxf(m, MaxOf<T, W>(v[j]));
    }
    float s = 0.f;
    WithExp(m, false, [&](const auto& ex) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (t + j * nt < nreg) AccumulateSum<T, W>(v[j], ex, s);
      }
    });
    MaxSum st{m, s};
    StreamOnline<T, W>(src, nstart + t, n, nt, st);
    FoldPieces<T>(sm, nsm, full, parity, false, st);

    // Block, then cluster (double-buffered slot: a block can be one row ahead of a reader).
    MaxSum tot = BlockReduce(st, scratch);
    if (csize > 1) {
      const int slot = iter & 1;
      if (t == 0) block_result[slot] = tot;
      ClusterArrive();
      ClusterWait();
      if (t < 32) {
        MaxSum r{-INFINITY, 0.f};
        if (t < csize) {
          const float2 x = LoadRemoteF2(MapRank(&block_result[slot], static_cast<uint32_t>(t)));
          r = {x.x, x.y};
        }
        r = WarpReduce(r);
        if (t == 0) cluster_result = r;
      }
      __syncthreads();
      tot = cluster_result;
    }

    // Pass 2: pieces (each refilled with the next row), the streamed remainder, registers.
    const OutDiffOp M{tot.m, 1.0f / tot.s};
    const int64_t next = row + nclusters;
    const R* nsrc = next < rows ? src_of(next) : nullptr;
    for (int p = 0; p < npieces; ++p) {
      const int lo = p * kPieceAccesses, hi = min(nsm, lo + kPieceAccesses);
      for (int a = lo + t; a < hi; a += nt) StoreHint(cs, dst + nreg + a, Output<T, W>(sm[a], M));
      __syncthreads();  // every thread has read piece p
      if (t == 0 && nsrc != nullptr) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        issue_piece(nsrc, p);
      }
    }
    WriteStreamed<T, W>(src, dst, nstart + t, n, M, cs);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (t + j * nt < nreg) StoreHint(cs, dst + t + j * nt, Output<T, W>(v[j], M));
    }
    if (nsrc != nullptr) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (t + j * nt < nreg) v[j] = LoadHint(cs, nsrc + t + j * nt);
      }
    }
  }
  if (csize > 1) {  // nobody leaves while another block may still read its last result
    ClusterArrive();
    ClusterWait();
  }
}

// ------------------------------------------------------------------------------ tiles of short rows
// Rows of <= kTileMaxCols columns that are not whole aligned vectors (cols = 1, 7, 13, 62, or any
// offset): the block's tile_rows rows as one flat span through shared memory (TileLoad /
// TileStore in common.cuh), each row's max and sum by tpr = 1 << lg lanes, E elements per
// lane at stride tpr (consecutive lanes read consecutive elements: at most 32 / tpr banks
// conflict). One exp per element (kept between the sum and the output); the loops over a tile's
// rows run the same passes in every lane (the group shuffles need whole warps). Special values as
// the short-row kernel (the row max is m: all -inf gives NaN, cols = 1 gives 1 or NaN).
template <typename T, int E>
__global__ __launch_bounds__(kTileThreads) void SoftmaxTileKernel(const T* in, T* out, int64_t rows, int cols,
                                                                  int tile_rows, int lg, bool cs) {
  extern __shared__ uint4 tile_smem[];
  T* sm = reinterpret_cast<T*>(tile_smem);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int nrows = static_cast<int>(rows - row0 < tile_rows ? rows - row0 : tile_rows);
  const int n = nrows * cols;
  const TileSpan t = TileSpanOf(in + row0 * cols, n);
  TileLoad<T>(cs, in + row0 * cols, n, sm, t);
  __syncthreads();
  T* base = sm + t.lead;
  if (cols == 1) {
    // e^(x - x) / e^(x - x): 1 where x is finite, NaN for NaN and +-inf, as x - x + 1 (IEEE; no
    // fast-math folds it). The row loop below would spend ~35 instructions on each element, more
    // than the 4 per clock an SM issues at HBM speed for 2-byte elements.
    for (int i = threadIdx.x; i < n; i += kTileThreads) {
      const float x = ToFloat<T>(base[i]);
      base[i] = FromFloat<T>(x - x + 1.0f);
    }
    __syncthreads();
    TileStore<T>(cs, out + row0 * cols, n, sm, t);
    return;
  }
  const int tpr = 1 << lg;
  const int lane = threadIdx.x & (tpr - 1);
  for (int r0 = 0; r0 < nrows; r0 += kTileThreads >> lg) {
    const int r = r0 + (threadIdx.x >> lg);
    const bool act = r < nrows;
    T* rp = base + (act ? r : 0) * cols;
    float x[E];
    float m = -INFINITY;
#pragma unroll
    for (int q = 0; q < E; ++q) {
      if (q * tpr >= cols) break;  // the same in every lane: slots past the row are not issued
      const int c = lane + q * tpr;
      x[q] = act && c < cols ? ToFloat<T>(rp[c]) : -INFINITY;
      m = fmaxf(m, x[q]);
    }
    m = GroupMax(m, tpr);
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < E; ++q) {
      if (q * tpr >= cols) break;  // the same in every lane: slots past the row are not issued
      const int c = lane + q * tpr;
      x[q] = act && c < cols ? ExpDiff(x[q], m) : 0.f;
      sum += x[q];
    }
    sum = GroupSum(sum, tpr);
    // 1 <= sum <= 64 (or NaN): the approximate reciprocal (2 ulp) is well inside the tolerance and
    // saves the IEEE division's ~10 instructions per row.
    const float inv = __fdividef(1.0f, sum);
#pragma unroll
    for (int q = 0; q < E; ++q) {
      if (q * tpr >= cols) break;  // the same in every lane: slots past the row are not issued
      const int c = lane + q * tpr;
      if (act && c < cols) rp[c] = FromFloat<T>(x[q] * inv);
    }
  }
  __syncthreads();
  TileStore<T>(cs, out + row0 * cols, n, sm, t);
}

// Tiny tensors of short rows (kTinyMaxBytes, cols <= kTileMaxCols): `tpr` lanes per row read
// their E elements straight from global memory (scalar, coalesced across the rows), reduce with
// shuffles and write: no shared memory and no barrier. At these sizes the kernel is its latency
// chain, not bandwidth: the tile's trip through shared memory and two barriers cost ~0.5 us of a
// 2 us call under graph replay (bf16 631x13: 2.15 us against 1.72 for this form, Triton's
// one-row program 1.73; lab/probes/tiny_softmax_probe.cu). Special values as the tile kernel.
template <typename T, int E>
__global__ __launch_bounds__(kTinyThreads) void SoftmaxTinyKernel(const T* in, T* out, int rows, int cols,
                                                                  int lg) {
  const int tpr = 1 << lg;
  const int lane = threadIdx.x & (tpr - 1);
  const int r = static_cast<int>((blockIdx.x * kTinyThreads + threadIdx.x) >> lg);
  const bool act = r < rows;
  const T* ip = in + (act ? r : 0) * cols;
  float x[E];
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    x[q] = act && c < cols ? ToFloat<T>(ip[c]) : -INFINITY;
    m = fmaxf(m, x[q]);
  }
  m = GroupMax(m, tpr);
  float sum = 0.f;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    x[q] = act && c < cols ? ExpDiff(x[q], m) : 0.f;
    sum += x[q];
  }
  sum = GroupSum(sum, tpr);
  const float inv = __fdividef(1.0f, sum);  // 1 <= sum <= 64 (or NaN), as in the tile kernel
  T* op = out + (act ? r : 0) * cols;
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int c = lane + q * tpr;
    if (act && c < cols) op[c] = FromFloat<T>(x[q] * inv);
  }
}

// ------------------------------------------------------------------------------ host side
enum class Kind { kRows, kRowBlock, kChunk, kPipe, kTile, kTiny, kProgram };
struct Plan {
  bool vec = false;    // 16-byte aligned rows of whole vectors
  bool edges = false;  // other rows, in and out at the same offset modulo 16: head / vectors / tail
  Kind kind = Kind::kRows;
  int nacc = 0;
  int tpr = 0, vpt = 0;                      // short rows
  bool exp_once = false;                     // short rows: KeepExp; rows of one block: exact kernel
  bool exact = false;                        // short rows: the Exact form (vpt = accesses per lane)
  int csize = 1, threads = 0, smem_acc = 0;  // long rows
  int chunk = 0;
  int split = 1;                             // long rows: blocks per row meeting in global memory
  uint32_t split_wait_ns = 0;
  int nclusters = 0;  // pipelined: clusters launched (persistent)
  const void* kernel = nullptr;  // long rows: the kernel launched (for occupancy queries)
  bool cs = true;     // streaming cache hints
  bool fma = true;    // e^(x - m) in one FFMA where |m| allows (WithExp)
  int ahead = 0;      // long rows: L2 prefetch of the chunk this many blocks ahead (0 = none)
  int tile_rows = 0;  // tile kernel: rows per block (tpr: lanes per row)
  int tile_elems = 4;  // tile kernel: a row's elements per lane
};

int CurrentDevice() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) d = 0;
  return d;
}

// Per (kernel, device): raise the dynamic shared-memory limit, allow clusters of 16, and record
// whether the device can co-schedule a cluster of 16 blocks of 512 threads with 224 KiB each.
// Per (kernel, device, cluster, threads, shared memory): how many clusters fit at once.
// Cached under a mutex (a map lookup per launch); CUDA errors of refused queries are cleared.
std::mutex g_mu;
std::map<std::pair<const void*, int>, bool> g_prepared;
std::map<std::tuple<const void*, int, int, int, int>, int> g_active;

bool PrepareKernel(const void* kernel) {
  const int dev = CurrentDevice();
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_prepared.find({kernel, dev});
  if (it != g_prepared.end()) return it->second;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigSmemBytes);
  bool c16 = false;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = ClusterLaunchConfig(16 * 16, kChunkMaxThreads, kBigSmemBytes, 16, nullptr, attr);
    int clusters = 0;
    c16 = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters >= 1;
  }
  cudaGetLastError();
  g_prepared[{kernel, dev}] = c16;
  return c16;
}

int ActiveClusters(const void* kernel, int csize, int threads, int smem) {
  PrepareKernel(kernel);
  const int dev = CurrentDevice();
  std::lock_guard<std::mutex> lock(g_mu);
  const auto key = std::make_tuple(kernel, dev, csize, threads, smem);
  auto it = g_active.find(key);
  if (it != g_active.end()) return it->second;
  int n = 0;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = ClusterLaunchConfig(csize * 64, threads, smem, csize, nullptr, attr, true);
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) n = 0;
  cudaGetLastError();
  g_active[key] = n;
  return n;
}

// Blocks of `kernel` the whole device holds at once (plain launch), cached like ActiveClusters.
// Only kernels with dynamic shared memory are prepared (the row-block kernels keep their attributes).
std::map<std::tuple<const void*, int, int, int>, int> g_resident;
int ResidentBlocks(const void* kernel, int threads, int smem) {
  if (smem > 0) PrepareKernel(kernel);
  const int dev = CurrentDevice();
  std::lock_guard<std::mutex> lock(g_mu);
  const auto key = std::make_tuple(kernel, dev, threads, smem);
  auto it = g_resident.find(key);
  if (it != g_resident.end()) return it->second;
  int per_sm = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    per_sm = sms = 0;
  }
  cudaGetLastError();
  g_resident[key] = per_sm * sms;
  return per_sm * sms;
}

// f(std::integral_constant<int, V>{}) for the long-row kernels' accesses per thread V = vpt (1, 2,
// 4 or 8; MakePlan allows no other): one switch for every per-VPT instantiation.
template <typename F>
decltype(auto) WithVpt(int vpt, F&& f) {
  switch (vpt) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}
// The row-block kernel's block size: 512 threads where VPT <= 4 and more than 256 are asked for.
int RowBlockMaxThreads(int vpt) { return vpt <= 4 ? kRowBlockWideThreads : kRowBlockThreads; }
// The row-block kernel for (vpt, threads); with `prefetch`, its prefetching form, which only
// 512-thread vector kernels have (nullptr otherwise).
template <typename T, int W, int VPT, bool E>
const void* RowBlockKernelPtrV(int threads, bool prefetch) {
  if constexpr (E) {  // no prefetching form
    if (prefetch) return nullptr;
  }
  if constexpr (VPT <= 4) {
    if (threads > kRowBlockThreads && prefetch) {
      if constexpr (Pack<T, W>::kVec && !E) {
        return reinterpret_cast<const void*>(SoftmaxRowBlockKernel<T, W, VPT, kRowBlockWideThreads, true>);
      }
    } else if (threads > kRowBlockThreads) {
      return reinterpret_cast<const void*>(SoftmaxRowBlockKernel<T, W, VPT, kRowBlockWideThreads, false, E>);
    }
  }
  return prefetch ? nullptr : reinterpret_cast<const void*>(SoftmaxRowBlockKernel<T, W, VPT, kRowBlockThreads, false, E>);
}
template <typename T, int W, bool E = false>
const void* RowBlockKernelPtr(int vpt, int threads, bool prefetch) {
  return WithVpt(vpt, [&](auto v) { return RowBlockKernelPtrV<T, W, v(), E>(threads, prefetch); });
}
// The exact row-block kernel: <= 32 floats per thread, <= 16 in 512-thread blocks (their 40
// registers spill 32); its prefetching form in 512-thread blocks only; nullptr for any other.
template <typename T, int W>
const void* RowExactKernelPtr(int vpt, int threads, bool prefetch) {
  return WithVpt(vpt, [&](auto v) -> const void* {
    constexpr int VPT = v();
    if constexpr (W > 1 && VPT * W <= 32) {
      if (threads > kRowBlockThreads) {
        if constexpr (VPT * W <= 16) {
          return prefetch ? reinterpret_cast<const void*>(SoftmaxRowExactKernel<T, W, VPT, kRowBlockWideThreads, true>)
                          : reinterpret_cast<const void*>(SoftmaxRowExactKernel<T, W, VPT, kRowBlockWideThreads>);
        } else {
          return nullptr;
        }
      }
      if (prefetch) return nullptr;
      return reinterpret_cast<const void*>(SoftmaxRowExactKernel<T, W, VPT>);
    } else {
      return nullptr;
    }
  });
}
template <typename T, int W, bool E = false>
const void* ChunkKernelPtr(int vpt) {
  return WithVpt(vpt, [](auto v) { return reinterpret_cast<const void*>(SoftmaxChunkKernel<T, W, v(), E>); });
}
template <typename T>
const void* PipeKernelPtr(int vpt) {
  return vpt == 8 ? reinterpret_cast<const void*>(SoftmaxPipeKernel<T, 8>)
                  : reinterpret_cast<const void*>(SoftmaxPipeKernel<T, 4>);
}

// The short-row kernel's Exact form for rows of exactly tpr x per accesses: built for 4-32 lanes
// per row and the per-lane counts whose values fit as floats (KeepExp, the default hints); nullptr
// for any other.
template <typename T>
using SmallKernelFn = void (*)(const T*, T*, int64_t, int, int, bool, bool, int64_t);
template <typename T, int W>
SmallKernelFn<T> SmallExactKernel(int tpr, int per) {
  auto with_tpr = [&](auto vpt) -> SmallKernelFn<T> {
    constexpr int VPT = decltype(vpt)::value;
    if constexpr (W > 1 && VPT * W <= 32) {
      switch (tpr) {
        case 4: return SoftmaxSmallKernel<T, W, VPT, true, true, 4, true>;
        case 8: return SoftmaxSmallKernel<T, W, VPT, true, true, 8, true>;
        case 16: return SoftmaxSmallKernel<T, W, VPT, true, true, 16, true>;
        case 32: return SoftmaxSmallKernel<T, W, VPT, true, true, 32, true>;
        default: return nullptr;
      }
    } else {
      return nullptr;
    }
  };
  switch (per) {
    case 2: return with_tpr(std::integral_constant<int, 2>{});
    case 4: return with_tpr(std::integral_constant<int, 4>{});
    case 8: return with_tpr(std::integral_constant<int, 8>{});
    default: return nullptr;
  }
}

// Workspace of a split launch: one 64-bit (max, sum) word per block, set to the marker by the launcher.
size_t SplitBytes(int64_t rows, int split) {
  return split > 1 ? static_cast<size_t>(rows) * split * sizeof(uint64_t) : 0;
}

int RoundUp32(int64_t x) { return static_cast<int>(std::max<int64_t>(32, CeilDiv(x, 32) * 32)); }

// Accesses one long-row block holds on chip: 512 threads x 8 in registers + 224 KiB of shared
// memory (vector path) = 18432.
int64_t BlockCap(bool vec) { return static_cast<int64_t>(kChunkMaxThreads) * 8 + (vec ? kBigSmemBytes / 16 : 0); }

// Blocks per row the split path wants (1 = none): as forced, or, automatically, for vector rows
// that need 8 or more on-chip blocks, rather than a cluster of 16, which only 7 at a time fit on
// the H200 (112 SMs): 128 KiB per block for 4-byte types, 64 KiB for 2-byte (more blocks per SM).
// 128x1048576: fp32 +14%, bf16 +11% over the cluster. Rows of 4096+ accesses too few to give
// every SM a block (rows x blocks < 132; e.g. 1-8 rows of 10^6 columns) are split further, into
// blocks of >= 2048 accesses (in registers), two per SM. Arithmetic only: the workspace query
// (SoftmaxWorkspaceBytes, on the server's sizing path) uses it without touching the device.
template <typename T>
int SplitWanted(const KernelChoice& k, int64_t rows, int nacc, bool vec) {
  if (k.long_rows < 0 || (k.long_rows == 0 && nacc <= 512)) return 1;  // short-row kernel
  if (k.split != 0) return std::max(1, k.split);
  if (k.cluster != 0 || k.pipeline > 0 || !vec) return 1;
  const int need = Pow2Ceil(CeilDiv(nacc, BlockCap(vec)));
  int64_t split = need < 8 ? 1 : std::min<int64_t>(64, CeilDiv(nacc, sizeof(T) == 4 ? 8192 : 4096));
  if (nacc >= kFewRowsSplitMin && rows * std::max<int64_t>(split, need) < kFillBlocks / 2) {
    split = std::max(split, std::min(CeilDiv(kFillBlocks, rows), CeilDiv(nacc, 2048)));
  }
  split = std::min<int64_t>(kMaxSplit, split);
  return split > need || need >= 8 ? static_cast<int>(split) : 1;
}


// Whether `k` forces a kernel field other than tile / tile_elems / row_program (then the kernel it
// forces, not the automatic tile or tiny kernel).
bool ForcesOther(const KernelChoice& k) {
  return k.threads_per_row != 0 || k.vectors_per_thread != 0 || k.threads != 0 || k.long_rows != 0 ||
         k.pipeline != 0 || k.exp_once != 0 || k.cluster != 0 || k.split != 0 || k.smem_bytes != 0;
}
// The automatic row program (SoftmaxProgramKernel), nothing else forced: see kProgramMaxBytes.
// `vec`: the rows are read as 16-byte vectors (else scalars).
bool ProgramAuto(const KernelChoice& k, int64_t rows, int64_t cols, size_t elem, bool vec) {
  // Hints forced too keep the kernel they were measured on (the row program has none of them).
  const bool hints = k.streaming != 0 || k.exp_fma != 0 || k.prefetch != 0 || k.split_wait_us != 0;
  return k.row_program == 0 && k.tile == 0 && !ForcesOther(k) && !hints && cols > kTileMaxCols && cols <= kProgramMaxCols &&
         rows <= kProgramMaxRows && rows * cols * static_cast<int64_t>(elem) <= kProgramMaxBytes &&
         (vec || elem != 4 || cols <= kProgramMaxScalarCols4);
}

template <typename T>
cudaError_t MakePlan(const KernelChoice& k, const void* in, const void* out, int64_t rows, int64_t cols,
                     size_t ws_bytes, Plan* p) {
  constexpr int W = 16 / sizeof(T);
  p->vec = cols % W == 0 && Aligned16(in) && Aligned16(out);
  // Other rows whose in and out share their offset modulo 16: vectors between a scalar head and
  // tail, except where a short-row choice forces fewer than W lanes per row (the kernel's two
  // edge elements per lane need W).
  auto short_rows = [&](int64_t n) { return k.long_rows < 0 || (k.long_rows == 0 && n <= 512); };
  p->edges = !p->vec && EdgesOk<T>(in, out) &&
             !(short_rows(cols / W) && k.threads_per_row != 0 && k.threads_per_row < W);
  const bool body = p->vec || p->edges;  // 16-byte vectors
  const int64_t nacc64 = body ? cols / W : cols;
  if (nacc64 > kMaxRowAccesses) return cudaErrorInvalidValue;
  p->nacc = static_cast<int>(nacc64);
  p->cs = k.streaming == 0 ? kDefaultStreaming : k.streaming > 0;
  p->fma = k.exp_fma >= 0;
  const int nacc = p->nacc;
  // Rows of <= 64 columns that are not whole aligned vectors: the tile kernel (every access a full
  // 16-byte vector of the flat span; the short-row kernel gave such rows a warp-sized group and
  // per-row scalar heads and tails: fp32 1259977x7 at 40% of copy, bf16 cols = 1 at 0.04x of
  // torch.compile). Aligned rows of whole vectors keep the short-row kernel (measured 86-88% of
  // copy at 16 columns). Forcing any other short-row field keeps the kernel it forces.
  const bool others = ForcesOther(k);
  // Tiny tensors of such rows, aligned or not: SoftmaxTinyKernel (tile = 2 forces it on any
  // number of rows of <= 64 columns). 4 elements per lane at most.
  const bool tiny_size = rows * cols * static_cast<int64_t>(sizeof(T)) <= kTinyMaxBytes;
  if (k.tile == 2 || (k.tile == 0 && !others && cols <= kTileMaxCols && tiny_size)) {
    if (cols > kTileMaxCols || rows * kTileMaxCols > INT_MAX) return cudaErrorInvalidValue;
    p->kind = Kind::kTiny;
    p->tpr = Pow2Ceil(CeilDiv(cols, int64_t{4}));
    p->threads = kTinyThreads;
    return cudaSuccess;
  }
  if (k.tile > 0 || (k.tile == 0 && !others && !p->vec && cols <= kTileMaxCols)) {
    if (cols > kTileMaxCols || k.tile < -1 || k.tile > 1) return cudaErrorInvalidValue;
    const int elems = k.tile_elems ? k.tile_elems : TileElemsFor(true, cols, sizeof(T));
    if (elems != 4 && elems != 8 && elems != 16) return cudaErrorInvalidValue;
    const TileShape ts = TileShapeOf(rows, cols, sizeof(T), elems);
    if (CeilDiv(rows, ts.rows) > INT_MAX) return cudaErrorInvalidValue;
    p->kind = Kind::kTile;
    p->tile_elems = elems;
    p->tpr = ts.tpr;
    p->tile_rows = ts.rows;
    p->threads = kTileThreads;
    return cudaSuccess;
  }
  if (k.tile < -1 || k.tile > 2) return cudaErrorInvalidValue;
  // Tensors of a few MiB of up to 1024 rows of 65-16384 columns (ProgramAuto): a block per row
  // (SoftmaxProgramKernel), vectors on aligned rows of whole vectors, scalars otherwise; about 8
  // values per thread (128-512 threads). KernelChoice::row_program = 1 forces it (threads as
  // k.threads), -1 never.
  if (k.row_program < -1 || k.row_program > 1) return cudaErrorInvalidValue;
  if (k.row_program > 0 || ProgramAuto(k, rows, cols, sizeof(T), p->vec)) {
    if (cols > kProgramMaxCols || rows > INT_MAX) return cudaErrorInvalidValue;
    p->kind = Kind::kProgram;
    const int64_t n = p->vec ? cols / W : cols;
    p->threads = k.threads ? k.threads : static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(128, Pow2Ceil(CeilDiv(cols, 8)))));
    p->vpt = Pow2Ceil(CeilDiv(n, p->threads));
    p->nacc = static_cast<int>(n);
    const void* kernel = p->vec ? ProgramKernel<T, W>(p->threads, p->vpt) : ProgramKernel<T, 1>(p->threads, p->vpt);
    return kernel ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (short_rows(nacc)) {
    p->kind = Kind::kRows;
    p->vpt = k.vectors_per_thread ? k.vectors_per_thread : nacc <= 128 ? 4 : nacc <= 256 ? 8 : 16;
    if (p->vpt != 4 && p->vpt != 8 && p->vpt != 16) return cudaErrorInvalidValue;
    // fp32 rows of <= 64 accesses: 2 accesses per lane (measured faster than 4 for 128 columns).
    const int per_lane = sizeof(T) == 4 && nacc <= 64 && !k.vectors_per_thread ? 2 : p->vpt;
    p->tpr = k.threads_per_row ? k.threads_per_row : std::min(32, Pow2Ceil(CeilDiv(nacc, per_lane)));
    if (p->edges) p->tpr = std::max(p->tpr, W);
    if (p->tpr < 1 || p->tpr > 32 || (p->tpr & (p->tpr - 1)) != 0) return cudaErrorInvalidValue;
    if (static_cast<int64_t>(p->tpr) * p->vpt < nacc) return cudaErrorInvalidValue;
    // A warp per row: one-warp blocks (as torch.compile), fp32 65536x1024 +1.6-2%.
    const int auto_threads = p->tpr == 32 ? 32 : kSmallThreads;
    p->threads = k.threads ? k.threads : auto_threads;  // a power of two, tpr..256, >= 32
    if (p->threads < std::max(32, p->tpr) || p->threads > kSmallThreads || (p->threads & (p->threads - 1)) != 0) {
      return cudaErrorInvalidValue;
    }
    // One exp per element wherever the row's values fit in registers (VPT x W <= 32 floats): bf16
    // 262144x128 +4%, 65536x1024 +1.7%, fp32 within +-1% (in-process A/B).
    const int per_access = body ? W : 1;
    const bool fits = p->vpt * per_access <= 32;
    p->exp_once = k.exp_once == 0 ? fits : k.exp_once > 0;
    if (p->exp_once && !fits) return cudaErrorInvalidValue;
    // Rows of exactly tpr x `per` accesses: the Exact form where it is built (no bounds checks, the
    // row's shape fixed at compile time); pipeline = -1 keeps the checks, 1 insists on it.
    const int per = nacc % p->tpr == 0 ? nacc / p->tpr : 0;
    p->exact = k.pipeline >= 0 && p->vec && p->exp_once && p->cs == kDefaultStreaming && p->fma &&
               SmallExactKernel<T, W>(p->tpr, per) != nullptr;
    if (k.pipeline > 0 && !p->exact) return cudaErrorInvalidValue;
    if (p->exact) p->vpt = per;
    // Exact rows of fewer than 32 lanes: 128-thread blocks (standalone probe, fp32 / bf16
    // 262144x128: +1.6 / +0.5-1.0% over 256).
    if (p->exact && !k.threads && p->tpr < 32) p->threads = 128;
    return cudaSuccess;
  }
  if (k.cluster < 0 || k.cluster > 16 || k.threads < 0 || k.threads > kChunkMaxThreads || k.threads % 32 != 0) {
    return cudaErrorInvalidValue;
  }
  if (k.split < 0 || k.split > kMaxSplit || (k.split > 1 && (k.cluster > 1 || k.pipeline > 0)) ||
      k.prefetch < -1 || k.prefetch > 8) {
    return cudaErrorInvalidValue;
  }
  const int64_t cap = BlockCap(body);
  const int need_c = Pow2Ceil(CeilDiv(nacc, cap));  // blocks that hold the row on chip
  // The split path where the caller gives the workspace (else clusters): automatically with 256
  // threads x 8 accesses in registers and the rest in shared memory; blocks also prefetch
  // into L2 the chunk a quarter of the resident blocks ahead.
  const int want = SplitWanted<T>(k, rows, nacc, body);
  const bool auto_split = k.split == 0 && want > 1 && SplitBytes(rows, want) <= ws_bytes;
  const int split = k.split > 1 ? k.split : auto_split ? want : 1;
  if (SplitBytes(rows, split) > ws_bytes) return cudaErrorInvalidValue;
  const bool pipe = p->vec && k.pipeline > 0;  // measured slower than one-shot: forced only
  // Clusters: fp32 measured faster with 4 accesses per thread in registers and more shared memory
  // (2969 vs 2821 GB/s at 128x1048576).
  const bool huge = CeilDiv(nacc, cap) > 4;
  int vpt = k.vectors_per_thread ? k.vectors_per_thread
            : auto_split         ? 8
            : (huge && sizeof(T) == 4 && body) ? 4
                                                 : 8;
  if (vpt != 1 && vpt != 2 && vpt != 4 && vpt != 8) return cudaErrorInvalidValue;
  if (pipe && vpt != 4 && vpt != 8) return cudaErrorInvalidValue;
  const void* kernel = pipe       ? PipeKernelPtr<T>(vpt)
                       : p->vec   ? ChunkKernelPtr<T, W>(vpt)
                       : p->edges ? ChunkKernelPtr<T, W, true>(vpt)
                                  : ChunkKernelPtr<T, 1>(vpt);
  const int max_c = PrepareKernel(kernel) ? 16 : 8;
  const int auto_c = need_c >= 8 ? max_c : need_c;  // from 8 up, the largest the device runs
  int csize, threads, smem_acc = 0;
  if (pipe) {
    threads = k.threads ? k.threads : kChunkMaxThreads;
    csize = k.cluster ? k.cluster : auto_c;
  } else {
    // One-shot kernel: registers, then shared memory, rest streamed.
    csize = split > 1 ? 1 : k.cluster ? k.cluster : auto_c;
    threads = k.threads     ? k.threads
              : auto_split ? 256
                           : std::min(kChunkMaxThreads, RoundUp32(CeilDiv(CeilDiv(nacc, csize * split), vpt)));
  }
  if (csize > max_c) return cudaErrorInvalidValue;
  const int64_t chunk = CeilDiv(nacc, csize * split);
  const int64_t rest = std::max<int64_t>(0, chunk - static_cast<int64_t>(threads) * vpt);
  if (body) {  // shared memory for what the registers do not hold (auto), as forced, or none (-1)
    const int limit = k.smem_bytes > 0 ? std::min(k.smem_bytes, kBigSmemBytes) / 16
                      : k.smem_bytes < 0 ? 0
                                         : kBigSmemBytes / 16;
    smem_acc = static_cast<int>(std::min<int64_t>(rest, limit));
  }
  if (rows * csize * split > INT_MAX) return cudaErrorInvalidValue;
  p->kind = pipe ? Kind::kPipe : Kind::kChunk;
  p->split = split;
  // L2 prefetch distance in quarters of the blocks resident at once (vector rows, one-shot kernels).
  const int prefetch = body && !pipe ? (k.prefetch != 0 ? std::max(0, k.prefetch) : auto_split ? 1 : 0) : 0;
  int quarters = prefetch;  // the launched kernel's
  p->split_wait_ns = k.split_wait_us < 0 ? 0u : k.split_wait_us > 0 ? k.split_wait_us * 1000u : kSplitWaitNs;
  // A row in the registers of one block (<= 256 threads, or 512 with <= 4 accesses each) and
  // nothing else asked for (no cluster size, the default hints): the lean kernel, if it has the
  // form asked for (a prefetch: 512-thread vector kernels only).
  if (!pipe && k.cluster == 0 && csize == 1 && split == 1 && smem_acc == 0 && !p->cs && p->fma &&
      threads <= RowBlockMaxThreads(vpt) && chunk <= int64_t{threads} * vpt) {
    int lvpt = vpt, lthreads = threads;
    // 4-byte rows of 1025-2048 accesses (fp32 8192 columns): 512 threads x 4 (39 registers, 3
    // blocks per SM, 75%) rather than 256 x 8 (48, 5 blocks, 62.5%): +0.3%.
    if (sizeof(T) == 4 && body && !k.vectors_per_thread && !k.threads && chunk > 1024) {
      lvpt = 4;
      lthreads = RoundUp32(CeilDiv(chunk, lvpt));
    }
    // 2-byte rows of exactly 1024 accesses (8192 columns): the exact kernel at 512 x 2 rather than
    // the row-block kernel at 128 x 8 (bf16 8192^2 +0.6% in a standalone probe).
    if (sizeof(T) == 2 && p->vec && !k.vectors_per_thread && !k.threads && k.exp_once >= 0 && chunk == 1024) {
      lvpt = 2;
      lthreads = 512;
    }
    // 4-byte rows of one 512-thread block (fp32 4097-8192 columns), at least kPrefetchMinWaves
    // times as many as the blocks resident at once: automatically the prefetch a quarter of the
    // resident blocks ahead (fp32 8192^2 +1.7%, 32768 rows +2.3%, but 2048 rows -3.2%; 2-byte rows
    // lose 1-3% with it).
    int lprefetch = prefetch;
    if (k.prefetch == 0 && sizeof(T) == 4 && p->vec && lthreads > kRowBlockThreads) {
      const void* plain = RowBlockKernelPtr<T, W>(lvpt, lthreads, false);
      if (plain != nullptr && rows >= int64_t{kPrefetchMinWaves} * ResidentBlocks(plain, lthreads, 0)) lprefetch = 1;
    }
    const bool pf = lprefetch > 0;
    // Rows of exactly threads x vpt accesses whose values fit as floats: the exact kernel (one exp
    // per element, no bounds checks), automatically for 2-byte types; exp_once = 1 asks for it on
    // 4-byte rows too, -1 keeps the recomputing kernel. fp32 8192^2 in a standalone probe: the
    // recomputing kernel 0.1-0.3% faster than the exact one and Triton's compiled program.
    const void* exact =
        p->vec && chunk == int64_t{lthreads} * lvpt ? RowExactKernelPtr<T, W>(lvpt, lthreads, pf) : nullptr;
    const bool exp_once = exact != nullptr && (k.exp_once > 0 || (k.exp_once == 0 && sizeof(T) == 2));
    const void* lean = exp_once ? exact
                       : p->vec   ? RowBlockKernelPtr<T, W>(lvpt, lthreads, pf)
                       : p->edges ? RowBlockKernelPtr<T, W, true>(lvpt, lthreads, pf)
                                  : RowBlockKernelPtr<T, 1>(lvpt, lthreads, pf);
    if (lean != nullptr) {
      p->kind = Kind::kRowBlock;
      p->exp_once = exp_once;
      kernel = lean;
      vpt = lvpt;
      threads = lthreads;
      quarters = lprefetch;
    }
  }
  if (quarters > 0) {
    const int smem = p->kind == Kind::kRowBlock ? 0 : smem_acc * 16;
    p->ahead = static_cast<int>(std::max<int64_t>(1, int64_t{ResidentBlocks(kernel, threads, smem)} * quarters / 4));
  }
  p->kernel = kernel;
  p->vpt = vpt;
  p->csize = csize;
  p->threads = threads;
  p->smem_acc = smem_acc;
  p->chunk = static_cast<int>(chunk);
  if (pipe) {
    const int active = ActiveClusters(kernel, csize, threads, smem_acc * 16);
    p->nclusters = static_cast<int>(active > 0 ? std::min<int64_t>(rows, active) : std::min<int64_t>(rows, 1 << 16));
  }
  return cudaSuccess;
}

cudaLaunchConfig_t ClusterConfig(const Plan& p, unsigned blocks, cudaStream_t s, cudaLaunchAttribute* attr) {
  return ClusterLaunchConfig(blocks, p.threads, p.smem_acc * 16, p.csize, s, attr);
}

// The split path's arguments in the workspace, its words set to the unset marker on the stream.
cudaError_t SetUpSplit(const Plan& p, int64_t rows, void* ws, cudaStream_t s, Split* sp) {
  if (p.split <= 1) return cudaSuccess;
  sp->blocks = p.split;
  sp->part = static_cast<uint64_t*>(ws);
  sp->timeout_ns = p.split_wait_ns;
  return cudaMemsetAsync(sp->part, kUnsetByte, SplitBytes(rows, p.split), s);
}

// The row-block kernel MakePlan chose (p.kernel: its VPT and block size).
template <typename T>
cudaError_t LaunchRowBlock(const Plan& p, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  const T* i = static_cast<const T*>(in);
  T* o = static_cast<T*>(out);
  int nacc = p.nacc, ahead = p.ahead;
  void* args[] = {&i, &o, &nacc, &ahead, &cols};
  const cudaError_t e = cudaLaunchKernel(p.kernel, dim3(static_cast<unsigned>(rows)), dim3(p.threads), args, 0, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T, int W, int VPT, bool E>
cudaError_t LaunchChunk(const Plan& p, const void* in, void* out, int64_t rows, int64_t cols, void* ws,
                        cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = ClusterConfig(p, static_cast<unsigned>(rows * p.csize * p.split), s, attr);
  Split sp;
  if (const cudaError_t z = SetUpSplit(p, rows, ws, s, &sp); z != cudaSuccess) return z;
  const cudaError_t e =
      cudaLaunchKernelEx(&cfg, SoftmaxChunkKernel<T, W, VPT, E>, static_cast<const T*>(in), static_cast<T*>(out),
                         p.nacc, p.chunk, p.csize, p.smem_acc, p.cs, p.fma, sp, p.ahead, cols);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

template <typename T, int VPT>
cudaError_t LaunchPipe(const Plan& p, const void* in, void* out, int64_t rows, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = ClusterConfig(p, static_cast<unsigned>(p.nclusters) * p.csize, s, attr);
  const cudaError_t e =
      cudaLaunchKernelEx(&cfg, SoftmaxPipeKernel<T, VPT>, static_cast<const T*>(in), static_cast<T*>(out), rows,
                         p.nacc, p.chunk, p.csize, p.smem_acc, p.nclusters);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

template <typename T, int W, bool E = false>
cudaError_t LaunchPlanW(const Plan& p, const void* in, void* out, int64_t rows, int64_t cols, void* ws,
                        cudaStream_t s) {
  if (p.kind == Kind::kRows) {
    const int rows_per_block = p.threads / p.tpr;
    const int64_t blocks = CeilDiv(rows, rows_per_block);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const T* i = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    const unsigned g = static_cast<unsigned>(blocks);
    if (p.exact) {
      if constexpr (!E) {
        SmallExactKernel<T, W>(p.tpr, p.vpt)<<<g, p.threads, 0, s>>>(i, o, rows, p.nacc, p.tpr, p.cs, p.fma, cols);
        return cudaGetLastError();
      }
      return cudaErrorInvalidValue;  // MakePlan never takes it for edge rows
    }
    // The compile-time-hint kernel for 2-byte types and warp-per-row fp32 rows, the run-time one
    // for other fp32 rows (in-process A/B, run-time vs compile-time hints: fp32 262144x128 4135 vs
    // 4065 GB/s, bf16 262144x128 3730 vs 3820, fp32 65536x1024 4196 vs 4218).
    const bool defaults = p.cs == kDefaultStreaming && p.fma && (sizeof(T) == 2 || p.tpr == 32);
    // KeepExp is allowed by MakePlan only where VPT x W <= 32.
    auto launch = [&](auto vpt, auto keep) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool Keep = decltype(keep)::value;
      if constexpr (E) {  // lanes per row at run time
        if constexpr (!Keep || VPT * W <= 32) {
          auto kernel = defaults ? SoftmaxSmallKernel<T, W, VPT, Keep, true, 0, false, true>
                                 : SoftmaxSmallKernel<T, W, VPT, Keep, false, 0, false, true>;
          kernel<<<g, p.threads, 0, s>>>(i, o, rows, p.nacc, p.tpr, p.cs, p.fma, cols);
          return cudaGetLastError();
        } else {
          return cudaErrorInvalidValue;
        }
      } else if constexpr (!Keep || VPT * W <= 32) {
        auto kernel = SoftmaxSmallKernel<T, W, VPT, Keep, false>;
        if (defaults) {
          kernel = SoftmaxSmallKernel<T, W, VPT, Keep, true>;
          if constexpr (W > 1) {  // lanes per row at compile time where the plan picks them
            if (p.tpr == 32) kernel = SoftmaxSmallKernel<T, W, VPT, Keep, true, 32>;
            if constexpr (sizeof(T) == 2) {
              if (p.tpr == 4) kernel = SoftmaxSmallKernel<T, W, VPT, Keep, true, 4>;
              if (p.tpr == 8) kernel = SoftmaxSmallKernel<T, W, VPT, Keep, true, 8>;
              if (p.tpr == 16) kernel = SoftmaxSmallKernel<T, W, VPT, Keep, true, 16>;
            }
          }
        }
        kernel<<<g, p.threads, 0, s>>>(i, o, rows, p.nacc, p.tpr, p.cs, p.fma, cols);
        return cudaGetLastError();
      } else {
        return cudaErrorInvalidValue;  // not built (MakePlan never asks for it)
      }
    };
    auto with_keep = [&](auto vpt) {
      return p.exp_once ? launch(vpt, std::true_type{}) : launch(vpt, std::false_type{});
    };
    switch (p.vpt) {
      case 4: return with_keep(std::integral_constant<int, 4>{});
      case 8: return with_keep(std::integral_constant<int, 8>{});
      default: return with_keep(std::integral_constant<int, 16>{});
    }
  }
  if constexpr (W > 1 && !E) {
    if (p.kind == Kind::kPipe) {
      return p.vpt == 8 ? LaunchPipe<T, 8>(p, in, out, rows, s) : LaunchPipe<T, 4>(p, in, out, rows, s);
    }
  }
  if (p.kind == Kind::kRowBlock) return LaunchRowBlock<T>(p, in, out, rows, cols, s);
  return WithVpt(p.vpt, [&](auto v) { return LaunchChunk<T, W, v(), E>(p, in, out, rows, cols, ws, s); });
}

template <typename T>
cudaError_t LaunchTile(const Plan& p, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, p.tile_rows));  // MakePlan checked it
  const int smem = TileSmemBytes<T>(p.tile_rows * static_cast<int>(cols));    // <= 8 KiB + a pass
  auto* kernel = p.tile_elems == 16 ? SoftmaxTileKernel<T, 16>
                 : p.tile_elems == 8 ? SoftmaxTileKernel<T, 8>
                                     : SoftmaxTileKernel<T, 4>;
  kernel<<<blocks, kTileThreads, smem, s>>>(static_cast<const T*>(in), static_cast<T*>(out), rows,
                                            static_cast<int>(cols), p.tile_rows, __builtin_ctz(p.tpr), p.cs);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchTiny(const Plan& p, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(CeilDiv(rows * p.tpr, int64_t{kTinyThreads}));
  const int lg = __builtin_ctz(p.tpr);
  const auto* i = static_cast<const T*>(in);
  auto* o = static_cast<T*>(out);
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  const int64_t e = CeilDiv(cols, int64_t{p.tpr});
  if (e <= 1) {
    SoftmaxTinyKernel<T, 1><<<blocks, kTinyThreads, 0, s>>>(i, o, r, c, lg);
  } else if (e <= 2) {
    SoftmaxTinyKernel<T, 2><<<blocks, kTinyThreads, 0, s>>>(i, o, r, c, lg);
  } else {
    SoftmaxTinyKernel<T, 4><<<blocks, kTinyThreads, 0, s>>>(i, o, r, c, lg);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSoftmaxT(const KernelChoice& k, const void* in, void* out, int64_t rows, int64_t cols,
                           cudaStream_t s, Workspace ws) {
  Plan p;
  const cudaError_t e = MakePlan<T>(k, in, out, rows, cols, ws.ptr ? ws.bytes : 0, &p);
  if (e != cudaSuccess) return e;
  if (p.kind == Kind::kTile) return LaunchTile<T>(p, in, out, rows, cols, s);
  if (p.kind == Kind::kTiny) return LaunchTiny<T>(p, in, out, rows, cols, s);
  constexpr int W = 16 / sizeof(T);
  if (p.kind == Kind::kProgram) {
    const void* kernel = p.vec ? ProgramKernel<T, W>(p.threads, p.vpt) : ProgramKernel<T, 1>(p.threads, p.vpt);
    int n = p.nacc;
    void* args[] = {&in, &out, &cols, &n};
    const cudaError_t le = cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(rows)), dim3(p.threads), args, 0, s);
    return le != cudaSuccess ? le : cudaGetLastError();
  }
  if (p.vec) return LaunchPlanW<T, W>(p, in, out, rows, cols, ws.ptr, s);
  if (p.edges) return LaunchPlanW<T, W, true>(p, in, out, rows, cols, ws.ptr, s);
  return LaunchPlanW<T, 1>(p, in, out, rows, cols, ws.ptr, s);
}

template <typename T>
size_t WorkspaceBytesT(const KernelChoice& k, int64_t rows, int64_t cols) {
  // As in and out at the same offset modulo 16 bytes have it (pool memory): vectors, with a scalar
  // head and tail where the rows are not aligned.
  constexpr int W = 16 / sizeof(T);
  const int64_t nacc = cols / W;
  if (nacc > kMaxRowAccesses || k.row_program > 0 || ProgramAuto(k, rows, cols, sizeof(T), cols % W == 0)) return 0;
  return SplitBytes(rows, SplitWanted<T>(k, rows, static_cast<int>(nacc), true));
}

}  // namespace

size_t SoftmaxWorkspaceBytesWith(const KernelChoice& k, DType dt, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  switch (dt) {
    case DType::kFloat32: return WorkspaceBytesT<float>(k, rows, cols);
    case DType::kFloat16: return WorkspaceBytesT<__half>(k, rows, cols);
    case DType::kBFloat16: return WorkspaceBytesT<__nv_bfloat16>(k, rows, cols);
  }
  return 0;
}

size_t SoftmaxWorkspaceBytes(DType dt, int64_t rows, int64_t cols) {
  return SoftmaxWorkspaceBytesWith(KernelChoice{}, dt, rows, cols);
}

cudaError_t LaunchSoftmaxWith(const KernelChoice& k, DType dt, const void* in, void* out, int64_t rows,
                              int64_t cols, cudaStream_t s, Workspace ws) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: return LaunchSoftmaxT<float>(k, in, out, rows, cols, s, ws);
    case DType::kFloat16: return LaunchSoftmaxT<__half>(k, in, out, rows, cols, s, ws);
    case DType::kBFloat16: return LaunchSoftmaxT<__nv_bfloat16>(k, in, out, rows, cols, s, ws);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSoftmax(DType dt, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s,
                          Workspace ws) {
  return LaunchSoftmaxWith(KernelChoice{}, dt, in, out, rows, cols, s, ws);
}

void DescribeSoftmax(DType dt, const void* in, const void* out, int64_t rows, int64_t cols,
                     const KernelChoice& k, char* buf, int len, size_t workspace_bytes) {
  Plan p;
  cudaError_t e = cudaErrorInvalidValue;
  switch (dt) {
    case DType::kFloat32: e = MakePlan<float>(k, in, out, rows, cols, workspace_bytes, &p); break;
    case DType::kFloat16: e = MakePlan<__half>(k, in, out, rows, cols, workspace_bytes, &p); break;
    case DType::kBFloat16: e = MakePlan<__nv_bfloat16>(k, in, out, rows, cols, workspace_bytes, &p); break;
  }
  if (e != cudaSuccess) {
    std::snprintf(buf, len, "softmax/invalid");
  } else if (p.kind == Kind::kTiny) {
    std::snprintf(buf, len, "softmax/tiny tpr=%d t=%d", p.tpr, p.threads);
  } else if (p.kind == Kind::kProgram) {
    std::snprintf(buf, len, "softmax/program %s t=%d j=%d", p.vec ? "vec" : "scalar", p.threads, p.vpt);
  } else if (p.kind == Kind::kTile) {
    std::snprintf(buf, len, "softmax/tile tpr=%d e=%d rows=%d t=%d %s", p.tpr, p.tile_elems, p.tile_rows,
                  p.threads, p.cs ? "cs" : "plain");
  } else if (p.kind == Kind::kRows) {
    std::snprintf(buf, len, "softmax/rows %s tpr=%d v=%d t=%d %s%s%s", p.vec ? "vec" : p.edges ? "edges" : "scalar", p.tpr, p.vpt,
                  p.threads, p.cs ? "cs" : "plain", p.exp_once ? " exp-once" : "", p.exact ? " exact" : "");
  } else {
    // Clusters the device holds at once (pipelined: launched), e.g. 7 of 16 blocks on the H200.
    std::string clusters;
    if (p.kind == Kind::kPipe) {
      clusters = " clusters=" + std::to_string(p.nclusters);
    } else if (p.csize > 1) {
      clusters = " active=" + std::to_string(ActiveClusters(p.kernel, p.csize, p.threads, p.smem_acc * 16));
    } else if (p.split > 1) {  // blocks per row, and how many blocks the device holds at once
      clusters = " split=" + std::to_string(p.split) +
                 " resident=" + std::to_string(ResidentBlocks(p.kernel, p.threads, p.smem_acc * 16));
    }
    if (p.ahead > 0) clusters += " ahead=" + std::to_string(p.ahead);
    const char* name = p.kind == Kind::kPipe ? "pipe" : p.kind == Kind::kRowBlock ? "rowblock" : "chunk";
    std::snprintf(buf, len, "softmax/%s %s c=%d t=%d v=%d smem=%d %s%s%s", name, p.vec ? "vec" : p.edges ? "edges" : "scalar", p.csize,
                  p.threads, p.vpt, p.smem_acc * 16, p.cs ? "cs" : "plain", clusters.c_str(),
                  p.exp_once ? " exact" : "");
  }
}

}  // namespace fusebox::cuda
