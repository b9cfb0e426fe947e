// InflightBytes: the host memory budget for tensors in flight (--inflight_mib), each tenant's
// share of it (--tenant_inflight_share), and the replies on their way out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox {

// Host memory held by the inline tensors of calls accepted and not yet answered (their
// requests, and their replies built in place, while queued or running), by the messages of
// transfers under way, and by replies handed to gRPC with their status until their calls end.
// A call that would pass the limit is RESOURCE_EXHAUSTED before its output is allocated, so
// queued calls cannot take more memory than the host has. A tenant may hold at most its share,
// so one whose client stops taking replies cannot starve the others. Thread-safe.
//
// A call alone always fits: its client may send it the moment it has the previous call's
// status, before the server has seen that call end (gRPC runs OnDone later, later still on a
// busy host). So a call's reservation ends as its status is handed to gRPC, and what is left
// then, the serialized reply on its way, is counted apart until the call ends (Sending),
// against a budget of its own, gRPC's buffers (the server sizes it as gRPC's quota: at least
// two of the largest messages). A call is let in when it fits beside the calls under way (and
// beside its tenant's), or none is under way (or none of its tenant's, while the server has
// room), and the replies on their way are within their budget, or are one reply (which may be
// larger), and so are the tenant's within its share of that budget (the same part of it as of
// the limit). So a client that does not take its
// replies keeps its tenant's calls out once they fill its share, and every call once they
// fill the server's budget, until the stall timeout ends them.
class InflightBytes {
 public:
  // `sending_limit`: the budget of replies on their way; 0 = `limit`. `tenant_limit`: what one
  // tenant may hold under way; 0 or more than `limit` = `limit`.
  InflightBytes(int64_t limit, int64_t sending_limit = 0, int64_t tenant_limit = 0);
  ~InflightBytes();
  // Reserves `bytes` for `tenant`'s call or transfer under way; the reservation lasts as long
  // as the returned token. Refused: RESOURCE_EXHAUSTED naming the limit that binds and its
  // flag (`what` names the call: "call", "upload", ...), nothing reserved.
  absl::StatusOr<std::shared_ptr<void>> Reserve(int64_t bytes, const std::string& tenant,
                                                absl::string_view what);
  // Counts `bytes` of `tenant`'s reply handed to gRPC, as long as the returned token; never
  // refused (the bytes exist already).
  std::shared_ptr<void> Sending(int64_t bytes, const std::string& tenant = "");
  int64_t limit() const { return limit_; }
  int64_t tenant_limit() const { return tenant_limit_; }
  int64_t used() const;  // under way and on the way out
  int64_t used_by(const std::string& tenant) const;  // under way and on the way out

 private:
  struct Counter;
  // Why `tenant`'s reservation of `bytes` was refused; called with c's lock held, under which
  // the refusal was decided.
  absl::Status RefusalLocked(const Counter& c, const std::string& tenant, int64_t bytes,
                             absl::string_view what) const;
  const int64_t limit_, sending_limit_, tenant_limit_;
  const int64_t tenant_sending_limit_;  // the tenant's share of sending_limit_
  const std::shared_ptr<Counter> counter_;  // outlives this while tokens do
};

}  // namespace fusebox
