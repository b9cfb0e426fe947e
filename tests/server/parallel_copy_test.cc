// ParallelCopy and GatherPieces: every byte of the asked range lands where it belongs, and none
// outside it, whatever the piece layout, offset, length and thread count; a short piece list
// copies nothing; callers on many threads sharing the helper pool each get their own bytes.
#include "kernels/cpu/parallel_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fusebox {
namespace {

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

// Pieces over random bytes: `layout` gives each piece's size (0 = an empty piece).
struct Layout {
  std::vector<std::vector<uint8_t>> storage;
  HostPieces pieces;
  std::string bytes;  // the pieces' bytes in order

  Layout(const std::vector<size_t>& sizes, std::mt19937_64& rng) {
    storage.reserve(sizes.size());
    for (size_t n : sizes) {
      storage.emplace_back(n);
      for (uint8_t& b : storage.back()) b = static_cast<uint8_t>(rng());
      // An empty piece may point anywhere (gRPC's empty slices do); null is the worst case.
      pieces.push_back({n == 0 ? nullptr : storage.back().data(), n});
      bytes.append(reinterpret_cast<const char*>(storage.back().data()), n);
    }
  }
};

// Sizes of 1 byte .. 200 KiB, about one in eight empty, until they hold at least `total` bytes.
std::vector<size_t> RandomSizes(std::mt19937_64& rng, size_t total) {
  std::vector<size_t> sizes;
  size_t sum = 0;
  while (sum < total) {
    size_t n = 0;
    if (rng() % 8 != 0) {
      // Mostly small or mostly large, so both many tiny pieces and few big ones occur.
      n = rng() % 3 == 0 ? 1 + rng() % 64 : 1 + rng() % (200 << 10);
    }
    sizes.push_back(n);
    sum += n;
  }
  return sizes;
}

// A destination of n bytes between guards, all kGuard to begin with.
struct Dest {
  std::vector<uint8_t> mem;
  explicit Dest(size_t n) : mem(n + 2 * kGuardBytes, kGuard) {}
  uint8_t* data() { return mem.data() + kGuardBytes; }
  bool GuardsIntact(size_t n) const {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (mem[i] != kGuard || mem[kGuardBytes + n + i] != kGuard) return false;
    }
    return true;
  }
  bool Untouched() const {
    return std::all_of(mem.begin(), mem.end(), [](uint8_t b) { return b == kGuard; });
  }
};

void ExpectRange(const Layout& l, size_t offset, size_t n, int threads) {
  SCOPED_TRACE(testing::Message() << "offset " << offset << " n " << n << " threads " << threads
                                  << " of " << l.bytes.size() << " bytes in "
                                  << l.pieces.size() << " pieces");
  Dest d(n);
  ASSERT_TRUE(GatherPieces(l.pieces, offset, d.data(), n, threads));
  EXPECT_EQ(0, std::memcmp(d.data(), l.bytes.data() + offset, n));
  EXPECT_TRUE(d.GuardsIntact(n));
}

class GatherByThreads : public testing::TestWithParam<int> {};

TEST_P(GatherByThreads, CopiesRandomRangesOfRandomPieceLayouts) {
  std::mt19937_64 rng(1000 + GetParam());
  for (int layout = 0; layout < 6; ++layout) {
    Layout l(RandomSizes(rng, (size_t{1} << 20) * (1 + rng() % 10)), rng);
    const size_t total = l.bytes.size();
    // The whole, from the start to a byte in the middle, from the middle to the end, and
    // random ranges (offsets inside pieces, lengths a multiple of nothing).
    ExpectRange(l, 0, total, GetParam());
    ExpectRange(l, 0, total - 1 - rng() % (total / 2), GetParam());
    const size_t mid = 1 + rng() % (total - 1);
    ExpectRange(l, mid, total - mid, GetParam());
    for (int i = 0; i < 12; ++i) {
      const size_t offset = rng() % total;
      ExpectRange(l, offset, rng() % (total - offset + 1), GetParam());
    }
  }
}

TEST_P(GatherByThreads, SuccessivePositionsReadThePiecesInOrder) {
  // As StreamWorker::CopyIn fills its staging slots: fixed steps and a short last one.
  std::mt19937_64 rng(2000 + GetParam());
  Layout l(RandomSizes(rng, 9 << 20), rng);
  for (size_t step : {size_t{4} << 20, (size_t{2} << 20) + 7, size_t{100003}}) {
    PiecePos pos;
    std::vector<uint8_t> out(l.bytes.size());
    for (size_t off = 0; off < out.size(); off += step) {
      const size_t n = std::min(step, out.size() - off);
      ASSERT_TRUE(GatherPieces(l.pieces, &pos, out.data() + off, n, GetParam()));
    }
    EXPECT_EQ(0, std::memcmp(out.data(), l.bytes.data(), out.size())) << "step " << step;
    EXPECT_EQ(pos.piece, l.pieces.size());  // every piece consumed, trailing empty ones too
  }
}

TEST_P(GatherByThreads, FewerBytesThanAskedFailsAndCopiesNothing) {
  std::mt19937_64 rng(3000 + GetParam());
  Layout l(RandomSizes(rng, 5 << 20), rng);
  const size_t total = l.bytes.size();
  for (size_t offset : {size_t{0}, size_t{12345}, total - 1, total}) {
    for (size_t past : {size_t{1}, size_t{3} << 20}) {
      const size_t n = total - offset + past;
      Dest d(n);
      EXPECT_FALSE(GatherPieces(l.pieces, offset, d.data(), n, GetParam()));
      EXPECT_TRUE(d.Untouched()) << "offset " << offset << " n " << n;
    }
  }
  PiecePos pos{1, 0};  // a position left where it was
  Dest d(total);
  EXPECT_FALSE(GatherPieces(l.pieces, &pos, d.data(), total - l.pieces[0].bytes + 1, GetParam()));
  EXPECT_EQ(pos.piece, 1u);
  EXPECT_EQ(pos.offset, 0u);
  EXPECT_TRUE(d.Untouched());
  EXPECT_FALSE(GatherPieces(l.pieces, total + 1, d.data(), 0, GetParam()));  // offset past the end
}

TEST_P(GatherByThreads, ContiguousCopiesOfAnyLength) {
  std::mt19937_64 rng(4000 + GetParam());
  std::vector<uint8_t> src((size_t{9} << 20) + 77);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, kCopyPartBytes, 2 * kCopyPartBytes - 1,
                   2 * kCopyPartBytes, 2 * kCopyPartBytes + 1, (size_t{4} << 20) + 13,
                   src.size() - 5}) {
    const size_t at = 5 * (n % 2);  // an odd source address now and then
    Dest d(n);
    ParallelCopy(d.data(), src.data() + at, n, GetParam());
    EXPECT_EQ(0, std::memcmp(d.data(), src.data() + at, n)) << "n " << n;
    EXPECT_TRUE(d.GuardsIntact(n)) << "n " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GatherByThreads, testing::Values(1, 2, 4, 8),
                         [](const testing::TestParamInfo<int>& i) {
                           return "K" + std::to_string(i.param);
                         });

// Below two parts' worth a copy runs on the caller's thread; it must still be exact across
// pieces, empty ones included.
TEST(GatherPieces, SmallCopiesAcrossTinyAndEmptyPieces) {
  std::mt19937_64 rng(5);
  Layout l({0, 1, 0, 0, 7, 1, 0, 64, 3, 0}, rng);
  const size_t total = l.bytes.size();
  for (size_t offset = 0; offset <= total; ++offset) {
    for (size_t n = 0; offset + n <= total; ++n) ExpectRange(l, offset, n, 8);
  }
  HostPieces none;
  Dest d(0);
  EXPECT_TRUE(GatherPieces(none, size_t{0}, d.data(), 0, 4));
  EXPECT_FALSE(GatherPieces(none, size_t{0}, d.data(), 1, 4));
}

TEST(CopyThreads, AutomaticIsOneToFourAndExplicitIsCapped) {
  const int automatic = CopyThreads(0);
  EXPECT_GE(automatic, 1);
  EXPECT_LE(automatic, 4);
  EXPECT_EQ(CopyThreads(1), 1);
  EXPECT_EQ(CopyThreads(3), 3);
  EXPECT_EQ(CopyThreads(1000), kMaxCopyThreads);
}

// Many callers at once share the pool's helpers (more callers than helpers, so parts queue
// behind other callers' and callers take over their own): each still gets its own bytes.
TEST(GatherPieces, ConcurrentCallersSharingThePoolEachGetTheirOwnBytes) {
  constexpr int kCallers = 12;
  std::vector<Layout> layouts;
  layouts.reserve(kCallers);
  std::mt19937_64 rng(6);
  for (int c = 0; c < kCallers; ++c) layouts.emplace_back(RandomSizes(rng, 3 << 20), rng);
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      const Layout& l = layouts[c];
      std::mt19937_64 r(100 + c);
      std::vector<uint8_t> out(l.bytes.size());
      for (int i = 0; i < 25; ++i) {
        const int threads = 1 + static_cast<int>(r() % 8);
        const size_t offset = r() % (1 << 20);
        const size_t n = l.bytes.size() - offset - r() % 1000;
        std::fill(out.begin(), out.end(), 0);
        if (!GatherPieces(l.pieces, offset, out.data(), n, threads) ||
            std::memcmp(out.data(), l.bytes.data() + offset, n) != 0) {
          ++failures[c];
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
}

}  // namespace
}  // namespace fusebox
