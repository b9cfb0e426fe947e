// InflightBytes (see inflight_bytes.h): counters under one lock (several move together); a
// reservation is a token whose deleter gives its bytes back, so no path can forget to.
#include "server/core/inflight_bytes.h"

#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace fusebox {

struct InflightBytes::Counter {
  mutable std::mutex mu;
  int64_t working = 0;  // calls and transfers under way
  int64_t sending = 0;  // replies handed to gRPC, until their calls end
  int64_t replies = 0;  // how many those are
  struct Held {
    int64_t working = 0, sending = 0, replies = 0;
  };
  std::unordered_map<std::string, Held> by_tenant;  // tenants holding something
  void Drop(std::unordered_map<std::string, Held>::iterator it) {
    if (it->second.working == 0 && it->second.replies == 0) by_tenant.erase(it);
  }
};

InflightBytes::InflightBytes(int64_t limit, int64_t sending_limit, int64_t tenant_limit)
    : limit_(limit),
      sending_limit_(sending_limit > 0 ? sending_limit : limit),
      tenant_limit_(tenant_limit > 0 && tenant_limit < limit ? tenant_limit : limit),
      tenant_sending_limit_(static_cast<int64_t>(static_cast<double>(sending_limit_) *
                                                 static_cast<double>(tenant_limit_) /
                                                 static_cast<double>(limit))),
      counter_(std::make_shared<Counter>()) {}

InflightBytes::~InflightBytes() = default;

absl::StatusOr<std::shared_ptr<void>> InflightBytes::Reserve(int64_t bytes,
                                                             const std::string& tenant,
                                                             absl::string_view what) {
  Counter& c = *counter_;
  if (bytes <= 0) return std::shared_ptr<void>(&c, [keep = counter_](void*) {});
  {
    std::lock_guard<std::mutex> lock(c.mu);
    const auto it = c.by_tenant.find(tenant);
    const Counter::Held mine = it == c.by_tenant.end() ? Counter::Held{} : it->second;
    // A call alone fits whatever its size: it has passed the message limits already. The
    // tenant's share holds the same rules for its own calls and replies.
    const bool fits = (c.working == 0 || bytes <= limit_ - c.working) &&
                      (c.sending <= sending_limit_ || c.replies <= 1) &&
                      (mine.working == 0 || bytes <= tenant_limit_ - mine.working) &&
                      (mine.sending <= tenant_sending_limit_ || mine.replies <= 1);
    // The reason is read under the same lock as the decision: read later, replies taken in
    // between could make it name a limit that no longer binds (seen under ASan: "holds 0").
    if (!fits) return RefusalLocked(c, tenant, bytes, what);
    c.working += bytes;
    c.by_tenant[tenant].working += bytes;
  }
  return std::shared_ptr<void>(&c, [keep = counter_, bytes, tenant](void*) {
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->working -= bytes;
    const auto it = keep->by_tenant.find(tenant);
    it->second.working -= bytes;
    keep->Drop(it);
  });
}

std::shared_ptr<void> InflightBytes::Sending(int64_t bytes, const std::string& tenant) {
  Counter& c = *counter_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.sending += bytes;
    ++c.replies;
    Counter::Held& mine = c.by_tenant[tenant];
    mine.sending += bytes;
    ++mine.replies;
  }
  return std::shared_ptr<void>(&c, [keep = counter_, bytes, tenant](void*) {
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->sending -= bytes;
    --keep->replies;
    const auto it = keep->by_tenant.find(tenant);
    it->second.sending -= bytes;
    --it->second.replies;
    keep->Drop(it);
  });
}

absl::Status InflightBytes::RefusalLocked(const Counter& c, const std::string& tenant,
                                          int64_t bytes, absl::string_view what) const {
  const auto it = c.by_tenant.find(tenant);
  const Counter::Held mine = it == c.by_tenant.end() ? Counter::Held{} : it->second;
  if (c.sending > sending_limit_ && c.replies > 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "replies their clients have not taken yet hold ", c.sending, " bytes, past the ",
        sending_limit_,
        " the server keeps for them (--inflight_mib, at least twice --max_message_bytes); this ",
        what, " needs ", bytes, "; retry later"));
  }
  if (mine.sending > tenant_sending_limit_ && mine.replies > 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "your replies not taken yet hold ", mine.sending, " bytes, past your share of ",
        tenant_sending_limit_, " of the ", sending_limit_,
        " the server keeps for them (--tenant_inflight_share); take them, or retry once their "
        "calls have ended"));
  }
  if (tenant_limit_ < limit_ && mine.working > 0 && bytes > tenant_limit_ - mine.working) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "you hold ", mine.working, " bytes for calls in flight, and this ", what, " needs ",
        bytes, " more (your share is ", tenant_limit_, " of the server's ", limit_,
        ", --tenant_inflight_share); retry once your calls in flight have ended"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server holds ", c.working, " bytes for calls in flight, and this ", what, " needs ",
      bytes, " more (limit ", limit_, ", --inflight_mib); retry later"));
}

int64_t InflightBytes::used() const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  return counter_->working + counter_->sending;
}

int64_t InflightBytes::used_by(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  const auto it = counter_->by_tenant.find(tenant);
  return it == counter_->by_tenant.end() ? 0 : it->second.working + it->second.sending;
}

}  // namespace fusebox
