// Matmul tuning hooks, for tests, benchmarks and lab probes only (the CUDA backend uses matmul.h
// alone; CMake target fusebox_matmul_cuda_tuning carries this header):
//  - the tiled kernels with their variant forced (mma.sync where the automatic choice would take
//    wgmma), so that both are tested and timed on the same shapes;
//  - what a cuBLASLt runner chose for a key and how (LtAlgoInfo), and what it counted (LtStats):
//    tests check the policies by them, benchmarks record them beside each timing.
// They are defined beside the code they force or read (matmul_tiled.cu, matmul_cublaslt.cc): the
// forced variant is the automatic launcher with one decision replaced, and a runner's choice is
// private state of the runner.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/matmul.h"

namespace fusebox::cuda {

// The tiled kernels: kAuto is LaunchMatmulReluTiled's choice (wgmma where it applies, else
// mma.sync); kMmaSync forces mma.sync everywhere.
enum class TiledKernel { kAuto, kMmaSync };
cudaError_t LaunchMatmulReluTiledWith(TiledKernel which, const MatmulArgs& args,
                                      cudaStream_t stream);

// The two workspace sizes the comparisons name: the runner's default and PyTorch 2.11's.
constexpr size_t kLtLargeWorkspaceBytes = CublasLtMatmul::kDefaultWorkspaceBytes;
constexpr size_t kLtTorchWorkspaceBytes = CublasLtMatmul::kSecondPickWorkspaceBytes;

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

// The algorithm a runner uses for a key and how it got there.
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

// The policy a runner was created with, and its counters so far.
LtAlgoPolicy PolicyOf(const CublasLtMatmul& lt);
LtStats StatsOf(const CublasLtMatmul& lt);

// The algorithm lt.Run would use for these arguments (chosen now, as Prepare
// does, if not cached), with how it was chosen: cuBLASLt's algorithm id,
// tile, stages, split-K, reduction scheme, swizzle, custom option, inner and
// cluster shape ids, the workspace it needs, a hash of the opaque algorithm
// (equal hashes: the same kernel and configuration), then the policy's
// record ("choice ... picks LARGE/SMALL timed_ms L/S launch_ws W").
// DescribeAlgo: that record's text alone.
absl::StatusOr<LtAlgoInfo> AlgoInfoOf(CublasLtMatmul& lt, const MatmulArgs& args,
                                      cudaStream_t stream);
absl::StatusOr<std::string> DescribeAlgo(CublasLtMatmul& lt, const MatmulArgs& args,
                                         cudaStream_t stream);

}  // namespace fusebox::cuda
