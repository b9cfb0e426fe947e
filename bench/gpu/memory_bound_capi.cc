// A C entry point to our memory-bound launchers (kernels/cuda/launch.h, tuning.h) for
// memory_bound_peers.py (ctypes), so that our kernels and the torch / torch.compile / Triton
// peers are timed by one harness, on the same tensors, interleaved in one process: no clock,
// thermal or ordering drift between two programs. Benchmark-only; the server never loads this.
//
// op: 0 GeLU (rows * cols elements), 1 softmax, 2 row sum (out is float32[rows]).
// dtype: 1 float32, 2 float16, 3 bfloat16 (fusebox::DType).
// choice: nullptr = the plain launcher (the automatic choice the server uses); else 17 ints in
//   KernelChoice order: threads_per_row, vectors_per_thread, cluster, threads, smem_bytes,
//   long_rows, pipeline, streaming, exp_once, split, split_wait_us, exp_fma, prefetch, tile, tile_elems, rows_per_lane, row_program (0 =
//   automatic), as memory_bound_variants.h forces them (memory_bound_peers.py --variant).
// Softmax and row sum get the workspace their choice asks for, as the server gives it (one buffer
// per process, grown when a shape needs more; the harness calls from one thread).
// stream: a cudaStream_t (torch.cuda.current_stream().cuda_stream).
// Returns the launch's cudaError_t (0 = success; an unknown op or dtype gives cudaErrorInvalidValue).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "bench/gpu/triton_softmax_program.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"
#include "kernels/dtype.h"

namespace {
using fusebox::DType;
namespace fc = fusebox::cuda;

bool ValidDType(int d) { return d >= 1 && d <= 3; }

fc::KernelChoice ToChoice(const int32_t* c) {
  fc::KernelChoice k;
  if (c != nullptr) {
    k.threads_per_row = c[0];
    k.vectors_per_thread = c[1];
    k.cluster = c[2];
    k.threads = c[3];
    k.smem_bytes = c[4];
    k.long_rows = c[5];
    k.pipeline = c[6];
    k.streaming = c[7];
    k.exp_once = c[8];
    k.split = c[9];
    k.split_wait_us = c[10];
    k.exp_fma = c[11];
    k.prefetch = c[12];
    k.tile = c[13];
    k.tile_elems = c[14];
    k.rows_per_lane = c[15];
    k.row_program = c[16];
  }
  return k;
}

fc::Workspace GrowWorkspace(size_t need) {
  static void* buf = nullptr;
  static size_t size = 0;
  if (need > size) {
    cudaFree(buf);
    buf = nullptr;
    size = 0;
    if (cudaMalloc(&buf, need) != cudaSuccess) return {};
    size = need;
  }
  return {buf, size};
}
fc::Workspace SoftmaxWorkspace(DType dt, int64_t rows, int64_t cols, const fc::KernelChoice& k) {
  return GrowWorkspace(fc::SoftmaxWorkspaceBytesWith(k, dt, rows, cols));
}
fc::Workspace RowSumWorkspace(DType dt, int64_t rows, int64_t cols, const fc::KernelChoice& k) {
  return GrowWorkspace(fc::RowSumWorkspaceBytesWith(k, dt, rows, cols));
}
}  // namespace

#define FUSEBOX_CAPI extern "C" __attribute__((visibility("default")))

FUSEBOX_CAPI int fusebox_bench_memory_bound(int op, int dtype, const void* in, void* out, int64_t rows,
                                            int64_t cols, const int32_t* choice, void* stream) {
  if (!ValidDType(dtype)) return cudaErrorInvalidValue;
  const auto dt = static_cast<DType>(dtype);
  const auto s = static_cast<cudaStream_t>(stream);
  auto* sums = static_cast<float*>(out);
  if (choice == nullptr) {
    switch (op) {
      case 0: return fc::LaunchGelu(dt, in, out, rows * cols, s);
      case 1: return fc::LaunchSoftmax(dt, in, out, rows, cols, s, SoftmaxWorkspace(dt, rows, cols, {}));
      case 2: return fc::LaunchRowSum(dt, in, sums, rows, cols, s, RowSumWorkspace(dt, rows, cols, {}));
      default: return cudaErrorInvalidValue;
    }
  }
  const fc::KernelChoice k = ToChoice(choice);
  switch (op) {
    case 0: return fc::LaunchGeluWith(k, dt, in, out, rows * cols, s);
    case 1: return fc::LaunchSoftmaxWith(k, dt, in, out, rows, cols, s, SoftmaxWorkspace(dt, rows, cols, k));
    case 2: return fc::LaunchRowSumWith(k, dt, in, sums, rows, cols, s, RowSumWorkspace(dt, rows, cols, k));
    default: return cudaErrorInvalidValue;
  }
}

// What the launch above would run, e.g. "softmax/cluster vec c=16 t=512 v=4 smem=229376" (the
// C++ bench's "desc"); GeLU has no description (empty string). Writes at most len bytes.
FUSEBOX_CAPI void fusebox_bench_memory_bound_describe(int op, int dtype, const void* in, const void* out,
                                                      int64_t rows, int64_t cols, const int32_t* choice,
                                                      char* buf, int len) {
  if (buf == nullptr || len <= 0) return;
  buf[0] = '\0';
  if (!ValidDType(dtype)) return;
  const auto dt = static_cast<DType>(dtype);
  const fc::KernelChoice k = ToChoice(choice);
  if (op == 1) {
    fc::DescribeSoftmax(dt, in, out, rows, cols, k, buf, len, fc::SoftmaxWorkspaceBytesWith(k, dt, rows, cols));
  }
  if (op == 2) fc::DescribeRowSum(dt, in, rows, cols, k, buf, len, fc::RowSumWorkspaceBytesWith(k, dt, rows, cols));
}

// cudaGetErrorName of an error code above, e.g. "cudaErrorInvalidValue".
FUSEBOX_CAPI const char* fusebox_bench_cuda_error_name(int error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

// Diagnostic (memory_bound_peers.py --triton-cubin DIR): Triton's one-row softmax program, from a
// cubin that bench/gpu/triton_softmax_cubin.py wrote, launched through this library's runtime as
// our kernels are (triton_softmax_program.h). Loads the cubin on the first call per path.
FUSEBOX_CAPI int fusebox_bench_softmax_cubin(const char* path, const void* in, void* out, int64_t rows, int cols,
                                             void* stream) {
  static std::map<std::string, cudaKernel_t> kernels;
  static std::mutex mu;
  cudaKernel_t k = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = kernels.find(path);
    if (it == kernels.end()) {
      const cudaError_t e = fusebox::bench::LoadTritonSoftmax(path, &k);
      if (e != cudaSuccess) {
        cudaGetLastError();  // returned here, not left for the next launch (ours or torch's) to report
        return e;
      }
      it = kernels.emplace(path, k).first;
    }
    k = it->second;
  }
  return fusebox::bench::LaunchTritonSoftmax(k, in, out, rows, cols, static_cast<cudaStream_t>(stream));
}
