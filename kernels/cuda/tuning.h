// Tuning hooks of the memory-bound kernels, for tests, benchmarks and lab probes only: force parts
// of the kernel choice that launch.h's launchers make automatically, ask what a choice would
// launch, and size softmax's workspace for a forced choice. The product (the CUDA backend) uses
// launch.h alone; CMake target fusebox_kernels_cuda_tuning carries this header.
//
// The automatic launchers are these with KernelChoice{} (every field 0 = automatic): each op's
// launch path takes the choice, so a forced variant runs the same planning and kernel code as the
// product with only the forced decisions changed. That is why the hooks are defined in gelu.cu,
// softmax.cu and rowsum.cu beside the automatic path, and the tuning target adds no code of its
// own: a separate library would compile every kernel template a second time. Same contract as
// launch.h (errors, sizes, pointers, thread safety) unless said otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/dtype.h"

namespace fusebox::cuda {

// Forces parts of the kernel choice; 0 means "automatic". Values the build has no kernel for give
// cudaErrorInvalidValue.
//   threads_per_row   short-row kernel: lanes per row (1, 2, 4, 8, 16, 32)
//   vectors_per_thread short-row softmax: 4, 8 or 16; long-row softmax: 1, 2, 4 or 8 (4 or 8
//                     for the pipelined kernel); long-row row sum: loads in flight per thread
//                     (with threads 256: 4, 8, 16; with 512: 8); short-row row sum: per lane
//                     (8, or 4 with streaming loads of 16-byte accesses)
//   cluster           long-row kernels: blocks per row (1..16; > 8 needs a non-portable cluster)
//   threads           long-row softmax: threads per block (multiple of 32, <= 512); short-row
//                     softmax: 32, 64, 128 or 256 (>= threads_per_row); row sum: threads per
//                     block (short rows 256, 512 or 1024; long rows 256 or 512)
//   smem_bytes        long-row softmax: shared memory per block holding row data (-1 = none)
//   long_rows         1 = use the long-row (block/cluster) kernel, -1 = the short-row kernel
//   pipeline          long-row softmax: 1 = persistent pipelined kernel, -1 = one-shot kernel;
//                     long-row row sum: 1 = the one-batch kernel (rows of exactly threads x
//                     vectors_per_thread 16-byte accesses; 512 x 2 or 4, 256 x 4 or 8); short-row
//                     row sum: 1 = the exact kernel (rows of exactly threads_per_row x 2, 4 or 8
//                     16-byte accesses); -1 = neither (0: automatic, as documented in rowsum.cu);
//                     short-row softmax: 1 = the exact form (rows of exactly threads_per_row x 2,
//                     4 or 8 accesses, <= 32 floats per lane, default hints), -1 = bounds-checked
//   streaming         1 = streaming cache hints (.cs loads/stores), -1 = plain loads/stores
//   split             long-row softmax: blocks per row (2..128) that combine in the workspace
//                     instead of a cluster (not with cluster > 1 or pipeline); 0 = automatic
//                     (rows that would take a cluster of 8+, or too few rows to fill the GPU,
//                     when the workspace suffices); 1 = never. Long-row row sum: blocks per row
//                     (2..4096) whose partial sums meet in the workspace, the same 0 / 1
//   split_wait_us     split: how long a block waits for its row-mates before reading the row
//                     itself (0 = 1000 us; -1 = do not wait; tests use it for that path)
//   exp_fma           softmax: 1 / 0 = e^(x - max) as one FFMA where |max| <= 32, 1/sum folded
//                     into the output's exponent (adds a few 1e-6 relative error at most), -1 =
//                     always (x - max) x log2(e) and a multiply by 1/sum
//   prefetch          long-row softmax (one-shot kernels, vector path): each block prefetches
//                     into L2 the chunk of the block N/4 x (blocks resident at once) ahead (1..8;
//                     0 = automatic: 1 on the split path and on 4-byte rows of one 512-thread
//                     block when the rows fill 12 or more waves of resident blocks; -1 = none).
//                     Of the rows of one block only the 512-thread ones have a prefetching form;
//                     other such shapes asked for it take the chunk kernel
//   exp_once          short-row softmax: 1 = keep e^(x - max) in registers from the sum to the
//                     output (one exp per element instead of two; vectors_per_thread x elements
//                     per access <= 32, automatic where that holds), -1 = recompute it; rows of
//                     one block: 1 = the exact kernel (rows of exactly threads x vectors_per_thread
//                     16-byte accesses, <= 32 floats per thread, one exp per element, no bounds
//                     checks) where it applies (0: for 2-byte types only), -1 = the recomputing kernel
//   tile              softmax / row sum, rows of <= 64 columns: 1 = the tile kernel (a block's
//                     consecutive rows read and written as one flat span of 16-byte vectors through
//                     shared memory), -1 = never; 0 = automatic: softmax rows that are not whole
//                     aligned vectors, row-sum rows under 128 bytes or not whole aligned vectors,
//                     when no other short-row field is forced; softmax only: 2 = the tiny kernel
//                     (lanes read their row's elements straight from global memory, no shared
//                     memory), automatic for tensors of such rows up to 128 KiB
//   tile_elems        the tile kernels: a row's elements per lane, 4, 8 or 16 (lanes per row =
//                     the power of two that covers the row with that many); 0 = automatic
//   rows_per_lane     row sum, aligned rows of 1-7 whole 16-byte accesses: the packed kernel with
//                     this many rows per lane (1, 2, 4, 8: its loads in flight); 0 = automatic (the
//                     packed kernel with 4, unless another short-row field is forced); -1 = never
//   row_program       softmax, rows of 65-16384 columns: 1 = a block per row holding the row in
//                     registers (threads: 128, 256 or 512, else automatic), -1 = never; 0 =
//                     automatic (up to 1024 rows and 4 MiB, not fp32 scalar rows past 4096
//                     columns, when no other field is forced)
// GeLU uses vectors_per_thread (1, 2, 4, 8), threads (32..1024) and streaming.
struct KernelChoice {
  int threads_per_row = 0;
  int vectors_per_thread = 0;
  int cluster = 0;
  int threads = 0;
  int smem_bytes = 0;
  int long_rows = 0;
  int pipeline = 0;
  int streaming = 0;
  int exp_once = 0;
  int split = 0;
  int split_wait_us = 0;
  int exp_fma = 0;
  int prefetch = 0;
  int tile = 0;
  int tile_elems = 0;
  int rows_per_lane = 0;
  int row_program = 0;
};
cudaError_t LaunchGeluWith(const KernelChoice& k, DType dt, const void* in, void* out, int64_t n,
                           cudaStream_t s);
cudaError_t LaunchSoftmaxWith(const KernelChoice& k, DType dt, const void* in, void* out,
                              int64_t rows, int64_t cols, cudaStream_t s, Workspace ws = {});
// Workspace bytes that softmax's choice `k` uses for this shape (0 if none; aligned 16-byte vectors
// assumed; a launch given less falls back to a plan without it, or fails if `k` forces it).
// SoftmaxWorkspaceBytes(dt, rows, cols) is this with KernelChoice{}.
size_t SoftmaxWorkspaceBytesWith(const KernelChoice& k, DType dt, int64_t rows, int64_t cols);
cudaError_t LaunchRowSumWith(const KernelChoice& k, DType dt, const void* in, float* out,
                             int64_t rows, int64_t cols, cudaStream_t s, Workspace ws = {});
size_t RowSumWorkspaceBytesWith(const KernelChoice& k, DType dt, int64_t rows, int64_t cols);

// Describes what the choice `k` (KernelChoice{}: the automatic one) would launch for a shape, for
// the benchmarks' records and the tests that pin the automatic choice, e.g.
// "softmax/cluster vec c=16 t=512 v=4 smem=229376"; writes at most `len` bytes into `buf`.
void DescribeSoftmax(DType dt, const void* in, const void* out, int64_t rows, int64_t cols,
                     const KernelChoice& k, char* buf, int len, size_t workspace_bytes = 0);
void DescribeRowSum(DType dt, const void* in, int64_t rows, int64_t cols, const KernelChoice& k,
                    char* buf, int len, size_t workspace_bytes = 0);

}  // namespace fusebox::cuda
