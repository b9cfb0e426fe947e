// InflightBytes: the host memory budget for tensors in flight (--inflight_mib).
#pragma once

#include <cstdint>
#include <memory>

namespace fusebox {

// Host memory held by the inline tensors of calls accepted and not yet answered (their
// requests, and their replies built in place, while queued or running), and by the messages
// of transfers under way. A call that would pass the limit is RESOURCE_EXHAUSTED before its
// output is allocated, so queued calls cannot take more memory than the host has.
// Thread-safe.
class InflightBytes {
 public:
  explicit InflightBytes(int64_t limit);
  // Reserves `bytes`; the reservation lasts as long as the returned token (null: over the
  // limit, nothing reserved).
  std::shared_ptr<void> TryReserve(int64_t bytes);
  int64_t limit() const { return limit_; }
  int64_t used() const;

 private:
  struct Counter;
  const int64_t limit_;
  const std::shared_ptr<Counter> counter_;  // outlives this while tokens do
};

}  // namespace fusebox
