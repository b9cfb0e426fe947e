// The server's options, one struct with a default and a comment per field, and the one check
// of their ranges. main.cc turns flags into these; tests build them directly.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/backend_loader.h"
#include "server/core/shared_memory.h"
#include "server/core/tensor_store.h"

namespace fusebox {

constexpr int64_t kMinMessageBytes = int64_t{64} << 10;  // --max_message_bytes' least

struct ServerOptions {
  std::string address = "0.0.0.0:50051";  // host:port (0..65535; 0 picks a free one) or unix:path
  BackendChoice backend;                  // --backend and its pool sizes
  int cpu_threads = 0;                    // CPU kernels' threads; 0 = all cores
  int64_t max_message_bytes = (int64_t{1} << 30) + (int64_t{1} << 20);  // in and out
  double shutdown_notice_seconds = 0;     // NOT_SERVING but still serving, at shutdown
  double drain_seconds = 30;              // grace for in-flight calls at shutdown
  std::string metrics_address;            // host:port for /metrics (0 picks a port); empty = off
  std::string token_file;                 // `token tenant` lines; empty = open server
  // Prefixed to every handle this server mints ("<id>.<random>") so that calls naming it can be
  // routed to this replica; 1-63 letters, digits, '-' or '_', or empty (bare handles). main's
  // default is the host name's first label (a Kubernetes pod's name).
  std::string replica_id;
  // TLS on the gRPC port, from PEM files: a certificate (chain) and its key, both or neither
  // (neither = plaintext). With a client CA every client must present a certificate that CA
  // signed (mTLS). gRPC reads the files again every tls_reload_seconds: new connections get
  // what they hold then, connections already open keep theirs.
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
  int tls_reload_seconds = 60;
  // Tensor store; a budget of 0 = automatic (90% of free GPU memory at start,
  // half of HostMemoryBytes() on the CPU backend); a quota of 0 = the budget.
  int64_t store_budget_bytes = 0;
  int64_t tenant_quota_bytes = 0;
  int64_t max_tensor_bytes = StoreLimits{}.max_tensor_bytes;
  int64_t max_tensors = StoreLimits{}.max_tensors;  // held at once, all tenants
  // Held at once by one tenant; 0 = max_tensors / FairShareDivisor(tenants).
  int64_t max_tensors_per_tenant = 0;
  double idle_expiry_seconds = StoreLimits{}.idle_expiry_seconds;  // 0 = never
  // Inline tensors of calls in flight (InflightBytes); 0 = a quarter of HostMemoryBytes().
  int64_t inflight_bytes = 0;
  // The part of it one tenant may hold, in 0..1; 0 = 1 / FairShareDivisor(tenants).
  double tenant_inflight_share = 0;
  // A call whose waits on its client (Upload messages, Download chunks, a reply not taken) add
  // up to more than this plus 1 s per MiB moved and in transit is cancelled (StallWatch);
  // 0 = never.
  double stall_timeout_seconds = 120;
  // Freed heap memory kept for reuse (main applies it with mallopt); 0 = glibc's defaults.
  int64_t malloc_retain_bytes = int64_t{1} << 30;
  // glibc's heap arenas (M_ARENA_MAX); 0 = glibc's default, 8 per core. Each arena keeps its
  // own freed memory, so fewer of them bound RSS sooner (server/heap.h).
  int malloc_arenas = 2;
  // Client connections at once (Connections); past it new ones are closed at once. Lowered
  // where the descriptor limit could not hold them all.
  int64_t max_connections = 1000;
  // A new connection must complete its handshake (HTTP/2's preface and settings) this soon.
  double handshake_timeout_seconds = 10;
  // A connection with no call being served (requests still arriving, or none) that receives
  // less than 1 MiB/s for this long, plus 1 s per MiB it did receive, is closed; idle ones are
  // sent GOAWAY after half of it. 0 = never.
  double arrival_timeout_seconds = 60;
  // Streams one connection may have open at once (HTTP/2's MAX_CONCURRENT_STREAMS): with
  // max_connections, the bound on requests still arriving (gRPC holds each, about 11 KB and
  // its bytes so far, until it is whole).
  int64_t max_streams_per_connection = 100;
  // Shared memory (RegisterSharedMemory): off unless allowed. Per tenant: regions at once and
  // their bytes (0 = half of HostMemoryBytes(): on CUDA every byte is pinned), and an idle
  // expiry, so a client that disappears does not leave its regions mapped for ever.
  bool allow_shared_memory = false;
  int64_t max_shm_regions_per_tenant = SharedMemoryLimits{}.max_regions_per_tenant;
  int64_t shm_tenant_quota_bytes = 0;
  double shm_idle_expiry_seconds = SharedMemoryLimits{}.idle_expiry_seconds;  // 0 = never
  // Execute: requests one stream may have read and not yet answered; at the bound the server
  // reads no more of that stream until a response has gone (HTTP/2 flow control then holds the
  // client). Each is also within --inflight_mib like any call.
  int64_t stream_max_inflight = 64;
};

// What the automatic per-tenant shares divide by: the tenants (an open server has one), at most
// 4, so a few tenants that misbehave at once can still take everything.
int64_t FairShareDivisor(size_t tenants);

// Every option's range, checked in this one place before anything starts (main and
// FuseboxServer::Start both ask): INVALID_ARGUMENT naming the flag and its range.
// Byte sizes given in MiB that overflow int64 arrive here as -1.
absl::Status CheckOptions(const ServerOptions& o);

// Whether the gRPC port speaks TLS.
inline bool TlsEnabled(const ServerOptions& o) { return !o.tls_cert_file.empty(); }

// The replica id a host name gives: its first label when that is a valid --replica_id, else
// empty.
std::string ReplicaIdFromHostname(const std::string& hostname);

// Whether --address names a socket (unix:, unix-abstract:, vsock:) rather than HOST:PORT.
bool IsSocketAddress(const std::string& address);

}  // namespace fusebox
