// How fast GatherPieces (kernels/cpu/parallel_copy.h) gathers a 64 MiB request that arrived as
// 1024 gRPC receive slices of 64 KiB, by thread count, two ways: into one 64 MiB buffer at once
// (the CPU backend's gather), and 4 MiB at a time with a position carried between the calls
// (StreamWorker::CopyIn filling 16 staging slots of 4 MiB). Every destination and source page is
// touched before timing; each figure is the median and the best of the repetitions.
// Usage: parallel_gather_bench [reps=30] [threads...=1 2 4]   (notes/rpc-path.md#parallel-gather)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/parallel_copy.h"

namespace {

constexpr size_t kPiece = size_t{64} << 10;
constexpr size_t kPieces = 1024;
constexpr size_t kTotal = kPiece * kPieces;
constexpr size_t kSlot = size_t{4} << 20;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Report(const char* what, int threads, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2], best = ms.front();
  std::printf("%-22s K=%d  median %7.2f ms (%5.1f GB/s)  best %7.2f ms (%5.1f GB/s)\n", what,
              threads, median, kTotal / median / 1e6, best, kTotal / best / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  std::vector<int> threads;
  for (int i = 2; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
  if (threads.empty()) threads = {1, 2, 4};

  // Separate allocations, as gRPC's slices are.
  std::vector<std::unique_ptr<char[]>> storage;
  fusebox::HostPieces pieces;
  for (size_t i = 0; i < kPieces; ++i) {
    storage.emplace_back(new char[kPiece]);
    std::memset(storage.back().get(), static_cast<int>(i), kPiece);
    pieces.push_back({storage.back().get(), kPiece});
  }
  std::unique_ptr<char[]> dst(new char[kTotal]);
  std::memset(dst.get(), 0, kTotal);
  std::printf("64 MiB from %zu pieces of %zu KiB, %d reps, automatic K here = %d\n", kPieces,
              kPiece >> 10, reps, fusebox::CopyThreads(0));

  for (int k : threads) {
    std::vector<double> whole, slots;
    for (int r = 0; r < reps; ++r) {
      double t0 = NowMs();
      if (!fusebox::GatherPieces(pieces, size_t{0}, dst.get(), kTotal, k)) return 1;
      whole.push_back(NowMs() - t0);
      t0 = NowMs();
      fusebox::PiecePos pos;
      for (size_t off = 0; off < kTotal; off += kSlot) {
        // One 4 MiB slot reused over and over, as the staging ring reuses 16 of them.
        if (!fusebox::GatherPieces(pieces, &pos, dst.get() + (off / kSlot % 16) * kSlot,
                                   std::min(kSlot, kTotal - off), k)) {
          return 1;
        }
      }
      slots.push_back(NowMs() - t0);
    }
    if (dst[kTotal - 1] != static_cast<char>(kPieces - 1)) return 1;
    Report("one buffer", k, whole);
    Report("4 MiB slots", k, slots);
  }
  return 0;
}
