// Shared device helpers for the memory-bound kernels (gelu.cu, softmax.cu, rowsum.cu):
// 16-byte packed loads/stores with float conversion for float32 / float16 / bfloat16,
// streaming cache hints, fast exp2, warp/group/block reductions, the (max, sum) pair used by
// softmax, the sm_90 cluster / mbarrier / bulk-copy primitives and the global-memory word
// primitives (inline PTX).
// Costs nothing by itself: every function here is inlined into the kernels.
// nvcc only; no absl, no gRPC.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/dtype.h"

namespace fusebox::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------
// Packed access of W consecutive elements of T. W * sizeof(T) == 16 is the vector path (one
// 16-byte load/store); W == 1 is the scalar path for rows or pointers that are not 16-byte aligned.
template <typename T, int W>
struct Pack {
  static constexpr bool kVec = W * sizeof(T) == 16;
  static constexpr bool kVec8 = W > 1 && W * sizeof(T) == 8;  // 8-byte accesses (row sum)
  static_assert(kVec || kVec8 || W == 1, "W must be 1 or an 8- or 16-byte vector");
  using Raw = std::conditional_t<kVec, uint4, std::conditional_t<kVec8, uint2, T>>;
};

__device__ __forceinline__ float Bf16LoToFloat(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float Bf16HiToFloat(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ uint32_t PackPair(float lo, float hi, __half*) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t PackPair(float lo, float hi, __nv_bfloat16*) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ void UnpackPair(uint32_t u, float& lo, float& hi, __half*) {
  __half2 h = *reinterpret_cast<__half2*>(&u);
  const float2 f = __half22float2(h);
  lo = f.x;
  hi = f.y;
}
__device__ __forceinline__ void UnpackPair(uint32_t u, float& lo, float& hi, __nv_bfloat16*) {
  lo = Bf16LoToFloat(u);
  hi = Bf16HiToFloat(u);
}

// Raw -> W floats.
template <typename T, int W>
__device__ __forceinline__ void Unpack(const typename Pack<T, W>::Raw& r, float (&f)[W]) {
  if constexpr (Pack<T, W>::kVec8) {
    if constexpr (std::is_same_v<T, float>) {
      f[0] = __uint_as_float(r.x);
      f[1] = __uint_as_float(r.y);
    } else {
      UnpackPair(r.x, f[0], f[1], static_cast<T*>(nullptr));
      UnpackPair(r.y, f[2], f[3], static_cast<T*>(nullptr));
    }
  } else if constexpr (!Pack<T, W>::kVec) {
    f[0] = ToFloat<T>(r);
  } else if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  } else {
    UnpackPair(r.x, f[0], f[1], static_cast<T*>(nullptr));
    UnpackPair(r.y, f[2], f[3], static_cast<T*>(nullptr));
    UnpackPair(r.z, f[4], f[5], static_cast<T*>(nullptr));
    UnpackPair(r.w, f[6], f[7], static_cast<T*>(nullptr));
  }
}

// W floats -> Raw (round to nearest even for the half types).
template <typename T, int W>
__device__ __forceinline__ typename Pack<T, W>::Raw PackFloats(const float (&f)[W]) {
  if constexpr (!Pack<T, W>::kVec) {
    return FromFloat<T>(f[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  } else {
    return make_uint4(PackPair(f[0], f[1], static_cast<T*>(nullptr)),
                      PackPair(f[2], f[3], static_cast<T*>(nullptr)),
                      PackPair(f[4], f[5], static_cast<T*>(nullptr)),
                      PackPair(f[6], f[7], static_cast<T*>(nullptr)));
  }
}

// Loads: "stream" = read once (evict-first in L1 and L2); "keep" = will be read again soon.
// 8-byte stream loads (the row sum's) carry an L2 evict-first cache policy, as torch.compile's
// row sum does; the policy is a constant the compiler keeps in a register.
template <typename R>
__device__ __forceinline__ R LoadStream(const R* p) {
  if constexpr (std::is_same_v<R, uint4>) {
    return __ldcs(p);
  } else if constexpr (std::is_same_v<R, uint2>) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    uint2 r;
    asm("ld.global.L1::evict_first.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(r.x), "=r"(r.y)
        : "l"(p), "l"(policy));
    return r;
  } else if constexpr (std::is_same_v<R, float>) {
    return __ldcs(p);
  } else {  // __half / __nv_bfloat16: 16-bit load
    const unsigned short u = __ldcs(reinterpret_cast<const unsigned short*>(p));
    R r;
    *reinterpret_cast<unsigned short*>(&r) = u;
    return r;
  }
}
template <typename R>
__device__ __forceinline__ R LoadKeep(const R* p) {
  if constexpr (std::is_same_v<R, uint4>) {
    return __ldg(p);
  } else if constexpr (std::is_same_v<R, float>) {
    return __ldg(p);
  } else {
    const unsigned short u = __ldg(reinterpret_cast<const unsigned short*>(p));
    R r;
    *reinterpret_cast<unsigned short*>(&r) = u;
    return r;
  }
}
template <typename R>
__device__ __forceinline__ void StoreStream(R* p, const R& v) {
  if constexpr (std::is_same_v<R, uint4>) {
    __stcs(p, v);
  } else if constexpr (std::is_same_v<R, float>) {
    __stcs(p, v);
  } else {
    __stcs(reinterpret_cast<unsigned short*>(p), *reinterpret_cast<const unsigned short*>(&v));
  }
}

// Loads / stores with the cache hint chosen at run time (a uniform branch): cs = streaming
// (.cs, evict-first), otherwise plain ld.global / st.global.
template <typename R>
__device__ __forceinline__ R LoadHint(bool cs, const R* p) {
  if (cs) return LoadStream(p);
  return *p;
}
template <typename R>
__device__ __forceinline__ void StoreHint(bool cs, R* p, const R& v) {
  if (cs) {
    StoreStream(p, v);
  } else {
    *p = v;
  }
}

// 2^x on the special-function unit (max rel. error about 2^-22; -inf -> +0, +inf -> inf, NaN -> NaN).
__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// e^(x - m): the difference first, so that huge inputs keep their precision.
__device__ __forceinline__ float ExpDiff(float x, float m) { return Ex2((x - m) * kLog2e); }
// e^(x - m) in one FFMA, given ml = m * kLog2e: x log2e - ml is exact before its one rounding, so
// the only error added is ml's rounding, |m| 2^-24 relative (<= 2e-6 where it is used: finite
// |m| <= kFmaExpMaxAbs, see FmaExpOk). x = -inf gives 0, NaN gives NaN, as ExpDiff.
constexpr float kFmaExpMaxAbs = 32.f;
__device__ __forceinline__ bool FmaExpOk(float m) { return fabsf(m) <= kFmaExpMaxAbs; }
__device__ __forceinline__ float ExpFma(float x, float ml) { return Ex2(fmaf(x, kLog2e, -ml)); }

// Largest of the W values of r. Packed half pairs compare in one instruction each (max.f16x2 /
// max.bf16x2: exact, and like fmaxf a NaN is never chosen over a number).
__device__ __forceinline__ uint32_t MaxPair(uint32_t a, uint32_t b, __half*) {
  uint32_t r;
  asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t MaxPair(uint32_t a, uint32_t b, __nv_bfloat16*) {
  uint32_t r;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
template <typename T, int W>
__device__ __forceinline__ float MaxOf(const typename Pack<T, W>::Raw& r) {
  if constexpr (sizeof(T) == 2 && W == 8) {
    const uint32_t p = MaxPair(MaxPair(r.x, r.y, static_cast<T*>(nullptr)),
                               MaxPair(r.z, r.w, static_cast<T*>(nullptr)), static_cast<T*>(nullptr));
    float lo, hi;
    UnpackPair(p, lo, hi, static_cast<T*>(nullptr));
    return fmaxf(lo, hi);
  } else {
    float f[W];
    Unpack<T, W>(r, f);
    float m = f[0];
#pragma unroll
    for (int e = 1; e < W; ++e) m = fmaxf(m, f[e]);
    return m;
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions. Groups are `tpr` consecutive lanes (a power of two <= 32) aligned to tpr.
__device__ __forceinline__ float GroupSum(float v, int tpr) {
  for (int o = tpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// fmaxf ignores NaN: a NaN never becomes the maximum (softmax turns NaN rows into NaN via the sum).
__device__ __forceinline__ float GroupMax(float v, int tpr) {
  for (int o = tpr >> 1; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Softmax partial state: m = max seen, s = sum of e^(x - m) over the values seen.
// Rules that keep -inf and NaN right (see softmax.cu): a -inf input contributes 0 to s; a rescale
// between equal maxima is the identity (so -inf / -inf and inf / inf make no NaN); NaN inputs make
// s NaN, which makes the whole row NaN at the end.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ float Rescale(float s, float m_old, float m_new) {
  return m_old == m_new ? s : s * ExpDiff(m_old, m_new);
}
__device__ __forceinline__ float Term(float x, float m) {
  return x == -INFINITY ? 0.f : ExpDiff(x, m);
}
// One exp: only the pair with the smaller max is rescaled (by e^(-|a.m - b.m|); equal maxima,
// -inf / -inf and inf / inf included, add as they are).
__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const bool a_big = a.m >= b.m;
  const float m = a_big ? a.m : b.m, lo = a_big ? b.m : a.m;
  const float big = a_big ? a.s : b.s, small = a_big ? b.s : a.s;
  return {m, big + Rescale(small, lo, m)};
}
__device__ __forceinline__ MaxSum WarpReduce(MaxSum v) {
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum w;
    w.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    w.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    v = Combine(v, w);
  }
  return v;
}

// Whole-block reductions (blockDim.x a multiple of 32, <= 1024). BlockReduce: `scratch` holds 33
// slots, every thread gets the result, two __syncthreads.
__device__ __forceinline__ MaxSum BlockReduce(MaxSum v, MaxSum* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  v = WarpReduce(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < nwarps ? scratch[lane] : MaxSum{-INFINITY, 0.f};
    w = WarpReduce(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  return scratch[32];
}
// Block-wide op(v) of every thread's v, returned to every thread (one barrier): each warp reduces
// by shuffles, lane 0 stores into slots[warp], then every warp reduces the MaxT / 32 slots itself
// (no second barrier). blockDim.x a multiple of 32, <= MaxT; `identity` fills the slots of warps
// the block lacks. A second call needs other slots (a warp may still be reading these).
template <int MaxT, typename Op>
__device__ __forceinline__ float BlockAllReduce(float v, float* slots, float identity, Op op) {
  static_assert(MaxT % 64 == 0 && MaxT <= 1024, "2 to 32 warps");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  const int w = lane & (MaxT / 32 - 1);  // each group of MaxT / 32 lanes holds every slot
  v = w < static_cast<int>(blockDim.x >> 5) ? slots[w] : identity;
  for (int o = MaxT / 64; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block sum, valid in thread 0 only (one barrier); scratch: 32 floats.
__device__ __forceinline__ float BlockSumToFirst(float v, float* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  v = GroupSum(v, 32);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float w = 0.f;
  if (warp == 0) {
    w = lane < nwarps ? scratch[lane] : 0.f;
    w = GroupSum(w, 32);
  }
  return w;
}

// ---------------------------------------------------------------------------------------------
// sm_90 cluster, mbarrier and bulk-copy primitives.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void ClusterArrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Shared-memory address of the same variable in block `rank` of this cluster.
__device__ __forceinline__ uint32_t MapRank(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(SmemAddr(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ float2 LoadRemoteF2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float LoadRemoteF(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.b32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  }
}
// Global -> this block's shared memory, `bytes` a multiple of 16, both addresses 16-byte aligned;
// completion is counted on `bar` (transaction bytes).
__device__ __forceinline__ void BulkLoad(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SmemAddr(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// Global -> L2 only (no completion to wait for), `bytes` a multiple of 16, 16-byte aligned.
__device__ __forceinline__ void BulkPrefetchL2(const void* gmem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(gmem_src), "r"(bytes) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Blocks of one grid meeting through global memory (softmax rows split without a cluster).
// Nanoseconds since an arbitrary origin (the GPU's global timer).
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// One aligned 64-bit word, single-copy atomic, seen by every block of the GPU (no ordering of other
// accesses: the word is all that is exchanged).
__device__ __forceinline__ uint64_t LoadRelaxedGpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelaxedGpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---------------------------------------------------------------------------------------------
// A row whose start is not 16-byte aligned, read as a scalar head up to its first 16-byte
// boundary, whole 16-byte vectors, and a scalar tail: every row of any length gets vector access
// (the in and out rows of softmax share their offset modulo 16, so one split serves both).
// head + tail <= 2 (W - 1) elements.
struct RowEdges {
  int head;     // elements before the first 16-byte boundary (<= W - 1, <= cols)
  int nvec;     // whole 16-byte vectors after them
  int tail;     // elements after the vectors (<= W - 1)
  __host__ __device__ int edges() const { return head + tail; }
};
template <typename T>
__host__ __device__ __forceinline__ RowEdges EdgesOf(const T* row, int64_t cols) {
  constexpr int W = 16 / sizeof(T);
  const int64_t h = static_cast<int64_t>(((16u - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u) / sizeof(T));
  const int64_t head = h < cols ? h : cols;
  const int64_t nvec = (cols - head) / W;
  return {static_cast<int>(head), static_cast<int>(nvec), static_cast<int>(cols - head - nvec * W)};
}
// Position in the row of its edge element e (0 <= e < head + tail).
template <typename T>
__host__ __device__ __forceinline__ int64_t EdgeIndex(const RowEdges& g, int e) {
  constexpr int W = 16 / sizeof(T);
  return e < g.head ? e : g.head + static_cast<int64_t>(g.nvec) * W + (e - g.head);
}

// ---------------------------------------------------------------------------------------------
// Tiles of whole short rows (softmax and row sum, rows of <= kTileMaxCols columns). Rows that short
// are one contiguous array: a block takes `tile_rows` consecutive rows (n elements) as one flat
// span, reads it into shared memory with full 16-byte vectors whatever the row length or the
// span's offset (a scalar head and tail of < W elements each, at the span's two ends only, not per
// row), works on its rows there, and (softmax) writes the span back the same way. Every global
// access of the body is a coalesced 16-byte vector, so rows of 1, 7 or 62 columns cost what a copy
// costs; shared memory holds the span at its global offset modulo 16 (element i at sm[lead + i]).
constexpr int kTileMaxCols = 64;
constexpr int kTileThreads = 256;
// Vectors in flight per thread: a tile of <= 8 KiB (TileShapeOf) plus its offset spans at most
// 513 vectors, so three rounds of 256 threads (768 vectors, 12 KiB) cover every tile.
constexpr int kTileUnroll = 3;
constexpr int kTileMaxVectors = kTileThreads * kTileUnroll;
// A row's elements per lane (E: 4, 8 or 16; TileElemsFor picks it): fewer lanes per row mean
// fewer shuffle levels per row, and the slot loops stop at the row's end, so a lane's slots
// past it cost nothing.
constexpr int kTileElems = 4;
struct TileSpan {
  int lead;        // elements of the span's first 16-byte segment before its first element
  int jlo, jhi;    // whole vectors [jlo, jhi) of the segments from the span's first one
  int head_end;    // scalar head: elements [0, head_end)
  int tail_start;  // scalar tail: elements [tail_start, n)
};
template <typename T>
__device__ __forceinline__ TileSpan TileSpanOf(const T* g, int n) {
  constexpr int W = 16 / sizeof(T);
  const int lead = static_cast<int>((reinterpret_cast<uintptr_t>(g) & 15u) / sizeof(T));
  const int jlo = lead > 0 ? 1 : 0;
  const int jhi = (lead + n) / W;
  const int head_end = min(n, jlo * W - lead);
  return {lead, jlo, jhi, head_end, max(head_end, jhi * W - lead)};
}
// Shared-memory bytes of a span of n elements (whole segments, any offset).
template <typename T>
constexpr int TileSmemBytes(int n) {
  return ((n + 2 * (16 / static_cast<int>(sizeof(T))) - 2) / (16 / static_cast<int>(sizeof(T)))) * 16;
}
// Global span g[0, n) -> sm[lead, lead + n): kTileUnroll vector loads per thread issued before
// any shared store (lead + n <= kTileMaxVectors x W, so one round covers the span).
template <typename T>
__device__ __forceinline__ void TileLoad(bool cs, const T* g, int n, T* sm, const TileSpan& t) {
  using R = typename Pack<T, 16 / sizeof(T)>::Raw;
  const R* gv = reinterpret_cast<const R*>(g - t.lead);
  R* sv = reinterpret_cast<R*>(sm);
  R v[kTileUnroll];
#pragma unroll
  for (int u = 0; u < kTileUnroll; ++u) {
    const int j = t.jlo + static_cast<int>(threadIdx.x) + u * kTileThreads;
    if (j < t.jhi) v[u] = LoadHint(cs, gv + j);
  }
  const int ne = t.head_end + (n - t.tail_start);
  for (int e = threadIdx.x; e < ne; e += kTileThreads) {
    const int i = e < t.head_end ? e : t.tail_start + (e - t.head_end);
    sm[t.lead + i] = LoadHint(cs, g + i);
  }
#pragma unroll
  for (int u = 0; u < kTileUnroll; ++u) {
    const int j = t.jlo + static_cast<int>(threadIdx.x) + u * kTileThreads;
    if (j < t.jhi) sv[j] = v[u];
  }
}
// sm[lead, lead + n) -> global o[0, n): vectors where o shares the input span's offset modulo 16
// (as pool memory always does), else one coalesced scalar per element.
template <typename T>
__device__ __forceinline__ void TileStore(bool cs, T* o, int n, const T* sm, const TileSpan& t) {
  using R = typename Pack<T, 16 / sizeof(T)>::Raw;
  const int olead = static_cast<int>((reinterpret_cast<uintptr_t>(o) & 15u) / sizeof(T));
  if (olead != t.lead) {
    for (int i = threadIdx.x; i < n; i += kTileThreads) StoreHint(cs, o + i, sm[t.lead + i]);
    return;
  }
  R* ov = reinterpret_cast<R*>(o - t.lead);
  const R* sv = reinterpret_cast<const R*>(sm);
#pragma unroll
  for (int u = 0; u < kTileUnroll; ++u) {
    const int j = t.jlo + static_cast<int>(threadIdx.x) + u * kTileThreads;
    if (j < t.jhi) StoreHint(cs, ov + j, sv[j]);
  }
  const int ne = t.head_end + (n - t.tail_start);
  for (int e = threadIdx.x; e < ne; e += kTileThreads) {
    const int i = e < t.head_end ? e : t.tail_start + (e - t.head_end);
    StoreHint(cs, o + i, sm[t.lead + i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Host-side helpers shared by the launchers.
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// Rows of T at p and q can take the head / vectors / tail split (RowEdges): element-aligned
// pointers with the same offset modulo 16 bytes.
template <typename T>
inline bool EdgesOk(const void* p, const void* q) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return a % sizeof(T) == 0 && b % sizeof(T) == 0 && (a & 15u) == (b & 15u);
}
inline int Pow2Ceil(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// The tile kernels' shape for rows of `cols` (<= kTileMaxCols) elements of `elem` bytes: lanes per
// row (a power of two, each lane `elems` elements at stride tpr) and rows per tile. A tile holds
// at most ~8 KiB (with ~6-8 blocks per SM, 16 KiB tiles would make fp32 1259977x7 2.3 waves of
// long blocks, the last one a third full; 8 KiB halves that loss and still keeps ~40 KiB per SM in
// flight), at least one pass of the block (kTileThreads / tpr rows, <= 4 KiB), and is cut down
// until there are kTileFillBlocks blocks where the tensor is small (more, lighter blocks).
// The span (<= 12 KiB - 16 bytes + 15 bytes of offset) fits TileLoad's kTileMaxVectors.
// Elements per lane for a tile op: measured on the H200 (lab/notes/kernels.md, short rows past
// 64 MiB): softmax 8 (bf16 x33 1.40x faster than 4, 16 slower again: its exps and registers),
// row sum 16 (fp32 x33 1.55x, bf16 x27 1.27x); rows of <= 4 keep 4, and so do rows whose stride
// is a whole number of 8-byte words: fewer lanes per row put more rows in a warp, and rows at
// such strides meet on the same shared-memory banks (row sum bf16 x32 with 16 per lane: 0.44x of
// Triton, 49% of copy).
inline int TileElemsFor(bool softmax, int64_t cols, int elem) {
  if (cols <= 4 || (cols * elem) % 8 == 0) return 4;
  return softmax ? 8 : 16;
}
constexpr int kTileTargetBytes = 8 * 1024;
constexpr int kTileFillBlocks = 264;
struct TileShape {
  int tpr = 1;
  int rows = 1;
};
inline TileShape TileShapeOf(int64_t rows, int64_t cols, int elem, int elems = kTileElems) {
  TileShape t;
  // One lane per row only for rows of <= 4: one thread's row at a stride of `cols` elements in
  // shared memory conflicts on banks (row sum bf16 x16 with 16 per lane: 1.5x slower than 8).
  t.tpr = std::max(Pow2Ceil(CeilDiv(cols, elems)), cols > 4 ? 2 : 1);
  const int pass = kTileThreads / t.tpr;
  // A pass of 8 or 16 per lane can pass 8 KiB (fp32 x64 with 16: 16 KiB): then as many rows as
  // TileLoad covers at any offset, some lanes idle.
  const int64_t fits = (kTileMaxVectors * 16 - 16) / (cols * elem);
  int64_t most = (kTileTargetBytes / (cols * elem)) / pass * pass;
  if (most < pass) most = std::min<int64_t>(pass, fits);
  const int64_t want = CeilDiv(CeilDiv(rows, kTileFillBlocks), pass) * pass;
  t.rows = static_cast<int>(std::min(most, want));
  return t;
}
// A launch (or occupancy query) of `blocks` blocks of `threads` with `smem` bytes of dynamic shared
// memory, in clusters of `csize` blocks along x; `attr` (one element, the caller's) holds the
// cluster attribute, which is left off for csize 1 unless `always_cluster` (occupancy queries).
inline cudaLaunchConfig_t ClusterLaunchConfig(unsigned blocks, int threads, int smem, int csize, cudaStream_t s,
                                              cudaLaunchAttribute* attr, bool always_cluster = false) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = csize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = csize > 1 || always_cluster ? 1 : 0;
  return cfg;
}

}  // namespace fusebox::cuda
