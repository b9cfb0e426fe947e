// HostBufferPool (server/exec/host_pool.h): buffers come back for reuse by size class, the cap
// bounds what the pool holds (past it, malloc), and the pool outlives its owner while a buffer
// is out.
#include "server/exec/host_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

namespace fusebox {
namespace {

// Memory from malloc that counts what is out, so a test can see every buffer go back.
struct CountingMemory {
  std::map<char*, size_t> live;
  int gets = 0;
  HostBufferPool::Memory Hooks() {
    return {[this](size_t n) {
              ++gets;
              char* p = static_cast<char*>(std::malloc(n));
              live[p] = n;
              return p;
            },
            [this](char* p, size_t n) {
              EXPECT_EQ(live[p], n);
              live.erase(p);
              std::free(p);
            }};
  }
};

TEST(HostBufferPoolTest, AFreedBufferIsReusedForTheNextOfItsSize) {
  CountingMemory mem;
  HostBufferPool* pool = HostBufferPool::Create(size_t{64} << 20, mem.Hooks());
  char* first;
  {
    HostBytes a = pool->Get((size_t{5} << 20) + 3);
    first = a.get();
    std::memset(a.get(), 1, (size_t{5} << 20) + 3);  // the whole size asked for is there
  }
  HostBytes b = pool->Get(size_t{6} << 20);  // same class (8 MiB)
  EXPECT_EQ(b.get(), first);
  HostBytes c = pool->Get(size_t{6} << 20);  // the first is out: a new one
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(mem.gets, 2);
  b.reset();
  c.reset();
  pool->Release();
  EXPECT_TRUE(mem.live.empty());
}

TEST(HostBufferPoolTest, PastTheCapBuffersComeFromMallocAndKeptOnesOfOtherSizesGoBack) {
  CountingMemory mem;
  HostBufferPool* pool = HostBufferPool::Create(size_t{16} << 20, mem.Hooks());
  {
    HostBytes small = pool->Get(size_t{4} << 20);
    HostBytes big = pool->Get(size_t{8} << 20);
    HostBytes over = pool->Get(size_t{8} << 20);  // 4 + 8 + 8 > 16: malloc'ed
    ASSERT_NE(over.get(), nullptr);
    EXPECT_EQ(mem.gets, 2);
    EXPECT_EQ(mem.live.count(over.get()), 0u);
  }
  // 4 and 8 MiB kept; a 16 MiB buffer needs them both given back first.
  HostBytes whole = pool->Get(size_t{16} << 20);
  EXPECT_EQ(mem.gets, 3);
  EXPECT_EQ(mem.live.size(), 1u);
  EXPECT_EQ(mem.live.count(whole.get()), 1u);
  whole.reset();
  pool->Release();
  EXPECT_TRUE(mem.live.empty());
}

TEST(HostBufferPoolTest, ABufferOutlivesThePoolsOwnerAndIsGivenBackWhenFreed) {
  CountingMemory mem;
  HostBufferPool* pool = HostBufferPool::Create(size_t{1} << 20, mem.Hooks());
  HostBytes late = pool->Get(1000);
  pool->Release();  // the backend is gone; a reply is still being sent
  EXPECT_EQ(mem.live.size(), 1u);
  late.reset();
  EXPECT_TRUE(mem.live.empty());
}

}  // namespace
}  // namespace fusebox
