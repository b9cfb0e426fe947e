// ConfigureHeap and TrimHeapAbove (see heap.h).
//
// Why: large request and reply buffers come and go with every call, and glibc would mmap each
// one fresh and fault it in page by page, so the server keeps freed memory (M_MMAP_MAX 0, a
// trim threshold). But the threshold binds per arena, glibc makes up to 8 arenas per core, and
// each keeps its own high-water mark: an hour of mixed load raised RSS in steps as arena after
// arena met its peak (bench/baselines/soak-1h-*). Fewer arenas share their free memory, and the
// sweeper's TrimHeapAbove makes --malloc_retain_mib a bound on the whole heap.
#include "server/heap.h"

#include <malloc.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include <unistd.h>

namespace fusebox {

void ConfigureHeap(int64_t retain_bytes, int arenas) {
  if (retain_bytes > 0) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min<int64_t>(retain_bytes, INT_MAX)));
  }
  if (arenas > 0) mallopt(M_ARENA_MAX, arenas);
}

namespace {

int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

}  // namespace

int64_t TrimHeapAbove(int64_t retain_bytes) {
  if (retain_bytes <= 0) return 0;
  const int64_t rss = ResidentBytes();
  if (rss < 0) return 0;
  const struct mallinfo2 m = mallinfo2();
  const int64_t in_use = static_cast<int64_t>(m.uordblks + m.hblkhd);
  if (rss - in_use <= retain_bytes) return 0;
  malloc_trim(0);
  return std::max<int64_t>(0, rss - ResidentBytes());
}

}  // namespace fusebox
