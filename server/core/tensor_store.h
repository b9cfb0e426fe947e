// Tensors held by the server, by handle, for their owners. Memory comes from
// the backend (GPU memory on CUDA) under a server-wide budget and a per-tenant
// quota, both reserved before any byte is copied, so a full store refuses new
// tensors (RESOURCE_EXHAUSTED) and never drops one it holds. A tensor is
// shared_ptr-owned: Free or expiry removes the handle at once, and the memory
// returns when the last call reading it finishes. Other tenants' tensors are
// indistinguishable from handles that never existed (same NOT_FOUND).
// With a replica id, every handle starts "<replica id>." so that a proxy or a
// client in front of several replicas can send the calls naming it to the one
// replica that holds it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/exec/backend.h"

namespace fusebox {

struct StoreLimits {
  int64_t budget_bytes = int64_t{8} << 30;        // all tenants together
  int64_t tenant_quota_bytes = int64_t{8} << 30;  // each tenant
  int64_t max_tensor_bytes = int64_t{8} << 30;    // one tensor
  double idle_expiry_seconds = 3600;              // unused this long: freed; 0 = never
  // Tensors at once, all tenants, uncommitted ones included: each also costs 0.6-1.5 KB of
  // host memory, which its bytes (0 for an empty one) do not count.
  int64_t max_tensors = 1000000;
  // Tensors at once, one tenant's: so one cannot take every place in the table (empty
  // tensors cost no quota).
  int64_t max_tensors_per_tenant = 1000000;
};

struct StoredTensor {
  std::string handle;  // empty until committed
  std::string tenant;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  // Declared before `buffer` so the memory is freed before the budget returns.
  std::shared_ptr<void> reservation;  // returns budget and quota when dropped
  std::unique_ptr<Buffer> buffer;
  int64_t created_unix_ms = 0;
  std::atomic<int64_t> last_used_ns{0};  // steady clock
  // A handle that may never have reached its caller (a kept output whose reply left just
  // before its call's deadline): freed at this time (steady clock) unless a call names it
  // first (Get). 0: claimed, or never in doubt.
  std::atomic<int64_t> unclaimed_until_ns{0};
};

struct StoreStats {
  int64_t bytes = 0;
  int64_t count = 0;
};

class TensorStore {
 public:
  // replica_id: letters, digits, '-' and '_' only (CheckOptions sees to it); empty = bare
  // handles.
  TensorStore(Backend* backend, StoreLimits limits, std::string replica_id = {});

  // Reserves budget and quota and allocates memory for a tensor that is not
  // yet visible: Commit makes it so. Dropping it uncommitted frees everything.
  absl::StatusOr<std::shared_ptr<StoredTensor>> Create(const std::string& tenant, DType dtype,
                                                       const std::vector<int64_t>& shape);
  // Gives the tensor a fresh handle and makes it visible to its tenant.
  void Commit(const std::shared_ptr<StoredTensor>& tensor);
  // The tenant's tensor with this handle, marked used (and claimed); else NOT_FOUND.
  absl::StatusOr<std::shared_ptr<StoredTensor>> Get(const std::string& tenant,
                                                    const std::string& handle);
  // Removes the handle; returns the tensor's size.
  absl::StatusOr<int64_t> Free(const std::string& tenant, const std::string& handle);
  std::vector<std::shared_ptr<StoredTensor>> List(const std::string& tenant);
  // Frees tensors idle for longer than the limit, and unclaimed ones past their time; returns
  // how many.
  int ExpireIdle();

  int64_t TenantUsedBytes(const std::string& tenant) const;
  const StoreLimits& limits() const { return limits_; }
  const std::string& replica_id() const { return replica_id_; }
  StoreStats stats() const;  // committed tensors

 private:
  struct Accounts;  // budget and quota counters, shared with reservations
  absl::Status NotFound(const std::string& handle) const;

  Backend* const backend_;
  const StoreLimits limits_;
  const std::string replica_id_;
  std::shared_ptr<Accounts> accounts_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<StoredTensor>> by_handle_;
};

}  // namespace fusebox
