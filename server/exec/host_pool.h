// Host buffers for what leaves with a reply (inline results, download chunks: HostBytes), kept for
// reuse by power-of-two size from 64 KiB instead of being freed. Getting fresh memory for each
// reply is slow: pinned memory (CUDA) maps and locks every page, and a large malloc'ed block
// (glibc maps one that does not fit a thread's arena, ~64 MiB and up, whatever M_MMAP_MAX says)
// is faulted in page by page, ~16k faults for 64 MiB. At most `cap` bytes are held at once (in
// use and kept together); past that Get falls back to malloc. Buffers may be freed after their
// backend is gone (gRPC sends a reply late): the pool lives until its last buffer returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "server/exec/backend.h"

namespace fusebox {

// The smallest buffer the pool keeps (its first size class); a caller may malloc smaller ones.
constexpr size_t kPooledBytes = size_t{64} << 10;

class HostBufferPool {
 public:
  // Where the pool's buffers come from and go back to: `get` returns a buffer of that many bytes
  // or null (then Get falls back to malloc); `put` takes back what `get` gave.
  struct Memory {
    std::function<char*(size_t)> get;
    std::function<void(char*, size_t)> put;
  };
  // Memory from malloc (what the CPU backend keeps).
  static Memory Malloc();

  static HostBufferPool* Create(size_t cap, Memory memory);
  // `bytes` from the pool, or malloc'ed memory when the cap is reached or `get` fails.
  HostBytes Get(size_t bytes);
  // The backend lets go: the pool frees itself once no buffer is out.
  void Release();

 private:
  HostBufferPool(size_t cap, Memory memory);
  static void Return(void* pool, char* p);
  void Put(char* p);
  void Unref();  // mu_ not held

  const size_t cap_;
  const Memory memory_;
  std::mutex mu_;
  std::map<size_t, std::vector<char*>> kept_;  // guarded by mu_: free buffers by size
  std::map<char*, size_t> sizes_;              // guarded by mu_: every buffer's size
  size_t held_ = 0;                            // guarded by mu_: their total
  int64_t refs_ = 1;                           // guarded by mu_: the backend, and each buffer out
};

}  // namespace fusebox
