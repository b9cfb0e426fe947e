// Matmul fused with ReLU on the GPU: out[M,N] = relu(A[M,K] B[K,N] + bias[N]),
// every matrix row-major and dense, bias optional, all pointers device memory.
// Accumulation is float32 for every dtype; the output has the input dtype.
//
// Two implementations of the same function:
//  - CublasLtMatmul: cuBLASLt with the RELU / RELU_BIAS epilogue. Row-major is
//    handled by the transpose trick (C^T = B^T A^T is a column-major product of
//    the same buffers), so no copies. float32 is exact (CUBLAS_COMPUTE_32F)
//    unless allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32). The heuristic's choice
//    is cached per shape/dtype/epilogue/alignment in a MatmulAlgoCache that
//    every runner of a device shares (thread-safe); each runner owns one
//    cuBLASLt handle and one workspace (32 MiB by default, allocated once at
//    creation: nothing is allocated per call). One runner per stream/thread.
//    cuBLASLt's trace log on the H200 shows our call and PyTorch's
//    _addmm_activation with the same descriptors and the same heuristic pick;
//    the one difference is the workspace (torch 2.11 passes 1 MiB:
//    kTorchWorkspaceBytes; NOTES-matmul.md lists every difference).
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

// Heuristic results shared by the runners of one device. Bounded: when it
// holds kMaxEntries shapes it is cleared (clients choose shapes freely).
class MatmulAlgoCache;
std::shared_ptr<MatmulAlgoCache> NewMatmulAlgoCache();

class CublasLtMatmul {
 public:
  // The workspace offered to cuBLASLt (its heuristic only returns algorithms
  // that fit). 32 MiB is what cuBLAS recommends on Hopper and what runs 1-3
  // measured; PyTorch 2.11 offers cuBLASLt 1 MiB (CUBLASLT_WORKSPACE_SIZE,
  // default 1024 KiB). The default stays 32 MiB until run 4 has timed both
  // side by side (NOTES-matmul.md); switching is this one line.
  static constexpr size_t kLargeWorkspaceBytes = size_t{32} << 20;
  static constexpr size_t kTorchWorkspaceBytes = size_t{1} << 20;
  static constexpr size_t kDefaultWorkspaceBytes = kLargeWorkspaceBytes;

  // Creates the handle and the workspace on the current device. With
  // `autotune`, the first Run of a shape of >= 8 GFLOP times the heuristic's
  // first 8 candidates on its data (a one-time cost of ~24 extra products)
  // and caches the fastest; otherwise (the default) the heuristic's first
  // pick is used. Off by default: timed without an L2 flush, inside a server,
  // it picked slower kernels as often as faster ones (NOTES-matmul.md, run 3).
  static absl::StatusOr<std::unique_ptr<CublasLtMatmul>> Create(
      std::shared_ptr<MatmulAlgoCache> cache, size_t workspace_bytes = kDefaultWorkspaceBytes,
      bool autotune = false);
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // Enqueues the product on `stream`; returns once it is enqueued.
  // Not thread-safe: one runner per thread (the cache is shared safely).
  absl::Status Run(const MatmulArgs& args, cudaStream_t stream);
  // Runs the heuristic for these arguments now (if not cached), so that a
  // later Run only launches. Enqueues nothing.
  absl::Status Prepare(const MatmulArgs& args);

  // The algorithm Run would use for these arguments (planned now if not
  // cached), for benchmarks and logs: cuBLASLt's algorithm id, tile, stages,
  // split-K, reduction scheme, swizzle, custom option, inner and cluster
  // shape ids, the workspace it needs, and a hash of the opaque algorithm
  // (equal hashes: the same kernel and configuration). Enqueues nothing.
  absl::StatusOr<std::string> DescribeAlgo(const MatmulArgs& args);

  size_t workspace_bytes() const;

 private:
  struct Impl;
  struct Plan;
  absl::Status MakePlan(const MatmulArgs& args, Plan* plan);
  absl::Status Heuristic(Plan* plan, int want, cublasLtMatmulHeuristicResult_t* results,
                         int* found);
  absl::Status Tune(const MatmulArgs& args, Plan* plan, cudaStream_t stream);
  absl::Status Launch(const MatmulArgs& args, Plan& plan, const cublasLtMatmulAlgo_t& algo,
                      cudaStream_t stream);
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
