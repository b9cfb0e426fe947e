// HostBufferPool (see host_pool.h).
#include "server/exec/host_pool.h"

#include <cstdlib>
#include <utility>

namespace fusebox {
namespace {

size_t SizeClass(size_t bytes) {
  size_t c = kPooledBytes;
  while (c < bytes) c <<= 1;
  return c;
}

}  // namespace

HostBufferPool::Memory HostBufferPool::Malloc() {
  return Memory{[](size_t n) { return static_cast<char*>(std::malloc(n)); },
                [](char* p, size_t) { std::free(p); }};
}

HostBufferPool::HostBufferPool(size_t cap, Memory memory) : cap_(cap), memory_(std::move(memory)) {}

HostBufferPool* HostBufferPool::Create(size_t cap, Memory memory) {
  return new HostBufferPool(cap, std::move(memory));
}

HostBytes HostBufferPool::Get(size_t bytes) {
  const size_t size = SizeClass(bytes);
  char* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(size);
    if (it != kept_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else if (held_ + size > cap_) {  // make room: give back kept buffers of other sizes
      for (auto k = kept_.begin(); k != kept_.end() && held_ + size > cap_; ++k) {
        while (!k->second.empty() && held_ + size > cap_) {
          char* old = k->second.back();
          k->second.pop_back();
          memory_.put(old, k->first);
          sizes_.erase(old);
          held_ -= k->first;
        }
      }
    }
    if (p == nullptr && held_ + size <= cap_) {
      if ((p = memory_.get(size)) != nullptr) {
        sizes_[p] = size;
        held_ += size;
      }
    }
    if (p != nullptr) ++refs_;
  }
  if (p == nullptr) return MallocHostBytes(bytes);
  return HostBytes(p, HostBytesFree{&HostBufferPool::Return, this});
}

void HostBufferPool::Return(void* pool, char* p) { static_cast<HostBufferPool*>(pool)->Put(p); }

void HostBufferPool::Put(char* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[sizes_[p]].push_back(p);
  }
  Unref();
}

void HostBufferPool::Release() { Unref(); }

void HostBufferPool::Unref() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--refs_ > 0) return;
  }
  // The last reference: nothing is out, so every buffer is kept; give them all back.
  for (auto& [size, list] : kept_) {
    for (char* p : list) memory_.put(p, size);
  }
  delete this;
}

}  // namespace fusebox
