// Connections: see connections.h.
#include "server/rpc/connections.h"

#include <arpa/inet.h>
#include <grpc/support/sync.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>
#include <linux/tcp.h>  // tcp_info with tcpi_bytes_received (glibc's netinet/tcp.h lacks it)
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>

#include "server/exec/backend.h"

namespace fusebox {
namespace {

// gRPC's socket mutator, as libgrpc 1.51 lays it out (src/core/lib/iomgr/socket_mutator.h, not
// installed): the vtable pointer and a reference count, then ours. gRPC calls mutate_fd_2 for
// every socket of a server with it in its channel arguments: the listener (usage 1) and each
// accepted connection (usage 2); a false return stops the listener, so it always returns true.
struct MutateInfo {
  int fd;
  int usage;
};
constexpr int kListenerUsage = 1;
constexpr int kServerConnectionUsage = 2;

struct Mutator;
struct MutatorVtable {
  bool (*mutate_fd)(int fd, Mutator* m);
  int (*compare)(Mutator* a, Mutator* b);
  void (*destroy)(Mutator* m);
  bool (*mutate_fd_2)(const MutateInfo* info, Mutator* m);
};
struct Mutator {
  const MutatorVtable* vtable;
  gpr_refcount refcount;
  Connections* connections;
};

bool MutateFd(int, Mutator*) { return true; }  // client sockets: none in a server
int Compare(Mutator* a, Mutator* b) { return a < b ? -1 : a > b ? 1 : 0; }
void Destroy(Mutator* m) { delete m; }
bool MutateFd2(const MutateInfo* info, Mutator* m) {
  if (info->usage == kServerConnectionUsage) m->connections->Accepted(info->fd);
  if (info->usage == kListenerUsage) m->connections->Listening(info->fd);
  return true;
}
constexpr MutatorVtable kVtable = {MutateFd, Compare, Destroy, MutateFd2};

class MutatorOption final : public grpc::ServerBuilderOption {
 public:
  explicit MutatorOption(Connections* c) : c_(c) {}
  void UpdateArguments(grpc::ChannelArguments* args) override {
    auto* m = new Mutator{&kVtable, {}, c_};
    gpr_ref_init(&m->refcount, 1);  // the arguments' reference; gRPC takes its own
    args->SetSocketMutator(reinterpret_cast<grpc_socket_mutator*>(m));
  }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*) override {}

 private:
  Connections* const c_;
};

// A peer address in one form for both sides: gRPC's ("ipv4:1.2.3.4:5", "ipv6:[::1]:5",
// "unix:...") and the socket's. IPv4 mapped into IPv6 reads as IPv4; Unix sockets all read
// "unix".
std::string KeyOf(const sockaddr_storage& a) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(in.sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], ip, sizeof ip);
      return std::string(ip) + ":" + std::to_string(ntohs(in6.sin6_port));
    }
    inet_ntop(AF_INET6, &in6.sin6_addr, ip, sizeof ip);
    return "[" + std::string(ip) + "]:" + std::to_string(ntohs(in6.sin6_port));
  }
  return "unix";
}

std::string KeyOfPeer(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) == 0) return peer.substr(5);
  if (peer.rfind("ipv6:", 0) == 0) {
    std::string rest = peer.substr(5);  // [addr]:port
    const size_t close = rest.find(']');
    if (rest.empty() || rest[0] != '[' || close == std::string::npos) return rest;
    sockaddr_storage a = {};
    auto& in6 = reinterpret_cast<sockaddr_in6&>(a);
    std::string addr = rest.substr(1, close - 1);
    addr = addr.substr(0, addr.find('%'));
    if (inet_pton(AF_INET6, addr.c_str(), &in6.sin6_addr) != 1) return rest;
    a.ss_family = AF_INET6;
    in6.sin6_port = htons(static_cast<uint16_t>(std::atoi(rest.c_str() + close + 2)));
    return KeyOf(a);
  }
  return "unix";
}

uint64_t InodeOf(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Bytes the connection has received, or -1 (not TCP).
int64_t BytesReceived(int fd) {
  tcp_info info = {};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received) {
    return -1;
  }
  return static_cast<int64_t>(info.tcpi_bytes_received);
}

// The interceptor that counts a call against its connection while it is in flight.
class CallCount final : public grpc::experimental::Interceptor {
 public:
  CallCount(Connections* c, std::string peer) : c_(c), peer_(std::move(peer)) {
    c_->CallStarted(peer_);
  }
  ~CallCount() override { c_->CallEnded(peer_); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  Connections* const c_;
  const std::string peer_;
};

class CallCountFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCountFactory(Connections* c) : c_(c) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallCount(c_, KeyOfPeer(info->server_context()->peer()));
  }

 private:
  Connections* const c_;
};

// How often a full limit may look again for connections that have ended (each look costs a
// system call per connection).
constexpr int64_t kPruneEveryNs = 50'000'000;

}  // namespace

Connections::Connections(Limits limits) : limits_(limits) {}
Connections::~Connections() = default;

std::unique_ptr<grpc::ServerBuilderOption> Connections::BuilderOption() {
  return std::make_unique<MutatorOption>(this);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Connections::CallCounter() {
  return std::make_unique<CallCountFactory>(this);
}

bool Connections::watching() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !listeners_.empty();
}

void Connections::Listening(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.push_back(fd);
}

int Connections::SetBacklog() {
  std::lock_guard<std::mutex> lock(mu_);
  if (limits_.backlog > 0) ListenLocked(false);
  return static_cast<int>(listeners_.size());
}

void Connections::ListenLocked(bool paused) {
  paused_ = paused;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(listeners_.size()));
  const int64_t backlog = limits_.backlog > 0 ? limits_.backlog : SOMAXCONN;
  const int each = paused ? 1 : static_cast<int>(std::max<int64_t>(1, backlog / n));
  for (int fd : listeners_) listen(fd, each);  // a listening socket takes a new backlog
}

void Connections::MaybeResumeLocked() {
  for (auto it = refusing_.begin(); it != refusing_.end();) {
    it = InodeOf(it->first) != it->second ? refusing_.erase(it) : std::next(it);
  }
  if (static_cast<int64_t>(refusing_.size()) <= limits_.max_refusing / 2) ListenLocked(false);
}


int64_t Connections::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

void Connections::PruneLocked() {
  last_prune_ns_ = SteadyNowNs();
  std::vector<int> gone;
  for (const auto& [fd, c] : by_fd_) {
    if (InodeOf(fd) != c.ino) gone.push_back(fd);
  }
  for (int fd : gone) EraseLocked(fd);
}

void Connections::EraseLocked(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto key = fd_by_key_.find(it->second.key);
  if (key != fd_by_key_.end() && key->second == fd) fd_by_key_.erase(key);
  by_fd_.erase(it);
}

bool Connections::CloseLocked(int fd, Conn& c) {
  if (c.closed || InodeOf(fd) != c.ino) return false;  // closed already, by us or gRPC
  c.closed = true;
  return shutdown(fd, SHUT_RDWR) == 0;
}

void Connections::Accepted(int fd) {
  sockaddr_storage peer = {};
  socklen_t len = sizeof peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) peer.ss_family = AF_UNIX;
  Conn c;
  c.ino = InodeOf(fd);
  c.key = KeyOf(peer);
  c.quiet_since_ns = SteadyNowNs();
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(fd);  // a descriptor gRPC closed and the kernel gave again
  refusing_.erase(fd);
  if (paused_) MaybeResumeLocked();
  if (static_cast<int64_t>(by_fd_.size()) >= limits_.max_connections &&
      c.quiet_since_ns - last_prune_ns_ >= kPruneEveryNs) {
    PruneLocked();
  }
  if (static_cast<int64_t>(by_fd_.size()) >= limits_.max_connections) {
    ++refused_;
    shutdown(fd, SHUT_RDWR);  // gRPC reads the end and frees the descriptor, in a while
    refusing_[fd] = c.ino;
    if (!paused_ && static_cast<int64_t>(refusing_.size()) >= limits_.max_refusing) {
      MaybeResumeLocked();  // drops those freed meanwhile
      if (static_cast<int64_t>(refusing_.size()) > limits_.max_refusing / 2) ListenLocked(true);
    }
    return;
  }
  if (c.key != "unix") {
    if (auto old = fd_by_key_.find(c.key); old != fd_by_key_.end()) EraseLocked(old->second);
    fd_by_key_[c.key] = fd;
  }
  by_fd_[fd] = std::move(c);
}

void Connections::CallStarted(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer == "unix") {
    ++unix_calls_;
    return;
  }
  if (auto it = fd_by_key_.find(peer); it != fd_by_key_.end()) {
    ++by_fd_.at(it->second).calls;
  } else {
    ++unmatched_calls_;
  }
}

void Connections::CallEnded(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer == "unix") {
    --unix_calls_;
    return;
  }
  auto it = fd_by_key_.find(peer);
  if (it == fd_by_key_.end()) {
    if (unmatched_calls_ > 0) --unmatched_calls_;
    return;
  }
  Conn& c = by_fd_.at(it->second);
  if (c.calls > 0 && --c.calls == 0) {
    c.quiet_since_ns = SteadyNowNs();
    c.bytes_mark = BytesReceived(it->second);
  }
}

int Connections::CloseQuiet(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (paused_) MaybeResumeLocked();
  if (limits_.quiet_timeout_seconds <= 0 || unmatched_calls_ > 0) return 0;
  const double timeout_ns = limits_.quiet_timeout_seconds * 1e9;
  int n = 0;
  PruneLocked();
  for (auto& [fd, c] : by_fd_) {
    if (c.calls > 0 || c.closed || c.key == "unix") continue;
    const int64_t bytes = BytesReceived(fd);
    if (bytes < 0) continue;
    if (c.bytes_mark < 0) c.bytes_mark = bytes;
    // Each byte received buys the time the minimum rate takes for it.
    const double allowance_ns =
        timeout_ns + 1e9 * static_cast<double>(bytes - c.bytes_mark) / limits_.min_bytes_per_second;
    if (static_cast<double>(now_ns - c.quiet_since_ns) > allowance_ns && CloseLocked(fd, c)) ++n;
  }
  return n;
}

int Connections::CloseIdle() {
  int n = 0;
  std::lock_guard<std::mutex> lock(mu_);
  PruneLocked();
  for (auto& [fd, c] : by_fd_) {
    const bool idle =
        c.key == "unix" ? unix_calls_ == 0 : c.calls == 0 && unmatched_calls_ == 0;
    if (idle && CloseLocked(fd, c)) ++n;
  }
  return n;
}

}  // namespace fusebox
