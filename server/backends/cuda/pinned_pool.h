// Pinned host memory for what leaves with a reply (inline results, download chunks: HostBytes),
// so the device-to-host copy is one DMA straight into the bytes gRPC sends, instead of a DMA into
// staging and a memcpy out of it (a 64 MiB result: ~16 ms of copy_out on an H100 host, of which
// the memcpy is most). Pinning is slow (cudaHostAlloc maps and locks every page), so freed
// buffers are kept for reuse, by power-of-two size from 64 KiB; at most `cap` bytes are pinned
// at once (in use and kept together), and past that AllocateHostBytes falls back to malloc.
// Buffers may be freed after the backend is gone (gRPC sends a reply late): the pool lives until
// its last buffer returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "server/exec/backend.h"

namespace fusebox::cuda_backend {

class PinnedPool {
 public:
  // `on_pin` / `on_unpin` see every buffer pinned and before it is freed (the backend's
  // DirectRanges, which send copies to or from them by one DMA).
  static PinnedPool* Create(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
                            std::function<void(void*)> on_unpin);
  // `bytes` of pinned memory, or malloc'ed memory when the cap is reached or pinning fails.
  HostBytes Get(size_t bytes);
  // The backend lets go: the pool frees itself once no buffer is out.
  void Release();

 private:
  PinnedPool(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
             std::function<void(void*)> on_unpin);
  static void Return(void* pool, char* p);
  void Put(char* p);
  void Unref();  // mu_ not held

  const int device_;
  const size_t cap_;
  const std::function<void(void*, size_t)> on_pin_;
  const std::function<void(void*)> on_unpin_;
  std::mutex mu_;
  std::map<size_t, std::vector<char*>> kept_;  // guarded by mu_: free buffers by size
  std::map<char*, size_t> sizes_;              // guarded by mu_: every pinned buffer's size
  size_t pinned_ = 0;                          // guarded by mu_: their total
  int64_t refs_ = 1;                           // guarded by mu_: the backend, and each buffer out
};

}  // namespace fusebox::cuda_backend
