// fusebox-server: flags -> ServerOptions -> RunServer. `--help` lists the flags.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "fusebox/version.h"
#include "server/heap.h"
#include "server/server.h"

namespace {
const fusebox::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, address, kDefaults.address,
          "HOST:PORT ([V6]:PORT for IPv6) to serve gRPC on, or unix:PATH; port 0 picks a "
          "free port (printed at start-up)");
ABSL_FLAG(std::string, backend, "auto",
          "auto (the GPU when one is usable, else the CPU), cpu, or cuda (fail without a GPU)");
ABSL_FLAG(std::string, cuda_module, "",
          "path of libfusebox_cuda_backend.so; empty = next to this executable");
ABSL_FLAG(int, workers, kDefaults.backend.cpu.workers,
          "CPU backend: calls computed at once (each spread over --cpu_threads)");
ABSL_FLAG(int, cpu_threads, 0, "CPU kernels: threads per call; 0 = all cores");
ABSL_FLAG(int, streams, kDefaults.backend.cuda.streams,
          "CUDA backend: streams in the pool (calls in flight on the GPU at once)");
ABSL_FLAG(int, cuda_device, 0, "CUDA backend: device ordinal");
ABSL_FLAG(int64_t, staging_mib, kDefaults.backend.cuda.staging_bytes >> 20,
          "CUDA backend: pinned staging per stream and direction, MiB");
ABSL_FLAG(std::string, matmul_impl, "cublaslt",
          "CUDA backend: MatmulRelu when a request leaves impl unset: cublaslt or tiled");
ABSL_FLAG(bool, kernel_gate, kDefaults.backend.cuda.kernel_gate,
          "CUDA backend: enqueue each kernel behind a gate released once it is queued, so that "
          "kernel_us is the kernel alone (not the launch); off saves a launch per call");
ABSL_FLAG(bool, cuda_graphs, kDefaults.backend.cuda.cuda_graphs,
          "CUDA backend: a small inline GeLU, softmax or row sum of a shape the stream has run "
          "before runs as one CUDA graph (copy in, kernel, copy out) instead of ~8 API calls; "
          "not yet measured on a GPU, so off by default");
ABSL_FLAG(int64_t, run_here_kib, kDefaults.backend.cpu.run_here_bytes >> 10,
          "a call whose tensors (in and out, inline or kept) total at most this many KiB runs on the "
          "thread that received it when a worker/stream is free and none waits, skipping the "
          "handoff to a worker; 0 = every call goes through the queue");
ABSL_FLAG(int, copy_threads, kDefaults.backend.cpu.copy_threads,
          "threads that copy a large inline tensor from the pieces it arrived in into place "
          "(CUDA: pinned staging; CPU: one buffer), 1..64; 0 = automatic (min(4, cores / 2)), "
          "1 = the call's own thread alone");
ABSL_FLAG(bool, batching, kDefaults.backend.cpu.batch.enabled,
          "small GeLU / softmax / row-sum calls of one dtype and row length that wait for a "
          "worker/stream at the same time run as one launch (server/exec/batcher.h)");
ABSL_FLAG(int64_t, batch_max_kib, kDefaults.backend.cpu.batch.max_call_bytes >> 10,
          "batching: a call's inline input (and result) at most this many KiB; 0 = batching off");
ABSL_FLAG(int64_t, batch_wait_us, kDefaults.backend.cpu.batch.wait_us,
          "batching: how long a call may wait for more calls of its kind before it runs; "
          "0 = never wait (batch only calls already queued)");
ABSL_FLAG(int64_t, queue_capacity, kDefaults.backend.cuda.queue_capacity,
          "calls that may wait for a worker/stream; beyond it calls get RESOURCE_EXHAUSTED "
          "(the default holds 64 Execute streams at their full --stream_max_inflight)");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "largest request or response in bytes (gRPC allows at most 2^31-1)");
ABSL_FLAG(double, shutdown_notice_s, kDefaults.shutdown_notice_seconds,
          "on SIGTERM/SIGINT: seconds health reads NOT_SERVING while calls are still "
          "served, before draining (let readiness probes move traffic away)");
ABSL_FLAG(double, drain_seconds, kDefaults.drain_seconds,
          "on SIGTERM/SIGINT: seconds in-flight calls get to finish");
ABSL_FLAG(std::string, metrics_address, "",
          "host:port to serve Prometheus /metrics on; empty = off. Plain HTTP, with TLS on "
          "too (it carries no tokens or tensors): keep it inside the cluster (a "
          "NetworkPolicy) or put a TLS proxy in front");
ABSL_FLAG(std::string, token_file, "",
          "file of `token tenant` lines; callers send `authorization: Bearer <token>`. "
          "Empty = open server, every caller is tenant 'anonymous'. Without TLS the tokens "
          "cross the network in cleartext (the server warns at start-up)");
ABSL_FLAG(std::string, replica_id,
          fusebox::ReplicaIdFromHostname(std::getenv("HOSTNAME") ? std::getenv("HOSTNAME") : ""),
          "prefixed to every handle this server mints (\"<id>.<random>\") so that a proxy or a "
          "client in front of several replicas sends the calls naming a handle to the replica "
          "holding it; 1-63 letters, digits, '-' or '_'; empty = bare handles. Default: "
          "$HOSTNAME's first label (a Kubernetes pod's name), or empty");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) the gRPC port serves TLS with, with --tls_key; empty = "
          "plaintext. Read again every --tls_reload_s: new connections get the new files, open "
          "ones keep theirs. Replace the files at once (a directory swapped by rename or "
          "symlink, as Kubernetes Secret volumes do): a key and certificate that do not match "
          "fail new handshakes until they do");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (not encrypted)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): with it every client must present a certificate that one of "
          "them signed (mTLS; needs --tls_cert); reloaded like --tls_cert");
ABSL_FLAG(int, tls_reload_s, kDefaults.tls_reload_seconds,
          "seconds between reads of the TLS files (1..86400)");
ABSL_FLAG(int64_t, store_budget_mib, 0,
          "memory for tensors held by handle, all tenants; 0 = 90% of free GPU memory "
          "(CPU backend: half the RAM, or of the container's memory limit if less)");
ABSL_FLAG(int64_t, tenant_quota_mib, 0, "memory for held tensors per tenant; 0 = the budget");
ABSL_FLAG(int64_t, max_tensor_mib, kDefaults.max_tensor_bytes >> 20,
          "largest tensor Upload accepts, MiB");
ABSL_FLAG(int64_t, max_tensors, kDefaults.max_tensors,
          "tensors held at once, all tenants (each costs 0.6-1.5 KB of host memory besides "
          "its bytes); past it Upload and kept outputs are RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_tensors_per_tenant, kDefaults.max_tensors_per_tenant,
          "tensors one tenant may hold at once (empty ones too), so no tenant can fill "
          "--max_tensors alone; 0 = --max_tensors divided by the tenants in --token_file, "
          "at most 4 (an open server: all of it)");
ABSL_FLAG(int64_t, inflight_mib, 0,
          "host memory for the inline tensors of calls accepted and not yet answered (queued "
          "or running) and the messages of Uploads and Downloads under way; a call past it "
          "is RESOURCE_EXHAUSTED (a call alone always fits); "
          "also gRPC's buffers, at least 2 x --max_message_bytes: requests past them are "
          "refused, not buffered, and replies sent but not taken keep calls out once they "
          "fill them; 0 = a quarter of the RAM, or of the container's memory limit if less");
ABSL_FLAG(double, tenant_inflight_share, kDefaults.tenant_inflight_share,
          "the part of --inflight_mib one tenant may hold, 0..1 (a tenant holding nothing may "
          "still make one call of any size that fits), so one whose client stops taking "
          "replies cannot starve the others; 0 = 1 / the tenants in --token_file, at most 4 "
          "(an open server: all of it)");
ABSL_FLAG(int64_t, malloc_retain_mib, kDefaults.malloc_retain_bytes >> 20,
          "keep up to this much freed heap memory for reuse instead of returning it to the "
          "OS, and serve large blocks from the heap: large requests then skip page faults; "
          "0 = glibc's defaults; the sweeper gives back what the process keeps past it");
ABSL_FLAG(int, malloc_arenas, kDefaults.malloc_arenas,
          "heap arenas (glibc's M_ARENA_MAX): each keeps its own freed memory, so fewer bound "
          "the memory kept sooner; 0 = glibc's default (8 per core)");
ABSL_FLAG(double, idle_expiry_s, kDefaults.idle_expiry_seconds,
          "held tensors unused this long are freed; 0 = never");
ABSL_FLAG(bool, allow_shared_memory, kDefaults.allow_shared_memory,
          "serve RegisterSharedMemory: clients on this node may then name POSIX shared memory "
          "(opened with the server's permissions) or CUDA IPC memory for inputs and outputs; "
          "each tenant sees only its own regions");
ABSL_FLAG(int64_t, max_shm_regions_per_tenant, kDefaults.max_shm_regions_per_tenant,
          "shared-memory regions one tenant may hold at once (1..4096)");
ABSL_FLAG(int64_t, shm_tenant_quota_mib, 0,
          "bytes of shared memory one tenant may register, MiB (pinned on the CUDA backend); "
          "0 = half the RAM, or of the container's memory limit if less");
ABSL_FLAG(double, shm_idle_expiry_s, kDefaults.shm_idle_expiry_seconds,
          "shared-memory regions unused this long are unregistered (and unmapped once no call "
          "uses them), so a client that vanished leaves nothing mapped; 0 = never");
ABSL_FLAG(double, stall_timeout_s, kDefaults.stall_timeout_seconds,
          "a call waiting on its client (an Upload's messages, a Download's chunks, a reply "
          "not taken) longer, all its waits together, than this plus 1 s per MiB it has moved "
          "and may move in the message awaited (an Upload's: the largest it could be) is "
          "cancelled and its memory returned: clients must keep to 1 MiB/s on average after "
          "this grace. A kept output or upload whose reply left less than 1 s before its "
          "call's deadline (it may have reached no one) is freed after this long unless a call "
          "names it; 0 = never");
ABSL_FLAG(double, arrival_timeout_s, kDefaults.arrival_timeout_seconds,
          "a connection with no call being served (its requests still arriving, or none) "
          "that receives less than 1 MiB/s for this long, plus 1 s per MiB it did receive, "
          "is closed: gRPC gives a request no deadline to arrive in. Idle connections are "
          "sent GOAWAY after half of it; 0 = never");
ABSL_FLAG(int64_t, max_connections, kDefaults.max_connections,
          "client connections at once; past it a new connection is closed at once. At most "
          "half the file descriptors left at start-up (the rest: refused connections gRPC has "
          "yet to free, and the listen backlog): out of descriptors, gRPC would stop "
          "accepting for good");
ABSL_FLAG(double, handshake_timeout_s, kDefaults.handshake_timeout_seconds,
          "a new connection that has not sent HTTP/2's preface and settings (and finished "
          "its TLS handshake) this soon is closed");
ABSL_FLAG(int64_t, max_streams_per_connection, kDefaults.max_streams_per_connection,
          "calls one connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS; a "
          "client past it waits). With --max_connections it bounds the requests still "
          "arriving, which gRPC holds (about 11 KB each, and their bytes within gRPC's "
          "memory quota) until they are whole");
ABSL_FLAG(int64_t, stream_max_inflight, kDefaults.stream_max_inflight,
          "Execute: requests one stream may have read and not yet answered, 1..65536; at "
          "the bound the server reads no more of that stream until a response has gone");

int main(int argc, char** argv) {
  fusebox::CatchShutdownSignals();
  // Debian builds absl without NDEBUG, which leaves Mutex deadlock detection on: a graph update
  // on every lock of every absl::Mutex, gRPC's included (~3% of the server's CPU per small call).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/main.cc");
  };
  usage.normalize_filename = [](absl::string_view f) {
    const size_t at = f.rfind("server/");
    return std::string(at == absl::string_view::npos ? f : f.substr(at));
  };
  // absl's own --version text says "Debug build" whenever absl itself was built without
  // NDEBUG, whatever this binary is: name the version, commit and build type of this build.
  usage.version_string = [] {
    return std::string("fusebox-server " FUSEBOX_VERSION " (commit " FUSEBOX_COMMIT ", "
                       FUSEBOX_BUILD_TYPE " build)\n");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "GeLU, softmax, row sum and matmul+ReLU as a gRPC service "
      "(fusebox.v1.KernelService), on a GPU when one is usable, else on the CPU.\n"
      "Usage: fusebox-server [--address=0.0.0.0:50051] [--backend=auto] "
      "[--tls_cert=CRT --tls_key=KEY [--tls_client_ca=CA]] [flags]");
  absl::ParseCommandLine(argc, argv);

  fusebox::ServerOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  o.backend.kind = absl::GetFlag(FLAGS_backend);
  o.backend.cuda_module = absl::GetFlag(FLAGS_cuda_module);
  o.backend.cpu.workers = absl::GetFlag(FLAGS_workers);
  const int64_t queue_capacity = std::max<int64_t>(absl::GetFlag(FLAGS_queue_capacity), 0);
  o.backend.cpu.queue_capacity = static_cast<size_t>(queue_capacity);
  o.backend.cuda.queue_capacity = o.backend.cpu.queue_capacity;
  o.backend.cuda.streams = absl::GetFlag(FLAGS_streams);
  o.backend.cuda.device = absl::GetFlag(FLAGS_cuda_device);
  o.backend.cuda.kernel_gate = absl::GetFlag(FLAGS_kernel_gate);
  o.backend.cuda.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.backend.cpu.copy_threads = o.backend.cuda.copy_threads = absl::GetFlag(FLAGS_copy_threads);
  {
    const int64_t kib = absl::GetFlag(FLAGS_run_here_kib);
    const size_t here = kib <= 0 ? 0 : static_cast<size_t>(std::min<int64_t>(kib, int64_t{1} << 30)) << 10;
    o.backend.cpu.run_here_bytes = o.backend.cuda.run_here_bytes = here;
  }
  {
    fusebox::BatchOptions batch;
    batch.enabled = absl::GetFlag(FLAGS_batching);
    const int64_t kib = absl::GetFlag(FLAGS_batch_max_kib);
    batch.max_call_bytes = kib <= 0 ? 0 : static_cast<size_t>(std::min<int64_t>(kib, 1 << 20)) << 10;
    batch.max_batch_bytes = std::max(batch.max_batch_bytes, batch.max_call_bytes);
    batch.wait_us = absl::GetFlag(FLAGS_batch_wait_us);
    o.backend.cpu.batch = o.backend.cuda.batch = batch;
  }
  // MiB become bytes here; a value out of range (negative, or past int64 once in bytes)
  // becomes -1 (SIZE_MAX for staging), which CheckOptions refuses with the flag's range.
  constexpr int64_t kMaxMib = std::numeric_limits<int64_t>::max() >> 20;
  auto bytes = [](int64_t mib) { return mib >= 0 && mib <= kMaxMib ? mib << 20 : int64_t{-1}; };
  const int64_t staging = bytes(absl::GetFlag(FLAGS_staging_mib));
  o.backend.cuda.staging_bytes = staging < 0 ? SIZE_MAX : static_cast<size_t>(staging);
  o.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  o.shutdown_notice_seconds = absl::GetFlag(FLAGS_shutdown_notice_s);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.replica_id = absl::GetFlag(FLAGS_replica_id);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.tls_reload_seconds = absl::GetFlag(FLAGS_tls_reload_s);
  o.store_budget_bytes = bytes(absl::GetFlag(FLAGS_store_budget_mib));
  o.tenant_quota_bytes = bytes(absl::GetFlag(FLAGS_tenant_quota_mib));
  o.max_tensor_bytes = bytes(absl::GetFlag(FLAGS_max_tensor_mib));
  o.max_tensors = absl::GetFlag(FLAGS_max_tensors);
  o.max_tensors_per_tenant = absl::GetFlag(FLAGS_max_tensors_per_tenant);
  o.inflight_bytes = bytes(absl::GetFlag(FLAGS_inflight_mib));
  o.tenant_inflight_share = absl::GetFlag(FLAGS_tenant_inflight_share);
  o.idle_expiry_seconds = absl::GetFlag(FLAGS_idle_expiry_s);
  o.stall_timeout_seconds = absl::GetFlag(FLAGS_stall_timeout_s);
  o.malloc_retain_bytes = bytes(absl::GetFlag(FLAGS_malloc_retain_mib));
  // A quarter of what the heap may keep holds the CPU backend's large buffers (host_pool.h).
  o.backend.cpu.host_pool_bytes = static_cast<size_t>(std::max<int64_t>(o.malloc_retain_bytes, 0) / 4);
  o.malloc_arenas = absl::GetFlag(FLAGS_malloc_arenas);
  o.max_connections = absl::GetFlag(FLAGS_max_connections);
  o.handshake_timeout_seconds = absl::GetFlag(FLAGS_handshake_timeout_s);
  o.arrival_timeout_seconds = absl::GetFlag(FLAGS_arrival_timeout_s);
  o.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  o.allow_shared_memory = absl::GetFlag(FLAGS_allow_shared_memory);
  o.max_shm_regions_per_tenant = absl::GetFlag(FLAGS_max_shm_regions_per_tenant);
  o.shm_tenant_quota_bytes = bytes(absl::GetFlag(FLAGS_shm_tenant_quota_mib));
  o.shm_idle_expiry_seconds = absl::GetFlag(FLAGS_shm_idle_expiry_s);
  o.stream_max_inflight = absl::GetFlag(FLAGS_stream_max_inflight);

  absl::Status checked = fusebox::CheckOptions(o);
  const std::string impl = absl::GetFlag(FLAGS_matmul_impl);
  if (impl == "cublaslt") {
    o.backend.cuda.default_matmul = fusebox::MatmulImpl::kCublasLt;
  } else if (impl == "tiled") {
    o.backend.cuda.default_matmul = fusebox::MatmulImpl::kTiled;
  } else {
    checked = absl::InvalidArgumentError("--matmul_impl must be cublaslt or tiled");
  }
  if (!checked.ok()) {
    std::fprintf(stderr, "fusebox-server: %s (see --help)\n",
                 std::string(checked.message()).c_str());
    return 2;
  }

  fusebox::ConfigureHeap(o.malloc_retain_bytes, o.malloc_arenas);
  const absl::Status s = fusebox::RunServer(o);
  if (!s.ok()) {
    std::fprintf(stderr, "fusebox-server: %s\n", s.ToString().c_str());
    // INVALID_ARGUMENT at start-up is a flag this host cannot honour: a usage error too.
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
