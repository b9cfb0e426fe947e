// PinnedPool (see pinned_pool.h).
#include "server/backends/cuda/pinned_pool.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

namespace fusebox::cuda_backend {
namespace {

constexpr size_t kSmallest = size_t{64} << 10;

size_t SizeClass(size_t bytes) {
  size_t c = kSmallest;
  while (c < bytes) c <<= 1;
  return c;
}

}  // namespace

PinnedPool::PinnedPool(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
                       std::function<void(void*)> on_unpin)
    : device_(device), cap_(cap), on_pin_(std::move(on_pin)), on_unpin_(std::move(on_unpin)) {}

PinnedPool* PinnedPool::Create(int device, size_t cap, std::function<void(void*, size_t)> on_pin,
                               std::function<void(void*)> on_unpin) {
  return new PinnedPool(device, cap, std::move(on_pin), std::move(on_unpin));
}

HostBytes PinnedPool::Get(size_t bytes) {
  const size_t size = SizeClass(bytes);
  char* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(size);
    if (it != kept_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else if (pinned_ + size > cap_) {  // make room: unpin kept buffers of other sizes
      for (auto k = kept_.begin(); k != kept_.end() && pinned_ + size > cap_; ++k) {
        while (!k->second.empty() && pinned_ + size > cap_) {
          char* old = k->second.back();
          k->second.pop_back();
          if (on_unpin_) on_unpin_(old);
          cudaSetDevice(device_);
          cudaFreeHost(old);
          cudaGetLastError();
          sizes_.erase(old);
          pinned_ -= k->first;
        }
      }
    }
    if (p == nullptr && pinned_ + size <= cap_) {
      cudaSetDevice(device_);
      void* q = nullptr;
      if (cudaHostAlloc(&q, size, cudaHostAllocPortable) == cudaSuccess) {
        p = static_cast<char*>(q);
        sizes_[p] = size;
        pinned_ += size;
        if (on_pin_) on_pin_(p, size);
      } else {
        cudaGetLastError();
      }
    }
    if (p != nullptr) ++refs_;
  }
  if (p == nullptr) return HostBytes(static_cast<char*>(std::malloc(bytes == 0 ? 1 : bytes)));
  return HostBytes(p, HostBytesFree{&PinnedPool::Return, this});
}

void PinnedPool::Return(void* pool, char* p) { static_cast<PinnedPool*>(pool)->Put(p); }

void PinnedPool::Put(char* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[sizes_[p]].push_back(p);
  }
  Unref();
}

void PinnedPool::Release() { Unref(); }

void PinnedPool::Unref() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--refs_ > 0) return;
  }
  // The last reference: nothing is out, so every buffer is kept; unpin them all.
  cudaSetDevice(device_);
  for (auto& [size, list] : kept_) {
    for (char* p : list) {
      if (on_unpin_) on_unpin_(p);
      cudaFreeHost(p);
    }
  }
  cudaGetLastError();
  delete this;
}

}  // namespace fusebox::cuda_backend
