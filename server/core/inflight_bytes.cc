// InflightBytes (see inflight_bytes.h): one atomic counter; a reservation is a token whose
// deleter gives its bytes back, so no path can forget to.
#include "server/core/inflight_bytes.h"

#include <atomic>

namespace fusebox {

struct InflightBytes::Counter {
  std::atomic<int64_t> used{0};
};

InflightBytes::InflightBytes(int64_t limit)
    : limit_(limit), counter_(std::make_shared<Counter>()) {}

std::shared_ptr<void> InflightBytes::TryReserve(int64_t bytes) {
  int64_t now = counter_->used.load();
  do {
    // A call alone is always let in (its size has passed the message limits already), and
    // one that holds nothing always is (even while a call alone is past the limit).
    if (bytes > 0 && now > 0 && bytes > limit_ - now) return nullptr;
  } while (!counter_->used.compare_exchange_weak(now, now + bytes));
  return std::shared_ptr<void>(counter_.get(), [c = counter_, bytes](void*) { c->used -= bytes; });
}

int64_t InflightBytes::used() const { return counter_->used.load(); }

}  // namespace fusebox
