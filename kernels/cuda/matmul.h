// Matmul fused with ReLU on the GPU: out[M,N] = relu(A[M,K] B[K,N] + bias[N]),
// every matrix row-major and dense, bias optional, all pointers device memory.
// Accumulation is float32 for every dtype; the output has the input dtype.
//
// Two implementations of the same function:
//  - CublasLtMatmul: cuBLASLt with the RELU / RELU_BIAS epilogue. Row-major is
//    handled by the transpose trick (C^T = B^T A^T is a column-major product of
//    the same buffers), so no copies. float32 is exact (CUBLAS_COMPUTE_32F)
//    unless allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32). The algorithm is chosen
//    once per shape/dtype/epilogue/alignment (LtAlgoPolicy::kTwoPicks: the
//    heuristic's first pick for a 32 MiB and for a 1 MiB workspace, timed
//    against each other where they differ) and cached in a MatmulAlgoCache
//    that every runner of a device shares (thread-safe); each runner owns one
//    cuBLASLt handle and one workspace (32 MiB by default, allocated once at
//    creation: nothing is allocated per call). One runner per stream/thread.
//    cuBLASLt's trace log on the H200 shows our call and PyTorch's
//    _addmm_activation with the same descriptors; the one difference is the
//    workspace (torch 2.11 passes 1 MiB), which changes the heuristic's pick
//    for fp32/tf32 on some shapes and not for fp16/bf16: hence the two picks.
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
//
// This header is what the CUDA backend uses. Forcing the tiled kernel's
// variant and reading what a runner chose (its counters, the algorithm and how
// it was picked) are for tests and benchmarks: kernels/cuda/matmul_tuning.h.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

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
// (shape, dtype, bias, tf32, pointer alignments, workspace size, policy).
// The product uses kTwoPicks; kFirstPick and kAutotune are the policies it is
// compared with, for tests and benchmarks.
enum class LtAlgoPolicy {
  // The default. Asks the heuristic for its first pick twice: with the
  // runner's whole workspace as the preference (32 MiB by default) and with
  // kSecondPickWorkspaceBytes (1 MiB, PyTorch's). Equal algorithms (byte for
  // byte): that one, untimed -- so wherever the workspace does not change the
  // pick (fp16/bf16 on the H200) this is exactly kFirstPick. Different: both
  // are timed once on the call's own buffers and stream (one warm-up each,
  // then 3 rounds alternating large, small; CUDA events around each launch,
  // each after a 64 MiB read that pushes the operands out of L2, as the
  // benchmarks time them), and the 1 MiB pick is cached only if its median is
  // at least 2% below the large pick's; otherwise, and whenever the timing
  // fails, the large pick. Why both: measured on the H200, each of the two
  // picks was the faster one on some fp32/tf32 shapes (by 5-25%), so no fixed
  // workspace is right everywhere.
  kTwoPicks,
  // The heuristic's first pick with the runner's workspace, untimed (PyTorch's
  // policy).
  kFirstPick,
  // Problems of >= 8 GFLOP: the heuristic's first 8 candidates (runner's
  // workspace) are timed on the first call's data, 1 warm-up + 2 runs each,
  // and the fastest is cached; smaller problems get kTwoPicks. Opt-in because
  // timed on a warm L2 (a server cannot flush it before each call) it picked
  // slower kernels as often as faster ones on the H200. Where it applies it
  // replaces the two picks (never both).
  kAutotune,
};

class CublasLtMatmul {
 public:
  // The workspace offered to cuBLASLt (its heuristic only returns algorithms
  // that fit). 32 MiB is what cuBLAS recommends on Hopper; PyTorch 2.11 offers
  // cuBLASLt 1 MiB (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB). Timed on the
  // H200, neither is right on every shape, so the default runner allocates
  // 32 MiB and kTwoPicks also asks for the 1 MiB pick (launched with a 1 MiB
  // workspace size, as torch does).
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  static constexpr size_t kSecondPickWorkspaceBytes = size_t{1} << 20;

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

 private:
  // matmul_tuning.h's PolicyOf, StatsOf and AlgoInfoOf read a runner through it.
  friend struct LtRunnerAccess;
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
// Needs no workspace and no handle; safe from any thread. Takes the wgmma
// kernel when it applies (16-bit, K % 8 == 0, N % 8 == 0, A and B 16-byte
// aligned, at least 132 output tiles of 128x256: one per SM of an H200) and
// mma.sync otherwise.
cudaError_t LaunchMatmulReluTiled(const MatmulArgs& args, cudaStream_t stream);

// Converts a CUDA error to a status with `what` as context
// (cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED, else INTERNAL).
absl::Status CudaStatus(cudaError_t err, const char* what);

}  // namespace fusebox::cuda
