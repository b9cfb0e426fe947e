// Our own matmul+ReLU kernels (see matmul.h): out = relu(A B + bias), row-major.
//
// float16 / bfloat16, large aligned problems (K % 8 == 0, N % 8 == 0, A and B
//   16-byte aligned, at least one 128x256 output tile per SM): wgmma + TMA,
//   warp-specialised: 128x256 tiles, one producer warp issuing TMA copies
//   into a 4-stage shared-memory ring, two consumer warpgroups (details at the
//   kernel below). Cost: 2MNK flops; bytes ~ (M K (N/256) + K N (M/128)) from
//   L2, MK+KN+MN from HBM with the same grouped raster as below.
//
// float16 / bfloat16, everything else: tensor cores through mma.sync.m16n8k16
//   (fp32 accumulate).
//   A block computes a BM x BN tile of the output, walking K in steps of 32.
//   Tiles of A (BM x 32) and B (32 x BN) stream into shared memory with
//   cp.async, 4 stages deep, so three tiles are in flight while one is used.
//   Shared memory is XOR-swizzled in 16-byte chunks so that ldmatrix (A) and
//   ldmatrix.trans (B, which is K x N row-major, i.e. the "col" operand read
//   transposed) are free of bank conflicts. Each warp owns a 64x64 (or 32x64)
//   sub-tile: 4x8 (2x8) mma per 16-wide k step, 128 (64) fp32 accumulators
//   per thread. Blocks are rasterised in groups of 8 tile-rows so that
//   neighbouring blocks share A and B tiles in L2. Epilogue in registers:
//   + bias, ReLU that keeps NaN, round to the dtype, store.
//   Two tile shapes: 128x256 (8 warps, 96 KiB shared) for large outputs,
//   64x128 (4 warps, 48 KiB) when the large one would leave SMs idle.
//   Boundaries: when K % 8 == 0, N % 8 == 0 and A, B are 16-byte aligned,
//   every 16-byte chunk is either fully inside or fully outside the matrix and
//   cp.async zero-fills the outside ones; otherwise a slower path gathers
//   elements one by one with bounds checks (any M, N, K, any alignment).
//   Cost: 2MNK flops; bytes ~ (M K (N/BN) + K N (M/BM)) from L2, MK+KN+MN from
//   HBM once the grouped raster keeps tiles in L2.
//
// float32: an exact CUDA-core kernel (FFMA, no TF32 even when allowed): 128x128
//   tiles, k step 8, 256 threads each holding 8x8 outputs, double-buffered
//   shared memory with the next tile prefetched into registers. Roughly a
//   fifth of the tensor-core rate; documented as the fp32 fallback.
#include <cuda.h>  // CUtensorMap and its enums (types only: nothing links libcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tuning.h"

namespace fusebox::cuda {
namespace {

constexpr int kBK = 32;
constexpr int kStages = 4;
constexpr int kGroupM = 8;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; copies zeros when !valid (src-size 0 reads nothing).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

__device__ __forceinline__ uint16_t Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint16_t Bits(__half v) { return __half_as_ushort(v); }

// ReLU that keeps NaN (NaN < 0 is false).
__device__ __forceinline__ float Relu(float v) { return v < 0.f ? 0.f : v; }

// Grouped raster: consecutive blocks walk kGroupM tile-rows down a tile-column.
__device__ __forceinline__ void TileOf(int pid, int tiles_m, int tiles_n, int* pm, int* pn) {
  const int per_group = kGroupM * tiles_n;
  const int group = pid / per_group;
  const int first_m = group * kGroupM;
  const int gsize = min(tiles_m - first_m, kGroupM);
  const int in_group = pid - group * per_group;
  *pm = first_m + in_group % gsize;
  *pn = in_group / gsize;
}

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N>
struct MmaConfig {
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = BM / WARPS_M, kWarpN = BN / WARPS_N;
  static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;
  static constexpr int kAStage = BM * kBK, kBStage = kBK * BN;  // elements
  static constexpr size_t kSmemBytes = size_t{kStages} * (kAStage + kBStage) * sizeof(T);
  static_assert(kNI % 2 == 0 && kMI >= 1, "warp tile");
  static_assert((BM * 4) % kThreads == 0 && (kBK * BN / 8) % kThreads == 0, "load split");
};

// Gathers 8 consecutive elements (row-major, row `r` of `rows`, from column
// `c` of `cols`) with bounds checks into one 16-byte shared-memory chunk.
template <typename T>
__device__ __forceinline__ void GatherChunk(T* dst, const T* src, int r, int rows, int c, int cols,
                                            int64_t ld) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint16_t v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = (r < rows && c + j < cols) ? s[static_cast<int64_t>(r) * ld + c + j] : uint16_t{0};
  }
  uint4 packed;
  packed.x = v[0] | (uint32_t{v[1]} << 16);
  packed.y = v[2] | (uint32_t{v[3]} << 16);
  packed.z = v[4] | (uint32_t{v[5]} << 16);
  packed.w = v[6] | (uint32_t{v[7]} << 16);
  *reinterpret_cast<uint4*>(dst) = packed;
}

template <typename T, int BM, int BN, int WARPS_M, int WARPS_N, bool kVec>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32)
    MmaMatmulRelu(const T* __restrict__ A, const T* __restrict__ B, const T* __restrict__ bias,
                  T* __restrict__ C, int M, int N, int K) {
  using Cfg = MmaConfig<T, BM, BN, WARPS_M, WARPS_N>;
  constexpr int NT = Cfg::kThreads, MI = Cfg::kMI, NI = Cfg::kNI;
  constexpr int kChunksPerBRow = BN / 8;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);
  T* sB = sA + kStages * Cfg::kAStage;

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int pid_m, pid_n;
  TileOf(blockIdx.x, tiles_m, tiles_n, &pid_m, &pid_n);
  const int bm = pid_m * BM, bn = pid_n * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  auto load_tile = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    T* dA = sA + stage * Cfg::kAStage;
    T* dB = sB + stage * Cfg::kBStage;
#pragma unroll
    for (int i = 0; i < BM * 4 / NT; ++i) {
      const int c = tid + i * NT, r = c >> 2, kc = c & 3;
      const int gr = bm + r, gk = k0 + kc * 8;
      T* dst = dA + r * kBK + ((kc ^ ((r >> 1) & 3)) << 3);
      if constexpr (kVec) {
        const bool ok = gr < M && gk < K;
        CpAsync16(SmemAddr(dst), ok ? A + static_cast<int64_t>(gr) * K + gk : A, ok);
      } else {
        GatherChunk(dst, A, gr, M, gk, K, K);
      }
    }
#pragma unroll
    for (int i = 0; i < kBK * kChunksPerBRow / NT; ++i) {
      const int c = tid + i * NT, r = c / kChunksPerBRow, nc = c % kChunksPerBRow;
      const int gk = k0 + r, gn = bn + nc * 8;
      T* dst = dB + r * BN + ((nc ^ (r & 7)) << 3);
      if constexpr (kVec) {
        const bool ok = gk < K && gn < N;
        CpAsync16(SmemAddr(dst), ok ? B + static_cast<int64_t>(gk) * N + gn : B, ok);
      } else {
        GatherChunk(dst, B, gk, K, gn, N, N);
      }
    }
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  const int k_tiles = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s, s);
    CpAsyncCommit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile kt visible; stage (kt-1) % kStages free for reuse
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_tile(next % kStages, next);
    CpAsyncCommit();

    const int stage = kt % kStages;
    const T* tA = sA + stage * Cfg::kAStage;
    const T* tB = sB + stage * Cfg::kBStage;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[MI][4];
      uint32_t bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int r = wm * Cfg::kWarpM + mi * 16 + (lane & 15);
        const int kc = ks * 2 + (lane >> 4);
        LdMatrixX4(af[mi], SmemAddr(tA + r * kBK + ((kc ^ ((r >> 1) & 3)) << 3)));
      }
#pragma unroll
      for (int nj = 0; nj < NI / 2; ++nj) {
        const int k = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int nc = (wn * Cfg::kWarpN + nj * 16 + (lane >> 4) * 8) >> 3;
        uint32_t r4[4];
        LdMatrixX4Trans(r4, SmemAddr(tB + k * BN + ((nc ^ (k & 7)) << 3)));
        bf[2 * nj][0] = r4[0];
        bf[2 * nj][1] = r4[1];
        bf[2 * nj + 1][0] = r4[2];
        bf[2 * nj + 1][1] = r4[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) Mma<T>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  }
  CpAsyncWait<0>();  // nothing may be left in flight when the block exits

  // Epilogue: thread holds (row lane/4 [+8], cols 2*(lane%4) + {0,1}) of each 16x8 tile.
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = bn + wn * Cfg::kWarpN + ni * 8 + 2 * (lane & 3);
    float b0 = 0.f, b1 = 0.f;
    if (bias != nullptr) {
      if (col < N) b0 = ToFloat(bias[col]);
      if (col + 1 < N) b1 = ToFloat(bias[col + 1]);
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = bm + wm * Cfg::kWarpM + mi * 16 + (lane >> 2) + 8 * h;
        if (row >= M) continue;
        const T v0 = FromFloat<T>(Relu(acc[mi][ni][2 * h] + b0));
        const T v1 = FromFloat<T>(Relu(acc[mi][ni][2 * h + 1] + b1));
        T* dst = C + static_cast<int64_t>(row) * N + col;
        if constexpr (kVec) {  // N % 8 == 0: col < N implies col + 1 < N
          if (col < N) {
            const uint32_t packed = uint32_t{Bits(v0)} | (uint32_t{Bits(v1)} << 16);
            *reinterpret_cast<uint32_t*>(dst) = packed;
          }
        } else {
          if (col < N) dst[0] = v0;
          if (col + 1 < N) dst[1] = v1;
        }
      }
    }
  }
}

// ---- float16 / bfloat16 on sm_90a: wgmma + TMA, warp-specialised ----
// A block computes 128x256 of the output with 9 warps: warps 0-3 and 4-7 are
// two consumer warpgroups (rows 0-63 and 64-127 of the tile, 128 fp32
// accumulators per thread, wgmma m64n256k16 from shared memory), warp 8 is the
// producer: one thread issues TMA copies of the next A (128x64) and B (64x256,
// four 64x64 boxes) tiles into a 4-stage ring of 48 KiB stages, 128-byte
// swizzled, completing on a "full" mbarrier per stage; consumers release a
// stage through its "empty" mbarrier once their wgmma on it has finished.
// TMA zero-fills outside the matrices, so any M, N, K with K % 8 == 0 and
// N % 8 == 0 (16-byte row strides) and 16-byte aligned A and B work.
// A is K-major (row-major M x K); B is row-major K x N, i.e. MN-major, which
// wgmma reads transposed (trans-b) straight from the TMA's swizzled layout.
constexpr int kWgBM = 128, kWgBN = 256, kWgBK = 64, kWgStages = 4;
constexpr int kWgThreads = 288;
constexpr uint32_t kWgABytes = kWgBM * kWgBK * 2;   // 16 KiB
constexpr uint32_t kWgBBytes = kWgBK * kWgBN * 2;   // 32 KiB: four [64 k][64 n] boxes
constexpr uint32_t kWgStageBytes = kWgABytes + kWgBBytes;
constexpr size_t kWgSmemBytes = size_t{kWgStages} * kWgStageBytes + 1024 + 256;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Returns once the phase with this parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle: start, leading and
// stride byte offsets in 16-byte units.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Pins the accumulators in their registers across the async wgmma, so the
// compiler moves none of them while the tensor cores own them.
__device__ __forceinline__ void FenceOperands(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64x256, fp32) += A(64x16, smem, K-major) * B(16x256, smem, MN-major):
// scale-d 1, scale-a 1, scale-b 1, trans-a 0, trans-b 1.
template <typename T>
__device__ __forceinline__ void Wgmma64x256(float (&d)[128], uint64_t desc_a, uint64_t desc_b);
// One wgmma m64n256k16 with fp32 accumulators; AB is "bf16" or "f16". The
// 128 accumulator operands are spelled out: inline asm takes no arrays.
#define FUSEBOX_WGMMA_64X256(AB)                                                     \
  asm volatile(                                                                      \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." AB "." AB " {"                  \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
      "}, %128, %129, 1, 1, 1, 0, 1;\n"                                            \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "l"(desc_a), "l"(desc_b))
template <>
__device__ __forceinline__ void Wgmma64x256<__nv_bfloat16>(float (&d)[128], uint64_t desc_a,
                                                  uint64_t desc_b) {
  FUSEBOX_WGMMA_64X256("bf16");
}
template <>
__device__ __forceinline__ void Wgmma64x256<__half>(float (&d)[128], uint64_t desc_a,
                                                  uint64_t desc_b) {
  FUSEBOX_WGMMA_64X256("f16");
}
#undef FUSEBOX_WGMMA_64X256
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename T>
__global__ void __launch_bounds__(kWgThreads, 1)
    WgmmaMatmulRelu(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b, const T* __restrict__ bias,
                    T* __restrict__ C, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Swizzled TMA tiles need 1024-byte aligned stages.
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t bars = base + kWgStages * kWgStageBytes;  // full[s] at +8s, empty[s] at +8(S+s)
  auto full = [bars](int s) { return bars + 8 * s; };
  auto empty = [bars](int s) { return bars + 8 * (kWgStages + s); };

  const int tiles_m = (M + kWgBM - 1) / kWgBM, tiles_n = (N + kWgBN - 1) / kWgBN;
  int pid_m, pid_n;
  TileOf(blockIdx.x, tiles_m, tiles_n, &pid_m, &pid_n);
  const int bm = pid_m * kWgBM, bn = pid_n * kWgBN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k_tiles = (K + kWgBK - 1) / kWgBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kWgStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), 256);  // every consumer thread arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == 8) {  // producer
    if (lane == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kWgStages;
        const int use = kt / kWgStages;
        if (use > 0) MbarWait(empty(s), (use - 1) & 1);
        const uint32_t st = base + s * kWgStageBytes;
        MbarExpectTx(full(s), kWgStageBytes);
        TmaLoad2d(st, &map_a, kt * kWgBK, bm, full(s));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          TmaLoad2d(st + kWgABytes + j * 8192, &map_b, bn + 64 * j, kt * kWgBK, full(s));
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg owns tile rows [64 wg, 64 wg + 64).
  const int wg = warp >> 2;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kWgStages;
    MbarWait(full(s), (kt / kWgStages) & 1);
    const uint32_t a_tile = base + s * kWgStageBytes + wg * 64 * 128;
    const uint32_t b_tile = base + s * kWgStageBytes + kWgABytes;
    FenceOperands(acc);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kWgBK / 16; ++ks) {
      // A: K-major, 8-row groups 1024 B apart, k16 step = 32 B inside the swizzle atom.
      // B: MN-major, 64-column boxes 8 KiB apart (LBO), 8-k-row groups 1024 B (SBO),
      //    k16 step = 16 rows of 128 B.
      Wgmma64x256<T>(acc, SmemDesc(a_tile + ks * 32, 16, 1024),
                     SmemDesc(b_tile + ks * 2048, 8192, 1024));
    }
    WgmmaCommit();
    WgmmaWaitAll();
    FenceOperands(acc);
    MbarArrive(empty(s));
  }

  // Epilogue: accumulator i of thread (warp w, lane l) is row 16 w + l/4
  // (+8 for i % 4 >= 2) and column 8 (i / 4) + 2 (l % 4) + (i % 2).
  const int row0 = bm + wg * 64 + (warp & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = bn + 8 * j + 2 * (lane & 3);
    if (col >= N) continue;  // N % 8 == 0: col < N implies col + 1 < N
    float b0 = 0.f, b1 = 0.f;
    if (bias != nullptr) {
      b0 = ToFloat(bias[col]);
      b1 = ToFloat(bias[col + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= M) continue;
      const T v0 = FromFloat<T>(Relu(acc[4 * j + 2 * h] + b0));
      const T v1 = FromFloat<T>(Relu(acc[4 * j + 2 * h + 1] + b1));
      *reinterpret_cast<uint32_t*>(C + static_cast<int64_t>(row) * N + col) =
          uint32_t{Bits(v0)} | (uint32_t{Bits(v1)} << 16);
    }
  }
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel
#endif
}

// ---- float32: exact CUDA-core kernel ----
constexpr int kSimtTile = 128, kSimtK = 8, kSimtPad = 4;

__global__ void __launch_bounds__(256)
    SimtMatmulRelu(const float* __restrict__ A, const float* __restrict__ B,
                   const float* __restrict__ bias, float* __restrict__ C, int M, int N, int K) {
  __shared__ __align__(16) float As[2][kSimtK][kSimtTile + kSimtPad];  // A tile transposed: [k][m]
  __shared__ __align__(16) float Bs[2][kSimtK][kSimtTile + kSimtPad];  // [k][n]
  const int tiles_m = (M + kSimtTile - 1) / kSimtTile, tiles_n = (N + kSimtTile - 1) / kSimtTile;
  int pid_m, pid_n;
  TileOf(blockIdx.x, tiles_m, tiles_n, &pid_m, &pid_n);
  const int bm = pid_m * kSimtTile, bn = pid_n * kSimtTile;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  // Loader roles: A row tid/2, k 4*(tid%2)..+3; B k-row tid/32, cols 4*(tid%32)..+3.
  const int ar = tid >> 1, ak = (tid & 1) * 4, bk = tid >> 5, bc = (tid & 31) * 4;
  float ra[4], rb[4];
  auto gload = [&](int k0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gr = bm + ar, gk = k0 + ak + j;
      ra[j] = (gr < M && gk < K) ? A[static_cast<int64_t>(gr) * K + gk] : 0.f;
      const int gkb = k0 + bk, gn = bn + bc + j;
      rb[j] = (gkb < K && gn < N) ? B[static_cast<int64_t>(gkb) * N + gn] : 0.f;
    }
  };
  auto sstore = [&](int buf) {
#pragma unroll
    for (int j = 0; j < 4; ++j) As[buf][ak + j][ar] = ra[j];
    *reinterpret_cast<float4*>(&Bs[buf][bk][bc]) = make_float4(rb[0], rb[1], rb[2], rb[3]);
  };

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  const int k_tiles = (K + kSimtK - 1) / kSimtK;
  gload(0);
  sstore(0);
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int buf = kt & 1;
    const bool more = kt + 1 < k_tiles;
    if (more) gload((kt + 1) * kSimtK);
#pragma unroll
    for (int k = 0; k < kSimtK; ++k) {
      float a[8], b[8];
      const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][k][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][k][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][k][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][k][64 + tx * 4]);
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
      a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
      b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
      b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) sstore(buf ^ 1);
    __syncthreads();
  }

#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = bn + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
    if (col >= N) continue;
    const float bv = bias != nullptr ? bias[col] : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
      if (row < M) C[static_cast<int64_t>(row) * N + col] = Relu(acc[i][j] + bv);
    }
  }
}

template <typename T, int BM, int BN, int WM, int WN, bool kVec>
cudaError_t LaunchMma(const MatmulArgs& a, cudaStream_t stream) {
  using Cfg = MmaConfig<T, BM, BN, WM, WN>;
  auto kernel = MmaMatmulRelu<T, BM, BN, WM, WN, kVec>;
  const int64_t blocks = ((a.m + BM - 1) / BM) * ((a.n + BN - 1) / BN);
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(Cfg::kSmemBytes));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<int>(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<const T*>(a.bias),
      static_cast<T*>(a.out), static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k));
  return cudaGetLastError();
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, found once through the runtime (so
// nothing links libcuda); null when the driver lacks it.
EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// A 2-D row-major matrix (rows x cols of 16-bit elements) as TMA boxes of
// box_rows x 64 columns (128 bytes, the 128-byte swizzle's width).
bool MakeTensorMap(CUtensorMap* map, CUtensorMapDataType type, const void* ptr, int64_t rows,
                   int64_t cols, uint32_t box_rows) {
  EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
         CUDA_SUCCESS;
}

// Launches the wgmma kernel; false (nothing launched) when its tensor maps
// cannot be made, so the caller falls back to mma.sync.
template <typename T>
bool LaunchWgmma(const MatmulArgs& a, cudaStream_t stream, cudaError_t* err) {
  const CUtensorMapDataType type = std::is_same<T, __nv_bfloat16>::value
                                       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map_a, map_b;
  if (!MakeTensorMap(&map_a, type, a.a, a.m, a.k, kWgBM) ||
      !MakeTensorMap(&map_b, type, a.b, a.k, a.n, kWgBK)) {
    return false;
  }
  const int64_t blocks = ((a.m + kWgBM - 1) / kWgBM) * ((a.n + kWgBN - 1) / kWgBN);
  if (blocks > INT_MAX) {
    *err = cudaErrorInvalidConfiguration;
    return true;
  }
  auto kernel = WgmmaMatmulRelu<T>;
  *err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(kWgSmemBytes));
  if (*err != cudaSuccess) return true;
  kernel<<<static_cast<int>(blocks), kWgThreads, kWgSmemBytes, stream>>>(
      map_a, map_b, static_cast<const T*>(a.bias), static_cast<T*>(a.out), static_cast<int>(a.m),
      static_cast<int>(a.n), static_cast<int>(a.k));
  *err = cudaGetLastError();
  return true;
}

template <typename T>
cudaError_t LaunchHalf(const MatmulArgs& a, cudaStream_t stream, TiledKernel which) {
  auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  const bool vec = a.k % 8 == 0 && a.n % 8 == 0 && aligned(a.a, 16) && aligned(a.b, 16) &&
                   aligned(a.out, 4);
  // The large tiles when they still give every SM (132 on an H200) a block.
  const bool big = ((a.m + 127) / 128) * ((a.n + 255) / 256) >= 132;
  if (big && vec && which == TiledKernel::kAuto) {
    cudaError_t err = cudaSuccess;
    if (LaunchWgmma<T>(a, stream, &err)) return err;
  }
  if (big) {
    return vec ? LaunchMma<T, 128, 256, 2, 4, true>(a, stream)
               : LaunchMma<T, 128, 256, 2, 4, false>(a, stream);
  }
  return vec ? LaunchMma<T, 64, 128, 2, 2, true>(a, stream)
             : LaunchMma<T, 64, 128, 2, 2, false>(a, stream);
}

}  // namespace

cudaError_t LaunchMatmulReluTiledWith(TiledKernel which, const MatmulArgs& a,
                                      cudaStream_t stream) {
  if (!ValidateMatmul(a).ok()) return cudaErrorInvalidValue;
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  switch (a.dtype) {
    case DType::kFloat16: return LaunchHalf<__half>(a, stream, which);
    case DType::kBFloat16: return LaunchHalf<__nv_bfloat16>(a, stream, which);
    default: {
      const int64_t blocks =
          ((a.m + kSimtTile - 1) / kSimtTile) * ((a.n + kSimtTile - 1) / kSimtTile);
      if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
      SimtMatmulRelu<<<static_cast<int>(blocks), 256, 0, stream>>>(
          static_cast<const float*>(a.a), static_cast<const float*>(a.b),
          static_cast<const float*>(a.bias), static_cast<float*>(a.out), static_cast<int>(a.m),
          static_cast<int>(a.n), static_cast<int>(a.k));
      return cudaGetLastError();
    }
  }
}

cudaError_t LaunchMatmulReluTiled(const MatmulArgs& a, cudaStream_t stream) {
  return LaunchMatmulReluTiledWith(TiledKernel::kAuto, a, stream);
}

}  // namespace fusebox::cuda
