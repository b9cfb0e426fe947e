// InflightBytes: the host memory budget for tensors in flight (--inflight_mib), and each
// tenant's share of it (--tenant_inflight_share).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fusebox {

// Host memory held by the inline tensors of calls accepted and not yet answered (their
// requests, and their replies built in place, while queued or running), and by the messages
// of transfers under way. A call that would pass the limit is RESOURCE_EXHAUSTED before its
// output is allocated, so queued calls cannot take more memory than the host has. A tenant
// may hold at most its share, so one whose client stops taking replies cannot starve the
// others. Thread-safe.
class InflightBytes {
 public:
  // `tenant_limit`: what one tenant may hold; 0 or more than `limit` = `limit`.
  explicit InflightBytes(int64_t limit, int64_t tenant_limit = 0);
  ~InflightBytes();
  // Reserves `bytes` for `tenant`; the reservation lasts as long as the returned token (null:
  // past the server's limit or the tenant's share, nothing reserved). A call alone is always
  // let in (its size has passed the message limits already), and so is a tenant's call while
  // it holds nothing and the server's limit has room (or nothing is held at all).
  std::shared_ptr<void> TryReserve(int64_t bytes, const std::string& tenant = "");
  // Why TryReserve(bytes, tenant) was refused: RESOURCE_EXHAUSTED naming the limit that binds
  // and its flag; `what` names the call ("call", "upload", ...).
  absl::Status Refusal(int64_t bytes, const std::string& tenant, absl::string_view what) const;
  int64_t limit() const { return limit_; }
  int64_t tenant_limit() const { return tenant_limit_; }
  int64_t used() const;
  int64_t used_by(const std::string& tenant) const;

 private:
  struct Counter;
  const int64_t limit_;
  const int64_t tenant_limit_;
  const std::shared_ptr<Counter> counter_;  // outlives this while tokens do
};

}  // namespace fusebox
