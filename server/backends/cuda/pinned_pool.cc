// MakePinnedPool (see pinned_pool.h).
#include "server/backends/cuda/pinned_pool.h"

#include <cuda_runtime.h>

#include <utility>

namespace fusebox::cuda_backend {

HostBufferPool* MakePinnedPool(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
                               std::function<void(void*)> on_unpin) {
  HostBufferPool::Memory m;
  m.get = [device, on_pin = std::move(on_pin)](size_t size) -> char* {
    cudaSetDevice(device);
    void* q = nullptr;
    if (cudaHostAlloc(&q, size, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    if (on_pin) on_pin(q, size);
    return static_cast<char*>(q);
  };
  m.put = [device, on_unpin = std::move(on_unpin)](char* p, size_t) {
    if (on_unpin) on_unpin(p);
    cudaSetDevice(device);
    cudaFreeHost(p);
    cudaGetLastError();
  };
  return HostBufferPool::Create(cap, std::move(m));
}

}  // namespace fusebox::cuda_backend
