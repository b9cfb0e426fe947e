// Shared-memory regions registered by clients on the server's node (RegisterSharedMemory):
// POSIX shared memory mapped into the server, or CUDA memory another process exported with an
// IPC handle, opened by the backend. Ops then read their inputs from, and write their outputs
// into, a region instead of carrying the bytes in messages.
//
// Ownership follows TensorStore: a region belongs to the tenant that registered it, under a
// name that tenant chose; other tenants get the same NOT_FOUND as for a name never registered.
// A region is shared_ptr-owned: Unregister or idle expiry removes the name at once, and the
// mapping (and the backend's pinning or IPC mapping) goes when the last call using it ends.
// Per-tenant limits on the regions held and their bytes, and an idle expiry, bound what a
// client that disappears leaves mapped.
//
// Truncation. A client may shrink the file under a mapping; touching a page past its new end
// raises SIGBUS, which would kill the server. Two defences: every use checks the file's size
// now (fstat), so the common case is a clear FAILED_PRECONDITION before anything is touched;
// and a truncation during a call (after the check) is caught by a SIGBUS handler that maps
// zero pages over the whole region (as Wayland compositors do for client pools), marks it
// faulted, and lets the faulting access continue. The call then fails with FAILED_PRECONDITION
// (Faulted()), and so does every later use of the region until it is registered again. No copy
// under a guard: the kernels read and write the mapping in place, so the zero-copy path costs
// one fstat per region per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/exec/backend.h"

namespace fusebox {

struct SharedMemoryLimits {
  bool enabled = false;                            // --allow_shared_memory
  int64_t max_regions_per_tenant = 64;             // regions one tenant holds at once
  int64_t tenant_quota_bytes = int64_t{64} << 30;  // bytes one tenant may register
  double idle_expiry_seconds = 600;                // unused this long: unregistered; 0 = never
};

struct SharedRegion {
  enum class Kind { kSystem, kCuda };
  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();  // unpins, closes the IPC mapping, unmaps, closes the file

  std::string name, tenant;
  Kind kind = Kind::kSystem;
  std::string key;        // kSystem: the shm_open name
  int64_t offset = 0;     // kSystem: where the region starts in the file
  int64_t size = 0;       // bytes of the region
  int device = 0;         // kCuda: the exporter's device ordinal
  bool writable = true;   // kSystem: opened read-write (read-only objects may still be inputs)
  bool resident = false;  // data() is the backend's memory (kCuda), not host memory
  void* data() const { return data_; }
  bool pinned() const { return pinned_ != nullptr; }
  int64_t created_unix_ms = 0;
  std::atomic<int64_t> last_used_ns{0};  // steady clock
  // Whether a SIGBUS hit the mapping (the file was truncated under it): its contents are lost.
  bool Faulted() const;

 private:
  friend class SharedMemoryRegistry;
  int fd_ = -1;
  void* map_ = nullptr;  // the mapping (page aligned) and its length
  size_t map_len_ = 0;
  int guard_slot_ = -1;  // its entry in the SIGBUS guard's table
  void* data_ = nullptr;
  std::shared_ptr<void> pinned_;    // the backend's RegisterHostMemory token; dropped first
  std::unique_ptr<Buffer> device_;  // kCuda: the opened IPC memory
};

class SharedMemoryRegistry {
 public:
  // `backend` pins system memory and opens IPC handles; it must outlive the registry.
  SharedMemoryRegistry(Backend* backend, SharedMemoryLimits limits);

  // FAILED_PRECONDITION naming --allow_shared_memory when the server does not allow it.
  absl::Status Allowed() const;
  // Maps [offset, offset + size) of the POSIX shared-memory object `key`.
  absl::StatusOr<std::shared_ptr<SharedRegion>> RegisterSystem(const std::string& tenant,
                                                               const std::string& name,
                                                               const std::string& key,
                                                               int64_t offset, int64_t size);
  // Opens `size` bytes of device memory exported by another process.
  absl::StatusOr<std::shared_ptr<SharedRegion>> RegisterCuda(const std::string& tenant,
                                                             const std::string& name,
                                                             const std::string& ipc_handle,
                                                             int device, int64_t size);
  // Removes the name; calls using the region keep it until they end. NOT_FOUND if absent.
  absl::Status Unregister(const std::string& tenant, const std::string& name);
  // The tenant's region of this name, marked used; NOT_FOUND otherwise.
  absl::StatusOr<std::shared_ptr<SharedRegion>> Get(const std::string& tenant,
                                                    const std::string& name);
  std::vector<std::shared_ptr<SharedRegion>> List(const std::string& tenant);
  // Unregisters regions unused for longer than the idle expiry; returns how many.
  int ExpireIdle();

  // [offset, offset + bytes) of the region, checked: within the region (overflow-safe;
  // INVALID_ARGUMENT naming `what`), writable if `write`, its file still as long as registered
  // and never truncated under a call (FAILED_PRECONDITION). A pointer into the region.
  static absl::StatusOr<void*> Span(const SharedRegion& r, int64_t offset, int64_t bytes,
                                    bool write, const std::string& what);

  int64_t TenantBytes(const std::string& tenant) const;
  const SharedMemoryLimits& limits() const { return limits_; }

 private:
  // Checks the name, the tenant's count and bytes; the caller holds mu_.
  absl::Status CheckRoom(const std::string& tenant, const std::string& name, int64_t size) const;
  absl::StatusOr<std::shared_ptr<SharedRegion>> Insert(std::shared_ptr<SharedRegion> r);

  Backend* const backend_;
  const SharedMemoryLimits limits_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<SharedRegion>> regions_;
};

}  // namespace fusebox
