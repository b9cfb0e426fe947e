// Launchers for the memory-bound CUDA kernels: GeLU (tanh form), softmax over the last axis,
// row sum over the last axis. Plain C++ header (no CUDA compiler needed to include it).
//
// Every launcher takes device pointers, sizes and a stream, enqueues its kernel(s) and returns the
// launch status (cudaGetLastError after the launch); it never synchronises, allocates, exits or
// aborts. Long softmax / row-sum rows are split over a thread-block cluster (sm_90) that combines
// its partial results through distributed shared memory; softmax can also split a row over
// independent blocks that meet in a caller-provided workspace (SoftmaxWorkspaceBytes), which the
// launcher initialises with cudaMemsetAsync before the kernel.
//
// Semantics (the same as kernels/cpu and tests/reference.cc):
//  - Gelu: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed in float32.
//    In place (in == out) is allowed.
//  - Softmax: each row of `cols` elements, max-subtracted, float32 arithmetic. A row holding a NaN
//    or +inf, or made only of -inf, becomes all NaN (as PyTorch). in and out must not overlap.
//  - RowSum: out[r] = float32 sum of row r (float32 accumulation). cols == 0 writes zeros.
// Sizes: rows * cols may exceed 2^31 (64-bit indexing); a row is at most kMaxRowAccesses accesses
// (RowLengthSupported; 2^30 - 1, as the kernels count a row's accesses in 32-bit ints); longer
// rows give cudaErrorInvalidValue.
// Pointers: any element-aligned address. Rows are read and written with 16-byte vectors whatever
// their alignment (a scalar head and tail around them) where input and output share their offset
// modulo 16 bytes (always so for pool memory); a scalar path otherwise. Negative sizes give
// cudaErrorInvalidValue.
// Thread safety: launchers may be called concurrently from several threads and streams.
// Kernel choice: automatic, from the dtype, the shape and the pointers' alignment (each kernel
// file says which kernel runs where and why). Tests and benchmarks force other choices through
// kernels/cuda/tuning.h; nothing here depends on it.
// Cost: one pass over the data (each input byte read once from HBM, each output written once),
// except softmax rows longer than their blocks hold on chip (with a workspace, 64 blocks x 288 KiB:
// fp32 rows > ~4.7M elements, 16-bit > ~9.4M; without, a cluster of 16 x 288 KiB: > ~1.2M / 2.4M):
// the part that does not fit is read a second time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace fusebox::cuda {

cudaError_t LaunchGelu(DType dt, const void* in, void* out, int64_t n, cudaStream_t s);
// The longest softmax / row-sum row: kMaxRowAccesses accesses, of 16 bytes where the row is a
// whole number of them and the pointers are 16-byte aligned (as pool memory is), else of one
// element. RowLengthSupported answers for 16-byte aligned pointers.
constexpr int64_t kMaxRowAccesses = (int64_t{1} << 30) - 1;
constexpr bool RowLengthSupported(DType dt, int64_t cols) {
  const int64_t w = 16 / static_cast<int64_t>(ElementSize(dt));
  return (cols % w == 0 ? cols / w : cols) <= kMaxRowAccesses;
}
// Device scratch memory; {nullptr, 0} = none (softmax then uses no split path).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
cudaError_t LaunchSoftmax(DType dt, const void* in, void* out, int64_t rows, int64_t cols,
                          cudaStream_t s, Workspace ws = {});
// Workspace bytes that softmax's automatic choice uses for this shape (0 if none; 16-byte aligned
// pointers assumed). A launch given less takes a plan without the workspace.
size_t SoftmaxWorkspaceBytes(DType dt, int64_t rows, int64_t cols);
// Row sum: with a workspace of RowSumWorkspaceBytes (which it does not need initialised), rows too
// few to fill the GPU are split over more blocks whose partial sums meet there (a second small
// launch adds them in a fixed order: the result is deterministic). Given less, it runs without.
cudaError_t LaunchRowSum(DType dt, const void* in, float* out, int64_t rows, int64_t cols,
                         cudaStream_t s, Workspace ws = {});
size_t RowSumWorkspaceBytes(DType dt, int64_t rows, int64_t cols);
// Evicts L2 for timing (the matmul runner's timing of its two cuBLASLt picks, and the
// benchmarks): reads `bytes` (a multiple of kFlushRowBytes) of `buf` with plain loads
// (a row sum over rows of kFlushRowBytes) and writes bytes / kFlushRowBytes floats to `sums`.
// Plain, not evict-first: evict-first lines replace one another and leave older lines in L2.
// Leaves no dirty lines for the timed launch to write back (as a memset would).
constexpr int64_t kFlushRowBytes = int64_t{64} << 10;
cudaError_t FlushL2(const void* buf, int64_t bytes, float* sums, cudaStream_t s);

}  // namespace fusebox::cuda
