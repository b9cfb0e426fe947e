// Matmul fused with ReLU on the GPU: out[M,N] = relu(A[M,K] B[K,N] + bias[N]),
// every matrix row-major and dense, bias optional, all pointers device memory.
// Accumulation is float32 for every dtype; the output has the input dtype.
//
// Two implementations of the same function:
//  - CublasLtMatmul: cuBLASLt with the RELU / RELU_BIAS epilogue. Row-major is
//    handled by the transpose trick (C^T = B^T A^T is a column-major product of
//    the same buffers), so no copies. float32 is exact (CUBLAS_COMPUTE_32F)
//    unless allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32). The algorithm is chosen
//    once per shape/dtype/epilogue/alignment (LtAlgoPolicy; by default "two
//    picks": the heuristic's first pick for a 32 MiB and for a 1 MiB workspace,
//    timed against each other where they differ) and cached in a
//    MatmulAlgoCache that every runner of a device shares (thread-safe); each
//    runner owns one cuBLASLt handle and one workspace (32 MiB by default,
//    allocated once at creation: nothing is allocated per call). One runner
//    per stream/thread. cuBLASLt's trace log on the H200 shows our call and
//    PyTorch's _addmm_activation with the same descriptors; the one difference
//    is the workspace (torch 2.11 passes 1 MiB: kTorchWorkspaceBytes), which
//    changes the heuristic's pick for fp32/tf32 on some shapes and not for
//    fp16/bf16 (NOTES-matmul.md, run 4).
//  - LaunchMatmulReluTiled (matmul_tiled.cu): our own tensor-core kernels for
//    float16/bfloat16: wgmma + TMA (sm_90a) for large aligned problems,
//    mma.sync m16n8k16 with a cp.async pipeline for everything else (any M,
//    N, K, any alignment); float32 goes to an exact CUDA-core (FFMA) kernel,
//    never TF32. The library is built for sm_90a only (H100/H200).
//
// ReLU keeps NaN: relu(NaN) = NaN in the tiled kernel, like the CPU reference.
// Errors are returned, never abort: shapes out of range are INVALID_ARGUMENT,
// cuBLASLt allocation failures RESOURCE_EXHAUSTED, unsupported cases
// UNIMPLEMENTED, anything else INTERNAL, each with the library's message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace fusebox::cuda {

struct MatmulArgs {
  DType dtype = DType::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;     // [m, k]
  const void* b = nullptr;     // [k, n]
  const void* bias = nullptr;  // [n] of dtype, or null
  void* out = nullptr;         // [m, n]
  bool allow_tf32 = false;     // float32 only: may round inputs to TF32
};

// Shapes must be >= 0 (0 is a no-op, K = 0 gives relu(bias)) and below 2^31
// per dimension; pointers non-null where elements exist.
absl::Status ValidateMatmul(const MatmulArgs& args);

// Chosen algorithms shared by the runners of one device (thread-safe).
// Bounded: when it holds kMaxEntries keys it is cleared (clients choose shapes
// freely); each runner also keeps its own latest choice, so a Run right after
// its Prepare never chooses again. No key is locked while it is being chosen:
// two workers that miss the same key at once both choose it (both may time the
// two picks); each launches its own choice, and the later Put wins. Harmless:
// either choice is one of the same two valid algorithms, and it happens once
// per key.
class MatmulAlgoCache;
std::shared_ptr<MatmulAlgoCache> NewMatmulAlgoCache();

// How a runner chooses cuBLASLt's algorithm the first time it meets a key
// (shape, dtype, bias, tf32, pointer alignments, workspace size).
enum class LtAlgoPolicy {
  // The default. Asks the heuristic for its first pick twice: with the
  // runner's whole workspace as the preference (32 MiB by default) and with
  // kSecondPickWorkspaceBytes (1 MiB, PyTorch's). Equal algorithms (byte for
  // byte): that one, untimed -- so wherever the workspace does not change the
  // pick (fp16/bf16 in run 4) this is exactly kFirstPick. Different: both are
  // timed once on the call's own buffers and stream (one warm-up each, then 3
  // rounds alternating large, small; CUDA events around each launch, each
  // after a 64 MiB read that pushes the operands out of L2, as the
  // benchmarks time them), and the 1 MiB pick is cached
  // only if its median is at least 2% below the large pick's; otherwise, and
  // whenever the timing fails, the large pick. Run 4 on the H200: each of the
  // two picks was the faster one on some fp32/tf32 shapes (by 5-25%), so no
  // fixed workspace is right everywhere.
  kTwoPicks,
  // The heuristic's first pick with the runner's workspace, untimed (PyTorch's
  // policy; the default of runs 1-4).
  kFirstPick,
  // Problems of >= 8 GFLOP: the heuristic's first 8 candidates (runner's
  // workspace) are timed on the first call's data, 1 warm-up + 2 runs each,
  // and the fastest is cached; smaller problems get kTwoPicks. Timed without
  // an L2 flush it picked slower kernels as often as faster ones in run 3, so
  // it stays opt-in. Where it applies it replaces the two picks (never both).
  kAutotune,
};

// How the cached algorithm of a key was chosen (LtAlgoInfo::choice).
enum class LtAlgoChoice {
  kFirstPick,        // kFirstPick policy
  kPicksAgree,       // two picks: the same algorithm (or only one workspace size to ask for)
  kNoSecondPick,     // two picks: the small workspace got no algorithm; the large pick
  kTimedLargeKept,   // two picks differed, timed: the small one was not >= 2% faster
  kTimedSmallWon,    // two picks differed, timed: the small-workspace pick is >= 2% faster
  kTimingFailed,     // two picks differed, the timing failed (error cleared): the large pick
  kAutotuned,        // kAutotune on >= 8 GFLOP: the fastest of the first 8 candidates
};
const char* LtAlgoChoiceName(LtAlgoChoice c);

// The algorithm a runner uses for a key and how it got there (for tests,
// benchmarks and logs).
struct LtAlgoInfo {
  LtAlgoChoice choice = LtAlgoChoice::kFirstPick;
  bool timed = false;            // candidates were timed (two picks differed, or autotune)
  uint64_t hash = 0;             // FNV-1a of the opaque algorithm: equal hash, same kernel+config
  uint64_t large_hash = 0;       // two picks: the large-workspace pick (0 if not asked)
  uint64_t small_hash = 0;       // two picks: the small-workspace pick (0 if not asked)
  float large_ms = 0, small_ms = 0;  // two picks, timed: median of the 3 rounds (L2 flushed)
  size_t workspace_needed = 0;   // what the algorithm uses of the workspace
  size_t launch_workspace = 0;   // the workspace size handed to cublasLtMatmul
  std::string description;       // DescribeAlgo's text
};

// Per-runner counters (single-threaded like the runner). A key found in the
// cache costs no heuristic query and no timing.
struct LtStats {
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t heuristic_queries = 0;  // cublasLtMatmulAlgoGetHeuristic calls
  int64_t timed_selections = 0;   // keys whose candidates were timed (two picks or autotune)
  int64_t timing_failures = 0;    // two-pick timings that failed (fell back to the large pick)
};

class CublasLtMatmul {
 public:
  // The workspace offered to cuBLASLt (its heuristic only returns algorithms
  // that fit). 32 MiB is what cuBLAS recommends on Hopper and what runs 1-4
  // measured; PyTorch 2.11 offers cuBLASLt 1 MiB (CUBLASLT_WORKSPACE_SIZE,
  // default 1024 KiB). Run 4 timed both: neither is right on every shape, so
  // the default runner allocates 32 MiB and kTwoPicks also asks for the
  // 1 MiB pick (launched with a 1 MiB workspace size, as torch does).
  static constexpr size_t kLargeWorkspaceBytes = size_t{32} << 20;
  static constexpr size_t kTorchWorkspaceBytes = size_t{1} << 20;
  static constexpr size_t kDefaultWorkspaceBytes = kLargeWorkspaceBytes;
  static constexpr size_t kSecondPickWorkspaceBytes = kTorchWorkspaceBytes;

  // Creates the handle and the workspace on the calling thread's current
  // device (making its primary context current first). `policy`: see
  // LtAlgoPolicy. Runners with different policies or workspace sizes may
  // share a cache: both are part of the key, so they never see each other's
  // entries. `scratch_pool`: where the timing of two picks takes its 64 MiB
  // L2-flush buffer for the while (null: the device's default pool).
  static absl::StatusOr<std::unique_ptr<CublasLtMatmul>> Create(
      std::shared_ptr<MatmulAlgoCache> cache, size_t workspace_bytes = kDefaultWorkspaceBytes,
      LtAlgoPolicy policy = LtAlgoPolicy::kTwoPicks, cudaMemPool_t scratch_pool = nullptr);
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // Enqueues the product on `stream`; returns once it is enqueued. On a cache
  // miss it first chooses the algorithm (Prepare), which may time candidates
  // on `stream` and wait for them.
  // Not thread-safe: one runner per thread (the cache is shared safely).
  absl::Status Run(const MatmulArgs& args, cudaStream_t stream);
  // Chooses the algorithm for these arguments now if the key is not cached,
  // so that a later Run only launches. Where the policy times candidates
  // (two picks that differ, autotune), they run on `stream` with these
  // buffers: args.out is overwritten (the inputs' values do not matter for
  // the timing, they may still be uninitialised), and this thread waits for
  // `stream` to drain. A timing failure never fails the call (two picks).
  // On a cache hit: nothing is enqueued and nothing waits.
  absl::Status Prepare(const MatmulArgs& args, cudaStream_t stream);

  // The algorithm Run would use for these arguments (chosen now, as Prepare
  // does, if not cached), with how it was chosen: cuBLASLt's algorithm id,
  // tile, stages, split-K, reduction scheme, swizzle, custom option, inner and
  // cluster shape ids, the workspace it needs, a hash of the opaque algorithm
  // (equal hashes: the same kernel and configuration), then the policy's
  // record ("choice ... picks LARGE/SMALL timed_ms L/S launch_ws W").
  absl::StatusOr<LtAlgoInfo> AlgoInfo(const MatmulArgs& args, cudaStream_t stream);
  absl::StatusOr<std::string> DescribeAlgo(const MatmulArgs& args, cudaStream_t stream);

  size_t workspace_bytes() const;
  LtAlgoPolicy policy() const;
  LtStats stats() const;

 private:
  struct Impl;
  struct Plan;
  absl::Status MakePlan(const MatmulArgs& args, cudaStream_t stream, Plan* plan);
  absl::Status Choose(const MatmulArgs& args, cudaStream_t stream, Plan* plan);
  absl::Status Heuristic(Plan* plan, size_t workspace, int want,
                         cublasLtMatmulHeuristicResult_t* results, int* found);
  bool TimePicks(const MatmulArgs& args, Plan& plan, const cublasLtMatmulAlgo_t& large,
                 size_t large_ws, const cublasLtMatmulAlgo_t& small, size_t small_ws,
                 cudaStream_t stream, float* large_ms, float* small_ms);
  absl::Status Tune(const MatmulArgs& args, Plan* plan, cudaStream_t stream);
  absl::Status Launch(const MatmulArgs& args, Plan& plan, const cublasLtMatmulAlgo_t& algo,
                      size_t workspace, cudaStream_t stream);
  explicit CublasLtMatmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Our tiled kernels. Enqueues on `stream`; returns the launch's error.
// Needs no workspace and no handle; safe from any thread. kAuto takes the
// wgmma kernel when it applies (16-bit, K % 8 == 0, N % 8 == 0, A and B
// 16-byte aligned, at least 132 output tiles of 128x256) and mma.sync
// otherwise; kMmaSync forces mma.sync (tests and benchmarks compare them).
enum class TiledKernel { kAuto, kMmaSync };
cudaError_t LaunchMatmulReluTiled(const MatmulArgs& args, cudaStream_t stream,
                                  TiledKernel which = TiledKernel::kAuto);

// Converts a CUDA error to a status with `what` as context
// (cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED, else INTERNAL).
absl::Status CudaStatus(cudaError_t err, const char* what);

}  // namespace fusebox::cuda
