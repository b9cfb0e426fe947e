// SharedMemoryRegistry and the SIGBUS guard for its mappings (see shared_memory.h).
#include "server/core/shared_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fusebox {
namespace {

// The SIGBUS guard: the address ranges of every system region's mapping, in a fixed table the
// handler can scan without a lock or an allocation. A slot is taken under g_slot_mu and
// published by storing `end` then `begin`; it is cleared (begin first) before the mapping goes.
constexpr int kGuardSlots = 4096;
struct GuardSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<int> faulted{0};
};
GuardSlot g_slots[kGuardSlots];
std::mutex g_slot_mu;
bool g_slot_used[kGuardSlots];  // guarded by g_slot_mu
struct sigaction g_previous_bus;
std::once_flag g_install_once;

void OnSigbus(int sig, siginfo_t* info, void* ucontext) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& s : g_slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= s.end.load(std::memory_order_acquire)) continue;
    // The file under this mapping shrank. Zero pages over the whole of it let the access (and
    // the rest of the call) go on harmlessly; the call sees Faulted() afterwards and fails.
    // mmap is a plain system call here, safe in a handler (Wayland's wl_shm does the same).
    const size_t len = s.end.load(std::memory_order_acquire) - begin;
    void* p = mmap(reinterpret_cast<void*>(begin), len, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      s.faulted.store(1, std::memory_order_release);
      return;
    }
    break;
  }
  // Not one of ours: whatever handled SIGBUS before us (a sanitizer's), or the default action
  // (the access runs again and the process dies of it, as it would have without us).
  if ((g_previous_bus.sa_flags & SA_SIGINFO) != 0 && g_previous_bus.sa_sigaction != nullptr) {
    g_previous_bus.sa_sigaction(sig, info, ucontext);
    return;
  }
  if ((g_previous_bus.sa_flags & SA_SIGINFO) == 0 && g_previous_bus.sa_handler != SIG_DFL &&
      g_previous_bus.sa_handler != SIG_IGN) {
    g_previous_bus.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
}

void InstallSigbusGuard() {
  std::call_once(g_install_once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

int TakeGuardSlot(void* map, size_t len) {
  std::lock_guard<std::mutex> lock(g_slot_mu);
  for (int i = 0; i < kGuardSlots; ++i) {
    if (g_slot_used[i]) continue;
    g_slot_used[i] = true;
    g_slots[i].faulted.store(0);
    g_slots[i].end.store(reinterpret_cast<uintptr_t>(map) + len, std::memory_order_release);
    g_slots[i].begin.store(reinterpret_cast<uintptr_t>(map), std::memory_order_release);
    return i;
  }
  return -1;
}

void ReleaseGuardSlot(int i) {
  std::lock_guard<std::mutex> lock(g_slot_mu);
  g_slots[i].begin.store(0, std::memory_order_release);
  g_slots[i].end.store(0, std::memory_order_release);
  g_slot_used[i] = false;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared-memory region's name must be 1-128 characters; got ",
                     name.size()));
  }
  return absl::OkStatus();
}

// shm_open's names: "/" and 1-254 characters that are not "/", and not "." or "..".
absl::Status CheckKey(const std::string& key) {
  if (key.size() < 2 || key.size() > 255 || key[0] != '/' ||
      key.find('/', 1) != std::string::npos || key == "/." || key == "/.." ||
      key.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system.key '", key.substr(0, 300),
        "' is not a POSIX shared-memory name: '/' followed by 1-254 characters without '/'"));
  }
  return absl::OkStatus();
}

std::string ErrnoText(int e) { return std::strerror(e); }

}  // namespace

SharedRegion::~SharedRegion() {
  pinned_.reset();  // cudaHostUnregister before the pages go
  device_.reset();  // cudaIpcCloseMemHandle
  if (guard_slot_ >= 0) ReleaseGuardSlot(guard_slot_);
  if (map_ != nullptr) munmap(map_, map_len_);
  if (fd_ >= 0) close(fd_);
}

bool SharedRegion::Faulted() const {
  return guard_slot_ >= 0 && g_slots[guard_slot_].faulted.load(std::memory_order_acquire) != 0;
}

SharedMemoryRegistry::SharedMemoryRegistry(Backend* backend, SharedMemoryLimits limits)
    : backend_(backend), limits_(limits) {}

absl::Status SharedMemoryRegistry::Allowed() const {
  if (limits_.enabled) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "shared memory is off on this server: start it with --allow_shared_memory to use it "
      "(clients on the same node only)");
}

absl::Status SharedMemoryRegistry::CheckRoom(const std::string& tenant, const std::string& name,
                                             int64_t size) const {
  if (regions_.count({tenant, name}) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "a shared-memory region named '", name, "' is registered already; unregister it first"));
  }
  int64_t count = 0, bytes = 0;
  for (auto it = regions_.lower_bound({tenant, std::string()});
       it != regions_.end() && it->first.first == tenant; ++it) {
    ++count;
    bytes += it->second->size;
  }
  if (count >= limits_.max_regions_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this caller holds ", count, " shared-memory regions, the most it may "
        "(--max_shm_regions_per_tenant); unregister one first"));
  }
  if (size > limits_.tenant_quota_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "registering ", size, " bytes would pass this caller's shared-memory quota of ",
        limits_.tenant_quota_bytes, " bytes (", bytes,
        " registered; --shm_tenant_quota_mib); unregister a region first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedMemoryRegistry::Insert(
    std::shared_ptr<SharedRegion> r) {
  std::lock_guard<std::mutex> lock(mu_);
  // Checked again: another registration of this tenant may have come in meanwhile.
  if (absl::Status s = CheckRoom(r->tenant, r->name, r->size); !s.ok()) return s;
  r->created_unix_ms = NowUnixMs();
  r->last_used_ns.store(SteadyNowNs());
  regions_[{r->tenant, r->name}] = r;
  return r;
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedMemoryRegistry::RegisterSystem(
    const std::string& tenant, const std::string& name, const std::string& key, int64_t offset,
    int64_t size) {
  if (absl::Status s = Allowed(); !s.ok()) return s;
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (offset < 0 || size <= 0 || offset > INT64_MAX - size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system.offset must be >= 0 and system.size > 0, their sum within 64 bits; got offset ",
        offset, ", size ", size));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckRoom(tenant, name, size); !s.ok()) return s;
  }
  auto r = std::make_shared<SharedRegion>();
  r->name = name;
  r->tenant = tenant;
  r->kind = SharedRegion::Kind::kSystem;
  r->key = key;
  r->offset = offset;
  r->size = size;
  // glibc's shm_open adds O_NOFOLLOW and O_CLOEXEC. An object the server may only read can
  // still hold inputs.
  r->fd_ = shm_open(key.c_str(), O_RDWR, 0);
  if (r->fd_ < 0 && errno == EACCES) {
    r->fd_ = shm_open(key.c_str(), O_RDONLY, 0);
    r->writable = false;
  }
  if (r->fd_ < 0) {
    const int e = errno;
    if (e == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no POSIX shared-memory object '", key, "' on the server's node"));
    }
    if (e == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat("the server may not open shared-memory object '", key, "'"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open shared-memory object '", key, "': ", ErrnoText(e)));
  }
  struct stat st;
  if (fstat(r->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory object '", key, "' is not a regular memory object"));
  }
  if (st.st_size < offset + size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory object '", key, "' is ", st.st_size, " bytes; the region [", offset, ", ",
        offset + size, ") runs past its end"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t start = offset / page * page;
  r->map_len_ = static_cast<size_t>(offset - start + size);
  const int prot = PROT_READ | (r->writable ? PROT_WRITE : 0);
  void* m = mmap(nullptr, r->map_len_, prot, MAP_SHARED, r->fd_, start);
  if (m == MAP_FAILED) {
    const int e = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map shared-memory object '", key, "': ", ErrnoText(e)));
  }
  r->map_ = m;
  r->data_ = static_cast<uint8_t*>(m) + (offset - start);
  InstallSigbusGuard();
  r->guard_slot_ = TakeGuardSlot(r->map_, r->map_len_);
  if (r->guard_slot_ < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this server has ", kGuardSlots, " shared-memory regions mapped, its most; retry later"));
  }
  // Pinning touches every page: the file must still be as long as checked. A truncation in
  // between is the guard's to catch; a region that faulted here is refused.
  auto pinned = backend_->RegisterHostMemory(r->data_, static_cast<size_t>(size));
  if (pinned.ok()) r->pinned_ = *std::move(pinned);  // else unpinned: copies go through staging
  if (r->Faulted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory object '", key, "' shrank while it was being registered"));
  }
  return Insert(std::move(r));
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedMemoryRegistry::RegisterCuda(
    const std::string& tenant, const std::string& name, const std::string& ipc_handle,
    int device, int64_t size) {
  if (absl::Status s = Allowed(); !s.ok()) return s;
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cuda.size must be > 0; got ", size));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckRoom(tenant, name, size); !s.ok()) return s;
  }
  auto buffer = backend_->OpenIpcMemory(ipc_handle, device, static_cast<size_t>(size));
  if (!buffer.ok()) return buffer.status();
  auto r = std::make_shared<SharedRegion>();
  r->name = name;
  r->tenant = tenant;
  r->kind = SharedRegion::Kind::kCuda;
  r->size = size;
  r->device = device;
  r->resident = true;
  r->device_ = *std::move(buffer);
  r->data_ = r->device_->data();
  return Insert(std::move(r));
}

absl::Status SharedMemoryRegistry::Unregister(const std::string& tenant, const std::string& name) {
  if (absl::Status s = Allowed(); !s.ok()) return s;
  std::shared_ptr<SharedRegion> gone;  // unmapped outside the lock (or by the last call)
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find({tenant, name});
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no shared-memory region named '", name, "'"));
  }
  gone = std::move(it->second);
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedMemoryRegistry::Get(const std::string& tenant,
                                                                        const std::string& name) {
  if (absl::Status s = Allowed(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find({tenant, name});
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no shared-memory region named '",
                                            name.substr(0, 128), "'"));
  }
  it->second->last_used_ns.store(SteadyNowNs());
  return it->second;
}

std::vector<std::shared_ptr<SharedRegion>> SharedMemoryRegistry::List(const std::string& tenant) {
  std::vector<std::shared_ptr<SharedRegion>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = regions_.lower_bound({tenant, std::string()});
       it != regions_.end() && it->first.first == tenant; ++it) {
    out.push_back(it->second);
  }
  return out;
}

int SharedMemoryRegistry::ExpireIdle() {
  if (limits_.idle_expiry_seconds <= 0) return 0;
  const int64_t cutoff =
      SteadyNowNs() - static_cast<int64_t>(limits_.idle_expiry_seconds * 1e9);
  std::vector<std::shared_ptr<SharedRegion>> gone;  // unmapped after the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->last_used_ns.load() < cutoff) {
        gone.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(gone.size());
}

int64_t SharedMemoryRegistry::TenantBytes(const std::string& tenant) const {
  int64_t bytes = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = regions_.lower_bound({tenant, std::string()});
       it != regions_.end() && it->first.first == tenant; ++it) {
    bytes += it->second->size;
  }
  return bytes;
}

absl::StatusOr<void*> SharedMemoryRegistry::Span(const SharedRegion& r, int64_t offset,
                                                 int64_t bytes, bool write,
                                                 const std::string& what) {
  if (offset < 0 || bytes < 0 || offset > r.size || bytes > r.size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes, " bytes at offset ", offset, " do not fit in shared-memory region '",
        r.name, "' of ", r.size, " bytes"));
  }
  if (write && !r.writable) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the server may only read shared-memory region '", r.name, "'"));
  }
  if (r.Faulted()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory region '", r.name,
        "' was truncated while the server used it; its contents are lost: unregister it and "
        "register it again"));
  }
  if (r.kind == SharedRegion::Kind::kSystem) {
    struct stat st {};
    if (fstat(r.fd_, &st) != 0 || st.st_size < r.offset + r.size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared-memory region '", r.name, "': its object '", r.key, "' is now ", st.st_size,
          " bytes, shorter than the ", r.offset + r.size,
          " it was registered with (it was truncated); register it again"));
    }
  }
  return static_cast<uint8_t*>(r.data_) + offset;
}

}  // namespace fusebox
