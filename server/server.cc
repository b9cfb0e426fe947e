// FuseboxServer and RunServer: see server.h.
#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>
#include <sys/resource.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/parallel.h"
#include "server/rpc/auth.h"
#include "server/rpc/connections.h"
#include "server/heap.h"
#include "server/log.h"
#include "server/rpc/metrics.h"
#include "server/rpc/service.h"
#include "server/tls.h"

namespace fusebox {

namespace {

// The shutdown signal's number, posted by its handler for RunServer to wait on.
std::atomic<int> g_shutdown_signal{0};
sem_t g_shutdown_sem;

void OnShutdownSignal(int sig) {
  int none = 0;  // the first reason stays (a failed listener must still exit 1)
  g_shutdown_signal.compare_exchange_strong(none, sig);
  sem_post(&g_shutdown_sem);  // async-signal-safe
}

// gRPC 1.51's listener stops for good after an accept fails (grpc/grpc#20418; out of file
// descriptors, for one): new connections then hang while the process looks alive. The
// connection limit (ChooseDescriptorBudget) keeps the server within its descriptors, so only
// descriptors taken by something else leave it possible. Its log line is the only sign, so this
// hook turns it into a drain and an exit that is not 0, for the supervisor (Kubernetes,
// systemd) to restart the server.
constexpr int kListenerFailed = -1;  // in g_shutdown_signal

// gRPC logs each failed TLS handshake (plaintext on the TLS port, a client trusting another CA,
// a port scan): a line per connection, which anyone who can connect could use to fill the log.
// One a second is kept; the next one kept says how many were left out.
bool KeepHandshakeLine(int64_t* left_out) {
  static std::atomic<int64_t> next_ms{0};
  static std::atomic<int64_t> skipped{0};
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  int64_t next = next_ms.load();
  if (now_ms < next || !next_ms.compare_exchange_strong(next, now_ms + 1000)) {
    skipped.fetch_add(1);
    return false;
  }
  *left_out = skipped.exchange(0);
  return true;
}

void OnGrpcLog(gpr_log_func_args* args) {
  if (std::strstr(args->message, "Handshake failed") != nullptr) {
    int64_t left_out = 0;
    if (!KeepHandshakeLine(&left_out)) return;
    if (left_out > 0) {
      Log("grpc: %lld more failed TLS handshakes since the last one logged",
          static_cast<long long>(left_out));
    }
  }
  const char* severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? "E"
                         : args->severity == GPR_LOG_SEVERITY_INFO ? "I"
                                                                   : "D";
  Log("grpc %s %s:%d] %s", severity, args->file, args->line, args->message);
  if (std::strstr(args->message, "Failed accept") != nullptr) {
    int none = 0;
    if (g_shutdown_signal.compare_exchange_strong(none, kListenerFailed)) sem_post(&g_shutdown_sem);
  }
}

// protobuf logs from whatever thread parses, and some of what it logs a client can cause at
// will, before any token is checked (a string that is not UTF-8 in a request of a service the
// server does not parse itself, such as reflection): at most kProtobufLinesPerMinute lines a
// minute reach the log, and the number of those dropped follows.
constexpr int kProtobufLinesPerMinute = 10;

void OnProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                   const std::string& message) {
  static std::mutex mu;
  static int64_t window_start_ns = 0;
  static int lines = 0, dropped = 0;
  std::lock_guard<std::mutex> lock(mu);
  const int64_t now = SteadyNowNs();
  if (now - window_start_ns >= int64_t{60} * 1000000000) {
    if (dropped > 0) Log("protobuf: %d more lines in the minute before were dropped", dropped);
    window_start_ns = now;
    lines = dropped = 0;
  }
  if (++lines > kProtobufLinesPerMinute) {
    ++dropped;
    return;
  }
  Log("protobuf %s %s:%d] %s",
      level >= google::protobuf::LOGLEVEL_ERROR     ? "E"
      : level == google::protobuf::LOGLEVEL_WARNING ? "W"
                                                    : "I",
      file, line, message.c_str());
}

// As many file descriptors as the hard limit allows (often 1024 of 1048576 in containers):
// each connection takes one, and running out stops the listener (above).
void RaiseFileLimit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t want = r.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : r.rlim_max;
  if (r.rlim_cur < want) {
    r.rlim_cur = want;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    Log("file descriptors: up to %llu (one per connection)",
        static_cast<unsigned long long>(r.rlim_cur));
  }
}

}  // namespace

void CatchShutdownSignals() {
  sem_init(&g_shutdown_sem, 0, 0);
  struct sigaction sa = {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

namespace {

// The number a cgroup file holds, or -1 (missing, "max", not a number).
int64_t ReadLimit(const std::string& path) {
  std::ifstream f(path);
  long long v = -1;
  if (!(f >> v) || v <= 0) return -1;
  return static_cast<int64_t>(v);
}

// HOST:PORT (or a bare PORT) with the port replaced by `port`.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  return absl::StrCat(host.empty() ? "0.0.0.0" : host, ":", port);
}

StoreLimits ChooseStoreLimits(const ServerOptions& o, const Backend& backend, size_t tenants) {
  StoreLimits l;
  l.budget_bytes = o.store_budget_bytes;
  if (l.budget_bytes == 0) {
    const BackendStats s = backend.stats();
    if (s.device_memory_total > 0) {
      l.budget_bytes = (s.device_memory_total - s.device_memory_used) / 10 * 9;
    } else {
      l.budget_bytes = HostMemoryBytes() / 2;
    }
  }
  l.tenant_quota_bytes = o.tenant_quota_bytes == 0 ? l.budget_bytes : o.tenant_quota_bytes;
  l.max_tensor_bytes = o.max_tensor_bytes;
  l.max_tensors = o.max_tensors;
  l.max_tensors_per_tenant =
      o.max_tensors_per_tenant > 0
          ? o.max_tensors_per_tenant
          : std::max<int64_t>(1, o.max_tensors / FairShareDivisor(tenants));
  l.idle_expiry_seconds = o.idle_expiry_seconds;
  return l;
}

// The connections the descriptor limit can hold with room for the refused ones: each takes a
// descriptor until gRPC frees it, some time after it is refused, and gRPC accepts the whole
// listen backlog in one go. Half the room for connections, a quarter for refused ones that
// wait to be freed (past it the listeners pause), an eighth for the backlog (at most the
// kernel's somaxconn).
struct DescriptorBudget {
  int64_t max_connections;
  int64_t backlog;
  int64_t max_refusing;
  int64_t descriptors;  // the limit; 0 = none
};

DescriptorBudget ChooseDescriptorBudget(int64_t wanted) {
  int64_t somaxconn = ReadLimit("/proc/sys/net/core/somaxconn");
  if (somaxconn <= 0) somaxconn = 4096;
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) {
    return {wanted, somaxconn, std::max<int64_t>(wanted, somaxconn), 0};
  }
  const int64_t descriptors = static_cast<int64_t>(r.rlim_cur);
  int64_t open = 0;  // the process's descriptors now, and room for the ones gRPC, the
  std::error_code ec;  // metrics server and the backend open later
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++open;
  }
  const int64_t room = std::max<int64_t>(8, descriptors - open - 64);
  DescriptorBudget b;
  b.descriptors = descriptors;
  b.max_connections = std::min(wanted, room / 2);
  b.max_refusing = room / 4;
  b.backlog = std::min(somaxconn, room / 8);
  return b;
}

}  // namespace

int64_t HostMemoryBytes(const std::string& cgroup_root, const std::string& self_cgroup) {
  // The root's own limits (a container's cgroup namespace), then those of this process's
  // cgroup and each cgroup above it, as /proc/self/cgroup names them: v2 "0::/a/b", v1
  // "N:...memory...:/a/b".
  std::vector<std::string> files = {cgroup_root + "/memory.max",
                                    cgroup_root + "/memory/memory.limit_in_bytes"};
  std::ifstream f(self_cgroup);
  for (std::string line; std::getline(f, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    for (size_t end = path.find('/', 1); ; end = path.find('/', end + 1)) {
      const std::string dir = path.substr(0, end);  // /a, then /a/b, ...
      if (dir.size() > 1) {
        files.push_back(v2 ? cgroup_root + dir + "/memory.max"
                           : cgroup_root + "/memory" + dir + "/memory.limit_in_bytes");
      }
      if (end == std::string::npos) break;
    }
  }
  int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  for (const std::string& file : files) {
    const int64_t limit = ReadLimit(file);  // v1's "none" is a huge number
    if (limit > 0) bytes = std::min(bytes, limit);
  }
  return bytes;
}

constexpr int kMaxSyncThreads = 32;
// How often the drain closes the connections left without a call.
constexpr auto kCloserPeriod = std::chrono::milliseconds(20);

struct FuseboxServer::State {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TensorStore> store;
  std::unique_ptr<SharedMemoryRegistry> shm;  // regions unmap before the backend goes
  Authenticator auth;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<KernelServiceImpl> service;
  std::unique_ptr<Connections> connections;  // outlives the server, whose sockets it sees
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // The sweeper: idle expiry, stalled calls, quiet connections.
  std::thread sweeper;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::once_flag shutdown_once;
  std::unique_ptr<TlsFileWatch> tls_watch;  // with TLS on
};

FuseboxServer::FuseboxServer(std::unique_ptr<State> state) : s_(std::move(state)) {}

FuseboxServer::~FuseboxServer() { Shutdown(0); }

int FuseboxServer::port() const { return s_->port; }
int FuseboxServer::metrics_port() const { return s_->metrics ? s_->metrics->port() : 0; }
const Backend& FuseboxServer::backend() const { return *s_->backend; }
TensorStore& FuseboxServer::store() { return *s_->store; }

absl::StatusOr<std::unique_ptr<FuseboxServer>> FuseboxServer::Start(const ServerOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  if (o.cpu_threads > 0) cpu::SetCpuThreads(o.cpu_threads);
  auto s = std::make_unique<State>();

  if (!o.token_file.empty()) {
    auto auth = Authenticator::FromFile(o.token_file);
    if (!auth.ok()) return auth.status();
    s->auth = *std::move(auth);
    Log("auth: %zu tenants from %s", s->auth.tenants(), o.token_file.c_str());
  } else {
    Log("auth: OPEN - no --token_file, every caller is tenant 'anonymous'");
  }
  if (TlsEnabled(o)) {
    auto tls = ReadTlsFiles(o);
    if (!tls.ok()) return tls.status();
    Log("tls: %s; the files are read again every %d s", tls->description.c_str(),
        o.tls_reload_seconds);
    if (!tls->warning.empty()) Log("tls: WARNING: %s", tls->warning.c_str());
  } else if (!o.token_file.empty()) {
    // Loud, at every start: a token that crosses a network in cleartext is as good as published.
    Log("WARNING: --token_file without TLS: bearer tokens and tensors cross the network in "
        "CLEARTEXT; anyone on the path can read a token and act as its tenant.");
    Log("WARNING: serve TLS (--tls_cert and --tls_key, --tls_client_ca for mTLS), or listen "
        "only on loopback or a unix socket.");
  } else {
    Log("tls: off (plaintext; --tls_cert and --tls_key turn it on)");
  }

  auto backend = CreateBackend(o.backend);
  if (!backend.ok()) return backend.status();
  s->backend = *std::move(backend);

  // Anonymous callers are one tenant.
  const size_t tenants = s->auth.open() ? 1 : s->auth.tenants();
  const StoreLimits limits = ChooseStoreLimits(o, *s->backend, tenants);
  s->store = std::make_unique<TensorStore>(s->backend.get(), limits, o.replica_id);
  Log("tensor store: budget %lld MiB, quota %lld MiB per tenant, up to %lld tensors (%lld per "
      "tenant), idle expiry %g s, handles of replica '%s'",
      static_cast<long long>(limits.budget_bytes >> 20),
      static_cast<long long>(limits.tenant_quota_bytes >> 20),
      static_cast<long long>(limits.max_tensors),
      static_cast<long long>(limits.max_tensors_per_tenant), limits.idle_expiry_seconds,
      o.replica_id.c_str());

  SharedMemoryLimits shm_limits;
  shm_limits.enabled = o.allow_shared_memory;
  shm_limits.max_regions_per_tenant = o.max_shm_regions_per_tenant;
  shm_limits.tenant_quota_bytes =
      o.shm_tenant_quota_bytes > 0 ? o.shm_tenant_quota_bytes : HostMemoryBytes() / 2;
  shm_limits.idle_expiry_seconds = o.shm_idle_expiry_seconds;
  s->shm = std::make_unique<SharedMemoryRegistry>(s->backend.get(), shm_limits);
  if (o.allow_shared_memory) {
    Log("shared memory: ON for clients on this node (POSIX objects opened with this process's "
        "permissions%s); %lld regions and %lld MiB per tenant, idle expiry %g s",
        s->backend->name() == "cuda" ? ", pinned; CUDA IPC handles" : "",
        static_cast<long long>(shm_limits.max_regions_per_tenant),
        static_cast<long long>(shm_limits.tenant_quota_bytes >> 20),
        shm_limits.idle_expiry_seconds);
  }

  if (!o.metrics_address.empty()) {
    auto m = Metrics::Start(o.metrics_address, s->backend.get());
    if (!m.ok()) return m.status();
    s->metrics = *std::move(m);
    TensorStore* store = s->store.get();
    s->metrics->SetResidentTensorsSource([store] {
      const StoreStats st = store->stats();
      return ResidentTensors{st.count, st.bytes};
    });
    const std::string metrics_at = WithPort(o.metrics_address, s->metrics->port());
    Log("metrics on http://%s/metrics", metrics_at.c_str());
    if (TlsEnabled(o)) {
      Log("metrics: plain HTTP, TLS is on the gRPC port only: keep %s inside the cluster "
          "(a NetworkPolicy), or put a TLS proxy in front of it",
          metrics_at.c_str());
    }
  }

  RequestLimits request_limits;
  request_limits.max_output_bytes = o.max_message_bytes - 4096;  // room for the rest of the reply
  request_limits.max_inflight_bytes =
      o.inflight_bytes > 0 ? o.inflight_bytes : HostMemoryBytes() / 4;
  request_limits.max_tenant_inflight_bytes =
      o.tenant_inflight_share > 0
          ? static_cast<int64_t>(static_cast<double>(request_limits.max_inflight_bytes) *
                                 o.tenant_inflight_share)
          : request_limits.max_inflight_bytes / FairShareDivisor(tenants);
  request_limits.stall_timeout_seconds = o.stall_timeout_seconds;
  request_limits.max_message_bytes = o.max_message_bytes;
  request_limits.stream_max_inflight = static_cast<int>(o.stream_max_inflight);
  // gRPC's own buffers (requests still arriving, replies on their way): as much as the
  // in-flight budget, and at least two of the largest messages (one call alone never meets it).
  const int64_t grpc_quota_bytes =
      std::max(request_limits.max_inflight_bytes, 2 * o.max_message_bytes);
  // Replies on their way are in gRPC's buffers too (the quota counts only what arrives).
  request_limits.max_sending_bytes = grpc_quota_bytes;
  Log("calls in flight: up to %lld MiB of inline tensors (%lld MiB per tenant), gRPC's buffers "
      "up to %lld MiB; cancelled after %g s waiting on their client (and 1 s per MiB)",
      static_cast<long long>(request_limits.max_inflight_bytes >> 20),
      static_cast<long long>(request_limits.max_tenant_inflight_bytes >> 20),
      static_cast<long long>(grpc_quota_bytes >> 20), o.stall_timeout_seconds);
  s->service = std::make_unique<KernelServiceImpl>(s->backend.get(), s->metrics.get(),
                                                   s->store.get(), &s->auth, request_limits,
                                                   s->shm.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.address, MakeServerCredentials(o), &s->port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  // Under the quota's pressure gRPC refuses streams (RESOURCE_EXHAUSTED) instead of buffering
  // every request that arrives at once.
  grpc::ResourceQuota quota("fusebox");
  quota.Resize(static_cast<size_t>(grpc_quota_bytes));
  // Threads of the synchronous services (reflection: each open stream holds one; our own
  // service is on the callback API and needs none of them).
  quota.SetMaxThreads(kMaxSyncThreads);
  builder.SetResourceQuota(quota);
  // A stream costs gRPC about 11 KB until its request is whole, outside the quota, and gRPC
  // gives a request no deadline to arrive in: so few streams a connection (a client past it
  // waits for one to end), few connections, and the connections that carry no call and
  // receive too little closed (Connections). Handshakes are short: a connection that sends
  // nothing holds its descriptor that long.
  const DescriptorBudget descriptors = ChooseDescriptorBudget(o.max_connections);
  Connections::Limits connection_limits;
  connection_limits.max_connections = descriptors.max_connections;
  connection_limits.backlog = descriptors.backlog;
  connection_limits.max_refusing = descriptors.max_refusing;
  connection_limits.quiet_timeout_seconds = o.arrival_timeout_seconds;
  connection_limits.min_bytes_per_second = StallWatch::kMinClientBytesPerSecond;
  s->connections = std::make_unique<Connections>(connection_limits);
  builder.SetOption(s->connections->BuilderOption());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
  counters.push_back(s->connections->CallCounter());
  builder.experimental().SetInterceptorCreators(std::move(counters));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(o.max_streams_per_connection));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(o.handshake_timeout_seconds * 1000));
  if (o.arrival_timeout_seconds > 0) {  // idle: GOAWAY first, which clients follow gently
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_IDLE_MS,
        static_cast<int>(std::max(1.0, o.arrival_timeout_seconds * 500)));
  }
  builder.RegisterService(s->service.get());
  s->server = builder.BuildAndStart();
  if (!s->server || s->port == 0) {
    s->backend->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.address));
  }
  s->server->GetHealthCheckService()->SetServingStatus(true);
  if (TlsEnabled(o)) s->tls_watch = std::make_unique<TlsFileWatch>(o);
  if (!s->connections->watching()) {
    Log("WARNING: gRPC did not show its sockets to the connection limit; connections are "
        "not limited");
  }
  const int listeners = s->connections->SetBacklog();
  Log("connections: up to %lld at once (%lld file descriptors, listen backlog %lld over %d "
      "sockets), %lld streams each, handshake within %g s, closed after %g s without a call "
      "being served (and 1 s per MiB received)",
      static_cast<long long>(connection_limits.max_connections),
      static_cast<long long>(descriptors.descriptors),
      static_cast<long long>(descriptors.backlog), listeners,
      static_cast<long long>(o.max_streams_per_connection), o.handshake_timeout_seconds,
      o.arrival_timeout_seconds);

  // The sweeper looks a quarter of the shorter limit apart (10 ms..10 s); with no limit it
  // still bounds the heap's kept memory every 10 s.
  double limit_seconds = 40;
  for (double t : {limits.idle_expiry_seconds, o.stall_timeout_seconds,
                   o.arrival_timeout_seconds, shm_limits.idle_expiry_seconds}) {
    if (t > 0) limit_seconds = std::min(limit_seconds, t);
  }
  {
    const auto period = std::chrono::milliseconds(
        std::clamp<int64_t>(static_cast<int64_t>(limit_seconds * 250), 10, 10000));
    State* st = s.get();
    const int64_t retain = o.malloc_retain_bytes;
    s->sweeper = std::thread([st, period, retain] {
      int64_t refused = 0;  // logged so far
      int64_t heap_checked = 0;
      std::unique_lock<std::mutex> lock(st->mu);
      while (!st->cv.wait_for(lock, period, [st] { return st->stopping; })) {
        lock.unlock();
        if (int n = st->store->ExpireIdle(); n > 0) Log("expired %d idle tensors", n);
        if (int n = st->shm->ExpireIdle(); n > 0) {
          Log("unregistered %d idle shared-memory regions", n);
        }
        if (int n = st->service->CancelStalled(); n > 0) {
          Log("cancelled %d calls that waited on their clients too long", n);
        }
        if (int n = st->connections->CloseQuiet(SteadyNowNs()); n > 0) {
          Log("closed %d connections idle or with requests arriving too slowly", n);
        }
        if (const int64_t n = st->connections->refused(); n > refused) {
          Log("refused %lld connections past the limit (--max_connections)",
              static_cast<long long>(n - refused));
          refused = n;
        }
        // At most once a second: mallinfo2 takes every arena's lock.
        if (const int64_t now = SteadyNowNs(); now - heap_checked >= 1'000'000'000) {
          heap_checked = now;
          TrimHeapAbove(retain);
        }
        lock.lock();
      }
    });
  }
  return std::unique_ptr<FuseboxServer>(new FuseboxServer(std::move(s)));
}

void FuseboxServer::Shutdown(double drain_seconds, double notice_seconds) {
  // Every caller returns once the drain is over (a second one waits for the first: the
  // destructor's call must not free the state under a shutdown still running).
  std::call_once(s_->shutdown_once, [&] {
    s_->server->GetHealthCheckService()->SetServingStatus(false);
    if (notice_seconds > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(static_cast<int64_t>(notice_seconds * 1000)));
    }
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(drain_seconds * 1000));
    // gRPC takes no new call once its shutdown has begun, and a request still arriving would
    // fail only once it was whole; the connections without a call in flight close meanwhile,
    // as their calls end, so such requests fail at once (UNAVAILABLE) and idle clients do not
    // hold up the drain. The first look waits for gRPC's listeners to stop and its GOAWAY.
    std::atomic<bool> drained{false};
    std::thread closer([this, &drained] {
      std::this_thread::sleep_for(kCloserPeriod);
      while (!drained) {
        s_->connections->CloseIdle();
        std::this_thread::sleep_for(kCloserPeriod);
      }
    });
    s_->service->Drain();  // Execute streams stop reading and end once they have answered
    s_->server->Shutdown(deadline);  // returns once every call has finished or been cancelled
    drained = true;
    closer.join();
    // The sweeper ran until now: a call that stalls during the notice or the drain is
    // still cancelled, and holds up neither.
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stopping = true;
    }
    s_->cv.notify_all();
    if (s_->sweeper.joinable()) s_->sweeper.join();
    s_->backend->Shutdown();
  });
}

absl::Status RunServer(const ServerOptions& o) {
  RaiseFileLimit();
  gpr_set_log_function(OnGrpcLog);
  google::protobuf::SetLogHandler(OnProtobufLog);
  // The hook sees only what gRPC logs: errors at least (GRPC_VERBOSITY=NONE would hide them).
  if (!gpr_should_log(GPR_LOG_SEVERITY_ERROR)) gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
  auto server = FuseboxServer::Start(o);
  if (!server.ok()) return server.status();
  // HOST:PORT with the port chosen; a socket address as given.
  const std::string where =
      IsSocketAddress(o.address) ? o.address : WithPort(o.address, (*server)->port());
  const char* tls = !TlsEnabled(o) ? "off" : o.tls_client_ca_file.empty() ? "on" : "mtls";
  // /metrics' address last: scripts read "listening on HOST:PORT" from the front.
  const std::string metrics =
      o.metrics_address.empty()
          ? ""
          : absl::StrCat(" metrics=", WithPort(o.metrics_address, (*server)->metrics_port()));
  std::printf("fusebox-server listening on %s backend=%s device=\"%s\" tls=%s%s\n",
              where.c_str(), (*server)->backend().name().c_str(),
              (*server)->backend().device().c_str(), tls, metrics.c_str());
  std::fflush(stdout);

  while (sem_wait(&g_shutdown_sem) != 0) {
  }  // EINTR: another signal's handler ran on this thread
  const int sig = g_shutdown_signal.load();
  Log("%s: NOT_SERVING; serving %.1f s more, then draining (up to %.0f s)",
      sig == SIGTERM         ? "SIGTERM"
      : sig == SIGINT        ? "SIGINT"
                             : "the gRPC listener failed and accepts no more connections",
      o.shutdown_notice_seconds, o.drain_seconds);
  (*server)->Shutdown(o.drain_seconds, o.shutdown_notice_seconds);
  server->reset();
  Log("stopped");
  if (sig == kListenerFailed) {
    return absl::UnavailableError(
        "the gRPC listener failed (out of file descriptors?) and accepts no more connections; "
        "exiting for a restart");
  }
  return absl::OkStatus();
}

}  // namespace fusebox
