// TensorStore: see tensor_store.h.
#include "server/core/tensor_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox {
namespace {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// 128 random bits: handles cannot be guessed from one another.
std::string NewHandle() {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "t%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

}  // namespace

struct TensorStore::Accounts {
  struct Tenant {
    int64_t bytes = 0;
    int64_t tensors = 0;
  };
  std::mutex mu;
  int64_t used = 0;
  int64_t tensors = 0;
  std::map<std::string, Tenant> by_tenant;  // tenants holding a tensor
};

TensorStore::TensorStore(Backend* backend, StoreLimits limits, std::string replica_id)
    : backend_(backend),
      limits_(limits),
      replica_id_(std::move(replica_id)),
      accounts_(std::make_shared<Accounts>()) {}

absl::StatusOr<std::shared_ptr<StoredTensor>> TensorStore::Create(
    const std::string& tenant, DType dtype, const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("shape has a negative dimension ", d));
  }
  const int64_t bytes = ShapeBytes(static_cast<int64_t>(ElementSize(dtype)), shape);
  if (bytes < 0) return absl::InvalidArgumentError("shape has more elements than fit in 64 bits");
  if (bytes > limits_.max_tensor_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a tensor of ", bytes,
                                                     " bytes is over the limit of ",
                                                     limits_.max_tensor_bytes, " per tensor"));
  }
  {
    std::lock_guard<std::mutex> lock(accounts_->mu);
    const auto it = accounts_->by_tenant.find(tenant);
    const Accounts::Tenant mine =
        it == accounts_->by_tenant.end() ? Accounts::Tenant{} : it->second;
    if (mine.bytes + bytes > limits_.tenant_quota_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "your quota is full: you hold ", mine.bytes, " of ", limits_.tenant_quota_bytes,
          " bytes and asked for ", bytes, " more; free tensors first"));
    }
    if (mine.tensors >= limits_.max_tensors_per_tenant) {
      return absl::ResourceExhaustedError(
          absl::StrCat("you hold ", mine.tensors, " tensors, the most one tenant may "
                       "(--max_tensors_per_tenant); free tensors first"));
    }
    if (accounts_->used + bytes > limits_.budget_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server's tensor memory is full (", accounts_->used, " of ",
                       limits_.budget_bytes, " bytes in use; asked for ", bytes, ")"));
    }
    if (accounts_->tensors >= limits_.max_tensors) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server holds ", accounts_->tensors, " tensors, its limit for all tenants "
          "(--max_tensors); retry later or free tensors"));
    }
    Accounts::Tenant& account = accounts_->by_tenant[tenant];
    account.bytes += bytes;
    ++account.tensors;
    accounts_->used += bytes;
    ++accounts_->tensors;
  }
  // From here the reservation is returned whenever the tensor goes away.
  std::weak_ptr<Accounts> weak = accounts_;
  auto reservation = std::shared_ptr<void>(nullptr, [weak, tenant, bytes](void*) {
    if (auto acc = weak.lock()) {
      std::lock_guard<std::mutex> lock(acc->mu);
      acc->used -= bytes;
      --acc->tensors;
      Accounts::Tenant& account = acc->by_tenant[tenant];
      account.bytes -= bytes;
      if (--account.tensors == 0) acc->by_tenant.erase(tenant);
    }
  });
  auto buffer = backend_->Allocate(static_cast<size_t>(bytes));
  if (!buffer.ok()) return buffer.status();
  auto t = std::make_shared<StoredTensor>();
  t->tenant = tenant;
  t->dtype = dtype;
  t->shape = shape;
  t->bytes = bytes;
  t->buffer = std::move(*buffer);
  t->created_unix_ms = UnixMs();
  t->last_used_ns = SteadyNowNs();
  t->reservation = std::move(reservation);
  return t;
}

void TensorStore::Commit(const std::shared_ptr<StoredTensor>& tensor) {
  tensor->handle = replica_id_.empty() ? NewHandle() : absl::StrCat(replica_id_, ".", NewHandle());
  tensor->last_used_ns = SteadyNowNs();
  std::lock_guard<std::mutex> lock(mu_);
  by_handle_[tensor->handle] = tensor;
}

absl::Status TensorStore::NotFound(const std::string& handle) const {
  // Echoed at most in part: a long one would not fit gRPC's metadata limit, and the
  // client would get RESOURCE_EXHAUSTED instead of this.
  constexpr size_t kEcho = 64;
  const std::string echo = handle.size() <= kEcho
                               ? handle
                               : absl::StrCat(handle.substr(0, kEcho), "... (", handle.size(),
                                              " bytes)");
  // A handle minted by another replica reached this one: say which, so that a client
  // without routing, or a proxy that lost track of that replica, is told what went wrong.
  // The text depends on the handle alone, so it tells a tenant nothing of others' tensors.
  const size_t dot = handle.find('.');
  if (dot != std::string::npos && dot > 0 && handle.compare(0, dot, replica_id_) != 0) {
    const std::string owner = echo.substr(0, std::min(dot, echo.size()));
    return absl::NotFoundError(absl::StrCat(
        "no tensor with handle '", echo, "' here: it was made by replica '", owner, "' and ",
        replica_id_.empty() ? std::string("this server has no --replica_id")
                            : absl::StrCat("this is replica '", replica_id_, "'"),
        "; calls naming it must reach that replica (send the header 'fusebox-replica: ", owner,
        "' through a proxy that routes on it); if that replica is gone, so is the tensor"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no tensor with handle '", echo,
      "' (never uploaded, freed, expired, or lost when its replica restarted)"));
}

absl::StatusOr<std::shared_ptr<StoredTensor>> TensorStore::Get(const std::string& tenant,
                                                               const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end() || it->second->tenant != tenant) return NotFound(handle);
  it->second->last_used_ns = SteadyNowNs();
  it->second->unclaimed_until_ns = 0;
  return it->second;
}

absl::StatusOr<int64_t> TensorStore::Free(const std::string& tenant, const std::string& handle) {
  std::shared_ptr<StoredTensor> gone;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end() || it->second->tenant != tenant) return NotFound(handle);
    gone = std::move(it->second);
    by_handle_.erase(it);
  }
  return gone->bytes;
}

std::vector<std::shared_ptr<StoredTensor>> TensorStore::List(const std::string& tenant) {
  std::vector<std::shared_ptr<StoredTensor>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [handle, t] : by_handle_) {
    if (t->tenant == tenant) out.push_back(t);
  }
  return out;
}

int TensorStore::ExpireIdle() {
  const int64_t now = SteadyNowNs();
  const int64_t cutoff = limits_.idle_expiry_seconds > 0
                             ? now - static_cast<int64_t>(limits_.idle_expiry_seconds * 1e9)
                             : std::numeric_limits<int64_t>::min();
  std::vector<std::shared_ptr<StoredTensor>> gone;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_handle_.begin(); it != by_handle_.end();) {
    const int64_t unclaimed_until = it->second->unclaimed_until_ns;
    if (it->second->last_used_ns < cutoff || (unclaimed_until != 0 && unclaimed_until < now)) {
      gone.push_back(std::move(it->second));
      it = by_handle_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(gone.size());
}

int64_t TensorStore::TenantUsedBytes(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(accounts_->mu);
  auto it = accounts_->by_tenant.find(tenant);
  return it == accounts_->by_tenant.end() ? 0 : it->second.bytes;
}

StoreStats TensorStore::stats() const {
  StoreStats s;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [handle, t] : by_handle_) {
    s.bytes += t->bytes;
    ++s.count;
  }
  return s;
}

}  // namespace fusebox
