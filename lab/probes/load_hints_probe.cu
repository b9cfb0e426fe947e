// Row-sum probe (NOTES.md run 32): kernels in our row sum's shapes, built once per variant, timed
// interleaved in one process; it resolves ~0.1% where the peers' harness resolves ~0.6%.
//   --set hints    the 16-byte load's flavour (cache operator, L1 / L2 eviction priority, L2
//                  prefetch size), the `.cs` kernel with three preferred shared-memory carveouts,
//                  and torch.compile's 8-byte shape, on four row-sum shapes
//   --set flight   bytes and rows in flight per SM (block shape, persistent grids), bf16 8192^2
//   --set library  our launchers (kernels/cuda/launch.h): auto, the loop kernel, the one-batch
//                  kernel's shapes, beside the probe's own kernels
//   --set softmax  our softmax launcher on its short-row and one-block shapes: auto, the exact
//                  kernels (rows of exactly their shape, one exp per element) against the
//                  bounds-checked ones (NOTES.md run 33); checked against fp64 softmax. With
//                  --triton DIR also Triton's one-row softmax program at 8192 columns, loaded from
//                  DIR/softmax_{fp32,bf16}.cubin (bench/gpu/triton_softmax_cubin.py writes them)
//   --range R      fp32 cases only, inputs uniform in [-R, R) (the peers' harness: 4); default: the
//                  bf16 fill read as fp32 (|x| < 2)
//   --spin-us N    the spin before each call (default 100; the peers' harness: ~300)
// Diagnostic only: nothing the server runs. One executable (cudart and our kernels linked in), so
// it can be carried to the H200 alone: target load_hints_probe (build-dev/bench/gpu/).
//
// Method (as memory_bound_peers.py): per round and flavour a ~100 us GPU spin (the host queues the
// rest meanwhile), a 256 MiB plain read (L2 flush), then events around the kernel; flavours in a
// rotating order; medians. Every flavour's sums are checked against an fp64 CPU sum first (output
// poisoned with NaN), and an empty kernel gives the fixed cost of an event-timed launch.
// Cost: reads the input once per call; the flush reads 256 MiB per call.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/gpu/check_cuda.h"
#include "bench/gpu/triton_softmax_program.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"

namespace {

enum Flavor { kCs, kCs256, kNcNa, kNcNa256, kPlain, kPlain256, kEfPolicy, kEfPolicy256, kLu };

#define LD4(INSN) asm(INSN " {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p))
#define LD4P(INSN) \
  asm(INSN " {%0,%1,%2,%3}, [%4], %5;" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol))

template <int F>
__device__ __forceinline__ uint4 Ld(const uint4* p) {
  uint4 r;
  if constexpr (F == kCs) LD4("ld.global.cs.v4.u32");
  if constexpr (F == kCs256) LD4("ld.global.cs.L2::256B.v4.u32");
  if constexpr (F == kNcNa) LD4("ld.global.nc.L1::no_allocate.v4.u32");
  if constexpr (F == kNcNa256) LD4("ld.global.nc.L1::no_allocate.L2::256B.v4.u32");
  if constexpr (F == kPlain) LD4("ld.global.v4.u32");
  if constexpr (F == kPlain256) LD4("ld.global.L2::256B.v4.u32");
  if constexpr (F == kEfPolicy || F == kEfPolicy256) {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if constexpr (F == kEfPolicy) LD4P("ld.global.L1::evict_first.L2::cache_hint.v4.u32");
    if constexpr (F == kEfPolicy256) LD4P("ld.global.L1::evict_first.L2::cache_hint.L2::256B.v4.u32");
  }
  if constexpr (F == kLu) LD4("ld.global.lu.v4.u32");
  return r;
}

template <bool Bf16>
__device__ __forceinline__ float Sum(const uint4& x) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (Bf16) {
      s += __uint_as_float(w[i] << 16) + __uint_as_float(w[i] & 0xffff0000u);
    } else {
      s += __uint_as_float(w[i]);
    }
  }
  return s;
}

__device__ __forceinline__ float WarpSum(float s, int width) {
  for (int o = width / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The block's sum of acc into *dst (thread 0), through part[T / 32].
template <int T>
__device__ __forceinline__ void BlockSumTo(float acc, float* part, float* dst) {
  acc = WarpSum(acc, 32);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < T / 32; ++w) s += part[w];
    *dst = s;
  }
}

// One block of T threads per row of nacc 16-byte accesses (nacc a multiple of U x T), U loads in
// flight per thread: rowsum.cu's RowSumChunkKernel without the cluster or the tail.
template <int F, bool Bf16, int U, int T, int Tag = 0>
__global__ __launch_bounds__(T, U <= 4 ? 2048 / T : 1) void LongRows(const uint4* in, float* out, int nacc) {
  __shared__ float part[T / 32];
  const uint4* src = in + static_cast<int64_t>(blockIdx.x) * nacc;
  float acc = 0.f;
  for (int a = threadIdx.x; a < nacc; a += U * T) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = Ld<F>(src + a + u * T);
#pragma unroll
    for (int u = 0; u < U; ++u) acc += Sum<Bf16>(x[u]);
  }
  BlockSumTo<T>(acc, part, out + blockIdx.x);
}

// Short rows of 16 accesses (bf16 x 128): 8 lanes per row, 2 loads each, 256-thread blocks
// (rowsum.cu's RowSumSmallKernel<bf16, 8, cs, 8, 4> for this shape).
template <int F, int Tag = 0>
__global__ __launch_bounds__(256) void ShortRows(const uint4* in, float* out, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 32 + (threadIdx.x >> 3);
  const int lane = threadIdx.x & 7;
  float s = 0.f;
  if (row < rows) {
    const uint4* src = in + row * 16;
    const uint4 a = Ld<F>(src + lane), b = Ld<F>(src + lane + 8);
    s = Sum<true>(a) + Sum<true>(b);
  }
  s = WarpSum(s, 8);
  if (lane == 0 && row < rows) out[row] = s;
}

// torch.compile's bf16 row sum (NOTES.md run 28): blocks of 512 threads, U 8-byte loads per
// thread with the L1 / L2 evict-first policy, one block per row of nacc8 8-byte accesses.
template <int U>
__global__ __launch_bounds__(512) void LongRows8(const uint2* in, float* out, int nacc8) {
  __shared__ float part[16];
  const uint2* src = in + static_cast<int64_t>(blockIdx.x) * nacc8;
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  float acc = 0.f;
  for (int a = threadIdx.x; a < nacc8; a += U * 512) {
    uint2 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      asm("ld.global.L1::evict_first.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
          : "=r"(x[u].x), "=r"(x[u].y)
          : "l"(src + a + u * 512), "l"(pol));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      acc += __uint_as_float(x[u].x << 16) + __uint_as_float(x[u].x & 0xffff0000u) +
             __uint_as_float(x[u].y << 16) + __uint_as_float(x[u].y & 0xffff0000u);
    }
  }
  BlockSumTo<512>(acc, part, out + blockIdx.x);
}

// --set flight: bf16 rows of nacc V accesses (uint4: 16 bytes, uint2: 8 bytes), T threads, U
// loads in flight per thread (nacc a multiple of U x T). Persistent: a grid of blocks that stride
// over the rows (the blocks per SM fixed by the grid), else one block per row.
template <int F>
__device__ __forceinline__ uint2 Ld8(const uint2* p) {
  uint2 r;
  if constexpr (F == kCs) {
    asm("ld.global.cs.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  } else {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm("ld.global.L1::evict_first.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(pol));
  }
  return r;
}
__device__ __forceinline__ float SumBf16(const uint4& x) { return Sum<true>(x); }
__device__ __forceinline__ float SumBf16(const uint2& x) {
  return __uint_as_float(x.x << 16) + __uint_as_float(x.x & 0xffff0000u) + __uint_as_float(x.y << 16) +
         __uint_as_float(x.y & 0xffff0000u);
}

template <typename V, int F, int U, int T, bool Persistent>
__global__ __launch_bounds__(T) void RowsV(const V* in, float* out, int rows, int nacc) {
  __shared__ float part[T / 32];
  for (int row = blockIdx.x; row < rows; row += Persistent ? gridDim.x : rows) {
    const V* src = in + static_cast<int64_t>(row) * nacc;
    float acc = 0.f;
    for (int a = threadIdx.x; a < nacc; a += U * T) {
      V x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (std::is_same_v<V, uint4>) {
          x[u] = Ld<F>(src + a + u * T);
        } else {
          x[u] = Ld8<F>(src + a + u * T);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc += SumBf16(x[u]);
    }
    BlockSumTo<T>(acc, part, out + row);
    if constexpr (Persistent) __syncthreads();  // part is reused by the next row
  }
}

__global__ void Empty() {}

__global__ void Spin(int64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (static_cast<int64_t>(t - t0) < ns);
}

// Plain reads of the whole buffer (L2 flush), one partial sum per block kept.
__global__ void Flush(const uint4* buf, int64_t n, float* sink) {
  float s = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    s += Sum<false>(buf[i]);
  }
  if (s == 12345.f) sink[blockIdx.x] = s;
}

// A value in [-1, 1) hashed from i and seed (the fills' generator).
__device__ float Uniform(int64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (static_cast<float>(h & 0xffffff) / 16777216.f) * 2.f - 1.f;
}

__global__ void Fill(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = __bfloat16_as_ushort(__float2bfloat16(Uniform(i, seed)));
  }
}

// fp32 values uniform in [-r, r) (--range).
__global__ void FillF32(float* p, int64_t n, uint32_t seed, float r) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = Uniform(i, seed) * r;
  }
}

struct Case {
  std::string name;
  bool bf16;
  int64_t rows, cols;
  bool softmax = false;  // else row sum
  int64_t Bytes() const { return rows * cols * (bf16 ? 2 : 4); }
  int64_t Traffic() const { return softmax ? 2 * Bytes() : Bytes(); }  // bytes read + written
  int64_t OutBytes() const { return softmax ? Bytes() : rows * 4; }
  int64_t Nacc() const { return cols * (bf16 ? 2 : 4) / 16; }
};

// Launches one impl on a case; false where the impl has no kernel for it. Carveout >= 0 sets
// the kernel's preferred shared-memory carveout (percent) first (Tag keeps such kernels apart).
using Launch = bool (*)(const uint4*, float*, const Case&);

template <int F, int Tag = 0, int Carveout = -1>
bool LaunchCase(const uint4* in, float* out, const Case& c) {
  const int nacc = static_cast<int>(c.Nacc());
  auto go = [&](auto kernel, int64_t blocks, const auto* src, int n) {
    if constexpr (Carveout >= 0) {
      CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, Carveout));
    }
    kernel<<<static_cast<unsigned>(blocks), 256>>>(src, out, n);
  };
  if (c.cols == 128 && c.bf16) {
    auto k = ShortRows<F, Tag>;
    if constexpr (Carveout >= 0) {
      CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, Carveout));
    }
    k<<<static_cast<unsigned>((c.rows + 31) / 32), 256>>>(in, out, c.rows);
  } else if (c.bf16 && nacc == 1024) {
    go(LongRows<F, true, 4, 256, Tag>, c.rows, in, nacc);
  } else if (c.bf16) {
    go(LongRows<F, true, 16, 256, Tag>, c.rows, in, nacc);
  } else {
    go(LongRows<F, false, 8, 256, Tag>, c.rows, in, nacc);
  }
  return true;
}

// torch.compile's geometry (bf16 long rows only): 512 x 4 at 8192 columns, 512 x 16 at 32768.
bool LaunchTorchCompileGeometry(const uint4* in, float* out, const Case& c) {
  const int nacc8 = static_cast<int>(2 * c.Nacc());
  const uint2* src = reinterpret_cast<const uint2*>(in);
  if (!c.bf16 || c.cols < 8192) return false;
  if (nacc8 == 4 * 512) {
    LongRows8<4><<<static_cast<unsigned>(c.rows), 512>>>(src, out, nacc8);
  } else if (nacc8 % (16 * 512) == 0) {
    LongRows8<16><<<static_cast<unsigned>(c.rows), 512>>>(src, out, nacc8);
  } else {
    return false;
  }
  return true;
}

// --set flight impls: bf16 rows of 8192 columns only. PerSm > 0: persistent, PerSm blocks per SM.
int g_sms = 132;
template <typename V, int F, int U, int T, int PerSm = 0>
bool LaunchFlight(const uint4* in, float* out, const Case& c) {
  const int nacc = static_cast<int>(c.Bytes() / c.rows / static_cast<int64_t>(sizeof(V)));
  if (!c.bf16 || c.cols != 8192 || nacc % (U * T) != 0) return false;
  const int64_t blocks = PerSm > 0 ? int64_t{PerSm} * g_sms : c.rows;
  RowsV<V, F, U, T, (PerSm > 0)><<<static_cast<unsigned>(blocks), T>>>(reinterpret_cast<const V*>(in), out,
                                                                      static_cast<int>(c.rows), nacc);
  return true;
}

struct Impl {
  const char* name;
  Launch launch;
};
const Impl kImpls[] = {
    {"cs", LaunchCase<kCs>},
    {"cs.L2::256B", LaunchCase<kCs256>},
    {"nc.L1::no_allocate", LaunchCase<kNcNa>},
    {"nc.L1::no_allocate.L2::256B", LaunchCase<kNcNa256>},
    {"plain", LaunchCase<kPlain>},
    {"L2::256B", LaunchCase<kPlain256>},
    {"ef+policy", LaunchCase<kEfPolicy>},
    {"ef+policy.L2::256B", LaunchCase<kEfPolicy256>},
    {"lu", LaunchCase<kLu>},
    {"cs, carveout 0% (max L1)", LaunchCase<kCs, 1, 0>},
    {"cs, carveout 50%", LaunchCase<kCs, 2, 50>},
    {"cs, carveout 100% (max smem)", LaunchCase<kCs, 3, 100>},
    {"torch.compile geometry (512 x 8-byte, ef+policy)", LaunchTorchCompileGeometry},
};
// Bytes in flight per SM: ours (256 x 4 x 16 B, 8 blocks) 128 KiB, torch.compile's 64 KiB.
const Impl kFlight[] = {
    {"cs (ours: 256 x 4 x 16 B, 8 blocks/SM, 128 KiB/SM in flight)", LaunchCase<kCs>},
    {"cs again (a second build of the same kernel)", LaunchCase<kCs, 4>},
    {"256 x 4 x 16 B persistent, 8 blocks/SM (128 KiB/SM)", LaunchFlight<uint4, kCs, 4, 256, 8>},
    {"256 x 4 x 16 B persistent, 6 blocks/SM (96 KiB/SM)", LaunchFlight<uint4, kCs, 4, 256, 6>},
    {"256 x 4 x 16 B persistent, 4 blocks/SM (64 KiB/SM)", LaunchFlight<uint4, kCs, 4, 256, 4>},
    {"256 x 2 x 16 B, 8 blocks/SM (64 KiB/SM, 2 batches a row)", LaunchFlight<uint4, kCs, 2, 256>},
    {"512 x 2 x 16 B, 4 blocks/SM (64 KiB/SM)", LaunchFlight<uint4, kCs, 2, 512>},
    {"128 x 8 x 16 B, 16 blocks/SM (128 KiB/SM)", LaunchFlight<uint4, kCs, 8, 128>},
    {"1024 x 1 x 16 B, 2 blocks/SM (32 KiB/SM)", LaunchFlight<uint4, kCs, 1, 1024>},
    {"256 x 8 x 8 B cs, 8 blocks/SM (128 KiB/SM)", LaunchFlight<uint2, kCs, 8, 256>},
    {"512 x 4 x 8 B cs, 4 blocks/SM (64 KiB/SM)", LaunchFlight<uint2, kCs, 4, 512>},
    {"torch.compile geometry (512 x 4 x 8 B, ef+policy)", LaunchTorchCompileGeometry},
};
// --set library: our launchers (kernels/cuda/launch.h) with forced choices, beside the probe's own
// kernels; an impl the library refuses for a case is skipped there.
template <int Threads, int Vpt, int Streaming = 0, int Pipeline = 0>
bool LaunchLibrary(const uint4* in, float* out, const Case& c) {
  fusebox::cuda::KernelChoice k;
  k.threads = Threads;
  k.vectors_per_thread = Vpt;
  k.streaming = Streaming;
  k.pipeline = Pipeline;
  const auto dt = c.bf16 ? fusebox::DType::kBFloat16 : fusebox::DType::kFloat32;
  return fusebox::cuda::LaunchRowSumWith(k, dt, in, out, c.rows, c.cols, 0) == cudaSuccess;
}
const Impl kLibrary[] = {
    {"library auto", LaunchLibrary<0, 0>},
    {"library auto again (same kernel, timed as a second impl)", LaunchLibrary<0, 0>},
    {"library loop kernels (pipeline=-1: as before run 32)", LaunchLibrary<0, 0, 0, -1>},
    {"library one-batch 512 x 2", LaunchLibrary<512, 2, 0, 1>},
    {"library one-batch 512 x 4", LaunchLibrary<512, 4, 0, 1>},
    {"library one-batch 256 x 4", LaunchLibrary<256, 4, 0, 1>},
    {"library one-batch 256 x 8", LaunchLibrary<256, 8, 0, 1>},
    {"probe cs (256 x 4 x 16 B)", LaunchCase<kCs>},
    {"probe torch.compile geometry (512 x 4 x 8 B, ef+policy)", LaunchTorchCompileGeometry},
};
// --set softmax: our softmax launcher (out holds the case's dtype). Mode 0: automatic; 1: the
// bounds-checked kernels (short rows: pipeline = -1; one-block rows: exp_once = -1, as before run
// 33); 2: the exact kernels (pipeline = 1, exp_once = 1). Threads and Vpt > 0: a forced one-block
// shape; Threads alone: the short-row block size (short rows only).
template <int Mode, int Threads = 0, int Vpt = 0>
bool LaunchSoftmaxLib(const uint4* in, float* out, const Case& c) {
  const bool short_rows = c.Nacc() <= 512;
  if (!c.softmax || (Vpt && c.Nacc() != int64_t{Threads} * Vpt) || (Threads && !Vpt && !short_rows)) return false;
  fusebox::cuda::KernelChoice k;
  if (short_rows) {
    k.pipeline = Mode == 1 ? -1 : Mode == 2 ? 1 : 0;
  } else {
    k.exp_once = Mode == 1 ? -1 : Mode == 2 ? 1 : 0;
  }
  k.threads = Threads;
  k.vectors_per_thread = Vpt;
  const auto dt = c.bf16 ? fusebox::DType::kBFloat16 : fusebox::DType::kFloat32;
  return fusebox::cuda::LaunchSoftmaxWith(k, dt, in, out, c.rows, c.cols, 0) == cudaSuccess;
}
// Triton's compiled one-row program (--triton; triton_softmax_program.h), 8192 columns only.
cudaKernel_t g_triton[2] = {nullptr, nullptr};  // fp32, bf16
bool LaunchTritonSoftmax(const uint4* in, float* out, const Case& c) {
  cudaKernel_t k = g_triton[c.bf16];
  if (!c.softmax || c.cols != 8192 || !k) return false;
  return fusebox::bench::LaunchTritonSoftmax(k, in, out, c.rows, static_cast<int>(c.cols), 0) == cudaSuccess;
}
const Impl kSoftmax[] = {
    {"library auto", LaunchSoftmaxLib<0>},
    {"library auto again (same kernel, timed as a second impl)", LaunchSoftmaxLib<0>},
    {"library bounds-checked (short rows pipeline=-1, one-block rows exp_once=-1)", LaunchSoftmaxLib<1>},
    {"library exact (short rows pipeline=1, one-block rows exp_once=1)", LaunchSoftmaxLib<2>},
    {"library short rows, 128-thread blocks, bounds-checked", LaunchSoftmaxLib<1, 128>},
    {"library short rows, 128-thread blocks, exact", LaunchSoftmaxLib<2, 128>},
    {"library exact 512 x 2", LaunchSoftmaxLib<2, 512, 2>},
    {"library row-block 512 x 2", LaunchSoftmaxLib<1, 512, 2>},
    {"triton one-row program (cubin, --triton)", LaunchTritonSoftmax},
};
const Impl* g_impls = kImpls;
int g_num_impls = sizeof(kImpls) / sizeof(kImpls[0]);

// Element i of a little-endian buffer of bf16 or fp32 values, as a float.
float ElementAt(const void* bytes, bool bf16, int64_t i) {
  uint32_t b = 0;
  if (bf16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(bytes) + 2 * i, 2);
    b = uint32_t{h} << 16;
  } else {
    std::memcpy(&b, static_cast<const char*>(bytes) + 4 * i, 4);
  }
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 300;
  bool softmax = false;
  float range = 0.f;  // > 0: fp32 cases only, uniform in [-range, range)
  int64_t spin_ns = 100000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc && !std::strcmp(argv[i + 1], "flight")) {
      g_impls = kFlight;
      g_num_impls = sizeof(kFlight) / sizeof(kFlight[0]);
      ++i;
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc && !std::strcmp(argv[i + 1], "library")) {
      g_impls = kLibrary;
      g_num_impls = sizeof(kLibrary) / sizeof(kLibrary[0]);
      ++i;
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc && !std::strcmp(argv[i + 1], "softmax")) {
      g_impls = kSoftmax;
      g_num_impls = sizeof(kSoftmax) / sizeof(kSoftmax[0]);
      softmax = true;
      ++i;
    } else if (!std::strcmp(argv[i], "--triton") && i + 1 < argc) {
      for (int b = 0; b < 2; ++b) {
        const std::string path = std::string(argv[i + 1]) + (b ? "/softmax_bf16.cubin" : "/softmax_fp32.cubin");
        CHECK_CUDA(fusebox::bench::LoadTritonSoftmax(path.c_str(), &g_triton[b]));
      }
      ++i;
    } else if (!std::strcmp(argv[i], "--range") && i + 1 < argc) {
      range = std::strtof(argv[++i], nullptr);
    } else if (!std::strcmp(argv[i], "--spin-us") && i + 1 < argc) {
      spin_ns = std::atoll(argv[++i]) * 1000;
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc && !std::strcmp(argv[i + 1], "hints")) {
      ++i;
    } else {
      std::printf("usage: %s [--rounds N] [--set hints|flight|library|softmax] [--triton DIR] [--range R] [--spin-us N]\n"
                  "  (defaults: 300 rounds, hints, the bf16 fill, 100 us)\n"
                  "  hints: load flavours and carveouts on four row-sum shapes\n"
                  "  flight: bytes in flight per SM on bf16 8192x8192\n"
                  "  library: our row-sum launchers (auto, the loop kernel, the one-batch kernel's shapes)\n"
                  "  softmax: our softmax launcher, exact kernels against bounds-checked ones, six shapes\n",
                  argv[0]);
      return std::strcmp(argv[i], "--help") ? 1 : 0;
    }
  }
  // Without --range, fp32 cases reuse the bf16 fill as bit patterns of two bf16 values: finite, |x| < 2.
  std::vector<Case> cases =
      softmax ? std::vector<Case>{{"softmax fp32 8192x8192", false, 8192, 8192, true},
                                  {"softmax bf16 8192x8192", true, 8192, 8192, true},
                                  {"softmax fp32 262144x128", false, 262144, 128, true},
                                  {"softmax bf16 262144x128", true, 262144, 128, true},
                                  {"softmax fp32 65536x1024", false, 65536, 1024, true},
                                  {"softmax bf16 65536x1024", true, 65536, 1024, true}}
              : std::vector<Case>{{"bf16 8192x8192", true, 8192, 8192},
                                  {"bf16 262144x128", true, 262144, 128},
                                  {"bf16 2048x32768", true, 2048, 32768},
                                  {"fp32 8192x8192", false, 8192, 8192}};
  if (range > 0) cases.erase(std::remove_if(cases.begin(), cases.end(), [](const Case& c) { return c.bf16; }), cases.end());
  int64_t max_bytes = 0, max_out = 0;
  for (const Case& c : cases) max_bytes = std::max(max_bytes, c.Bytes()), max_out = std::max(max_out, c.OutBytes());
  const int64_t flush_bytes = int64_t{256} << 20;
  uint4 *in, *flush;
  float *out, *sink;
  CHECK_CUDA(cudaMalloc(&in, max_bytes));
  CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
  CHECK_CUDA(cudaMalloc(&out, max_out));
  CHECK_CUDA(cudaMalloc(&sink, 4096 * sizeof(float)));
  CHECK_CUDA(cudaMemset(flush, 0, flush_bytes));
  if (range > 0) {
    FillF32<<<1024, 256>>>(reinterpret_cast<float*>(in), max_bytes / 4, 0x9e3779b9u, range);
  } else {
    Fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(in), max_bytes / 2, 0x9e3779b9u);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("GPU %s, %d SMs, L2 %d MiB; %d rounds; spin %lld us; inputs %s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, rounds, static_cast<long long>(spin_ns / 1000),
              range > 0 ? ("fp32 uniform in +-" + std::to_string(range)).c_str() : "the bf16 fill");

  // Correctness: every impl against fp64 on the CPU of the same bytes, output poisoned with NaN
  // (0xff bytes): row sums of every row; softmax every 64th row, and no NaN anywhere.
  std::vector<uint16_t> host(max_bytes / 2);
  CHECK_CUDA(cudaMemcpy(host.data(), in, max_bytes, cudaMemcpyDeviceToHost));
  auto value = [&](const Case& c, int64_t i) { return ElementAt(host.data(), c.bf16, i); };
  bool ok = true;
  for (const Case& c : cases) {
    const int64_t step = c.softmax ? 64 : 1;  // rows checked
    std::vector<double> ref(c.softmax ? (c.rows / step) * c.cols : c.rows);
    for (int64_t r = 0; r < c.rows; r += step) {
      double s = 0, m = -INFINITY;
      for (int64_t j = 0; c.softmax && j < c.cols; ++j) m = std::max(m, double{value(c, r * c.cols + j)});
      for (int64_t j = 0; j < c.cols; ++j) {
        const double x = value(c, r * c.cols + j);
        s += c.softmax ? std::exp(x - m) : x;
      }
      if (!c.softmax) {
        ref[r] = s;
        continue;
      }
      for (int64_t j = 0; j < c.cols; ++j) ref[(r / step) * c.cols + j] = std::exp(value(c, r * c.cols + j) - m) / s;
    }
    std::vector<uint8_t> got_bytes(c.OutBytes());
    for (int f = 0; f < g_num_impls; ++f) {
      CHECK_CUDA(cudaMemset(out, 0xff, c.OutBytes()));  // NaN
      if (!g_impls[f].launch(in, out, c)) continue;
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaMemcpy(got_bytes.data(), out, c.OutBytes(), cudaMemcpyDeviceToHost));
      double worst = 0;
      if (c.softmax) {
        // fp32 output: relative 1e-5 (ex2.approx, the folded exponent); bf16 output: its rounding.
        const double rel = c.bf16 ? 8e-3 : 1e-5;
        for (int64_t i = 0; i < c.rows * c.cols && !std::isnan(worst); ++i) {
          const float g = ElementAt(got_bytes.data(), c.bf16, i);
          const int64_t r = i / c.cols;
          if (std::isnan(g)) {
            worst = NAN;
          } else if (r % step == 0) {
            const double want = ref[(r / step) * c.cols + i % c.cols];
            if (!(std::fabs(g - want) <= rel * want)) worst = std::max(worst, std::fabs(g - want) / want);
          }
        }
      } else {
        const float* got = reinterpret_cast<const float*>(got_bytes.data());
        for (int64_t r = 0; r < c.rows; ++r) {
          // |x| < 2: float accumulation errs far below 2e-6 per element; a lost access errs ~0.5.
          const double err = std::fabs(got[r] - ref[r]);
          if (!(err <= 2e-6 * static_cast<double>(c.cols))) {
            worst = std::isnan(got[r]) ? NAN : std::max(worst, err);
            if (std::isnan(worst)) break;
          }
        }
      }
      if (worst != 0) {
        std::printf("FAIL %s %s: error %g%s\n", c.name.c_str(), g_impls[f].name, worst, c.softmax ? " (relative)" : "");
        ok = false;
      }
    }
  }
  std::printf("correctness: %s (%d impls x %zu cases where they apply, vs fp64 on the CPU)\n",
              ok ? "pass" : "FAIL", g_num_impls, cases.size());
  if (!ok) return 1;

  // Timing: per case, rounds of (spin, flush, events around one impl) for every impl in rotation.
  const int nimpl = g_num_impls + 1;  // + the empty kernel
  std::vector<cudaEvent_t> ev(2 * nimpl);
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  const int flush_blocks = prop.multiProcessorCount * 8;
  std::printf("\n| case | impl | median us | GB/s | vs first | p10-p90 us |\n|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    std::vector<std::vector<float>> t(nimpl);
    std::vector<bool> ran(nimpl, false);
    for (int r = 0; r < rounds + 5; ++r) {
      for (int k = 0; k < nimpl; ++k) {
        const int i = (k + r) % nimpl;
        Spin<<<1, 32>>>(spin_ns);
        Flush<<<flush_blocks, 256>>>(flush, flush_bytes / 16, sink);
        CHECK_CUDA(cudaEventRecord(ev[2 * i]));
        if (i == g_num_impls) {
          Empty<<<1, 32>>>();
        } else if (!g_impls[i].launch(in, out, c)) {
          continue;
        }
        CHECK_CUDA(cudaEventRecord(ev[2 * i + 1]));
        ran[i] = true;
      }
      CHECK_CUDA(cudaDeviceSynchronize());
      if (r < 5) continue;  // warm-up
      for (int i = 0; i < nimpl; ++i) {
        if (!ran[i]) continue;
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        t[i].push_back(ms * 1000.f);
      }
    }
    const double base = Median(t[0]);  // the first impl
    for (int i = 0; i < nimpl; ++i) {
      if (t[i].empty()) continue;
      std::vector<float> s = t[i];
      std::sort(s.begin(), s.end());
      const double med = Median(t[i]);
      const bool empty = i == g_num_impls;
      std::printf("| %s | %s | %.2f | %.0f | %.4f | %.2f-%.2f |\n", c.name.c_str(), empty ? "empty kernel" : g_impls[i].name,
                  med, empty ? 0.0 : c.Traffic() / med / 1e3, base / med, s[s.size() / 10], s[s.size() * 9 / 10]);
    }
  }
  return 0;
}
