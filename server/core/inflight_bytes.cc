// InflightBytes (see inflight_bytes.h): one counter for the server and one per tenant under a
// lock; a reservation is a token whose deleter gives its bytes back, so no path can forget to.
#include "server/core/inflight_bytes.h"

#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace fusebox {

struct InflightBytes::Counter {
  mutable std::mutex mu;
  int64_t used = 0;
  std::unordered_map<std::string, int64_t> by_tenant;  // tenants holding something
};

InflightBytes::InflightBytes(int64_t limit, int64_t tenant_limit)
    : limit_(limit),
      tenant_limit_(tenant_limit > 0 && tenant_limit < limit ? tenant_limit : limit),
      counter_(std::make_shared<Counter>()) {}

InflightBytes::~InflightBytes() = default;

std::shared_ptr<void> InflightBytes::TryReserve(int64_t bytes, const std::string& tenant) {
  {
    std::lock_guard<std::mutex> lock(counter_->mu);
    const auto it = counter_->by_tenant.find(tenant);
    const int64_t mine = it == counter_->by_tenant.end() ? 0 : it->second;
    const int64_t used = counter_->used;
    if (bytes > 0 && used > 0 && bytes > limit_ - used) return nullptr;
    if (bytes > 0 && mine > 0 && bytes > tenant_limit_ - mine) return nullptr;
    counter_->used += bytes;
    if (bytes > 0) counter_->by_tenant[tenant] += bytes;
  }
  return std::shared_ptr<void>(counter_.get(), [c = counter_, bytes, tenant](void*) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(c->mu);
    c->used -= bytes;
    const auto it = c->by_tenant.find(tenant);
    if ((it->second -= bytes) == 0) c->by_tenant.erase(it);
  });
}

absl::Status InflightBytes::Refusal(int64_t bytes, const std::string& tenant,
                                    absl::string_view what) const {
  const int64_t mine = used_by(tenant);
  if (tenant_limit_ < limit_ && mine > 0 && bytes > tenant_limit_ - mine) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "you hold ", mine, " bytes for calls in flight, and this ", what, " needs ", bytes,
        " more (your share is ", tenant_limit_, " of the server's ", limit_,
        ", --tenant_inflight_share); retry once your calls in flight have ended"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server holds ", used(), " bytes for calls in flight, and this ", what, " needs ",
      bytes, " more (limit ", limit_, ", --inflight_mib); retry later"));
}

int64_t InflightBytes::used() const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  return counter_->used;
}

int64_t InflightBytes::used_by(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  const auto it = counter_->by_tenant.find(tenant);
  return it == counter_->by_tenant.end() ? 0 : it->second;
}

}  // namespace fusebox
