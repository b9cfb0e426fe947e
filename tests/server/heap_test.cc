// The heap bound (server/heap.h): freed memory kept past --malloc_retain_mib goes back to the OS.
#include "server/heap.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

namespace fusebox {
namespace {

TEST(HeapTest, FreedMemoryIsKeptUnderTheBoundAndGivenBackPastIt) {
  ConfigureHeap(int64_t{1} << 30, 1);  // keep up to 1 GiB, one arena: what main does
  {
    std::vector<std::unique_ptr<char[]>> blocks;
    for (int i = 0; i < 128; ++i) {
      blocks.emplace_back(new char[1 << 20]);
      std::memset(blocks.back().get(), i, 1 << 20);  // resident
    }
  }  // 128 MiB freed, kept by the heap (no mmap, trim threshold 1 GiB)
  EXPECT_EQ(TrimHeapAbove(int64_t{1} << 30), 0) << "under the bound, nothing is given back";
  EXPECT_GE(TrimHeapAbove(int64_t{16} << 20), int64_t{64} << 20)
      << "past the bound, the kept memory goes back to the OS";
  EXPECT_EQ(TrimHeapAbove(0), 0) << "0 leaves glibc's defaults alone";
}

}  // namespace
}  // namespace fusebox
