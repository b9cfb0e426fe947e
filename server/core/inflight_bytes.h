// InflightBytes: the host memory budget for tensors in flight (--inflight_mib).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace fusebox {

// Host memory held by the inline tensors of calls accepted and not yet answered (their
// requests, and their replies built in place, while queued or running), by the messages of
// transfers under way, and by replies handed to gRPC with their status until their calls end.
// A call that would pass the limit is RESOURCE_EXHAUSTED before its output is allocated, so
// queued calls cannot take more memory than the host has. Thread-safe.
//
// A call alone always fits: its client may send it the moment it has the previous call's
// status, before the server has seen that call end (gRPC runs OnDone later, later still on a
// busy host). So a call's reservation ends as its status is handed to gRPC, and what is left
// then, the serialized reply on its way, is counted apart until the call ends (Sending),
// against a budget of its own, gRPC's buffers (the server sizes it as gRPC's quota: at least
// two of the largest messages). A call is let in when it fits beside the calls under way, or
// none is under way, and the replies on their way are within their budget, or are one reply
// (which may be larger). So clients that do not take their replies keep every call out once
// those fill their budget, until the stall timeout ends them.
class InflightBytes {
 public:
  InflightBytes(int64_t limit, int64_t sending_limit);
  // Reserves `bytes` for a call or transfer under way; the reservation lasts as long as the
  // returned token (null: refused, nothing reserved).
  std::shared_ptr<void> TryReserve(int64_t bytes);
  // Counts `bytes` of a reply handed to gRPC, as long as the returned token; never refused
  // (the bytes exist already).
  std::shared_ptr<void> Sending(int64_t bytes);
  // Why a reservation of `bytes` for `what` ("call", "download", ...) was refused.
  std::string Refusal(int64_t bytes, const char* what) const;
  int64_t used() const;  // under way and on the way out

 private:
  struct Counter;
  const int64_t limit_, sending_limit_;
  const std::shared_ptr<Counter> counter_;  // outlives this while tokens do
};

}  // namespace fusebox
