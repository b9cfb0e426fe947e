// Pinned host memory for what leaves with a reply (inline results, download chunks: HostBytes),
// so the device-to-host copy is one DMA straight into the bytes gRPC sends, instead of a DMA into
// staging and a memcpy out of it (a 64 MiB result: ~16 ms of copy_out on an H100 host, of which
// the memcpy is most). Pinning is slow (cudaHostAlloc maps and locks every page), so freed
// buffers are kept for reuse (server/exec/host_pool.h); at most `cap` bytes are pinned at once,
// and past that AllocateHostBytes falls back to malloc.
#pragma once

#include <cstddef>
#include <functional>

#include "server/exec/host_pool.h"

namespace fusebox::cuda_backend {

// A pool of memory pinned with cudaHostAlloc on `device`. `on_pin` / `on_unpin` see every buffer
// pinned and before it is freed (the backend's DirectRanges, which send copies to or from them
// by one DMA).
HostBufferPool* MakePinnedPool(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
                               std::function<void(void*)> on_unpin);

}  // namespace fusebox::cuda_backend
