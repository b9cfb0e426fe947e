// fusebox-server assembled from its options: backend, tensor store, auth,
// metrics, gRPC (KernelService + health + reflection). RunServer serves until
// SIGTERM/SIGINT: health goes NOT_SERVING while calls are still served for
// `shutdown_notice_seconds` (so load balancers and readiness probes move
// traffic away), then new calls are refused, in-flight calls get
// `drain_seconds` to finish, and the backend stops. Tests use FuseboxServer
// in-process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backend_loader.h"
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
  // Tensor store; a budget of 0 = automatic (90% of free GPU memory at start,
  // half of HostMemoryBytes() on the CPU backend); a quota of 0 = the budget.
  int64_t store_budget_bytes = 0;
  int64_t tenant_quota_bytes = 0;
  int64_t max_tensor_bytes = StoreLimits{}.max_tensor_bytes;
  int64_t max_tensors = StoreLimits{}.max_tensors;  // held at once, all tenants
  double idle_expiry_seconds = StoreLimits{}.idle_expiry_seconds;  // 0 = never
  // Inline tensors of calls in flight (InflightBytes); 0 = a quarter of HostMemoryBytes().
  int64_t inflight_bytes = 0;
  // A call waiting this long on its client (the next Upload message, a Download chunk or a
  // reply not taken), plus 1 s per MiB in transit, is cancelled (StallWatch); 0 = never.
  double stall_timeout_seconds = 120;
};

class FuseboxServer {
 public:
  static absl::StatusOr<std::unique_ptr<FuseboxServer>> Start(const ServerOptions& options);
  ~FuseboxServer();  // Shutdown(0) if still running

  int port() const;
  int metrics_port() const;  // where /metrics is served; 0 without a metrics_address
  const Backend& backend() const;
  TensorStore& store();
  // Health NOT_SERVING (calls still served for notice_seconds), then refuse
  // new calls, finish in-flight ones (cancelled after drain_seconds), stop the
  // backend. Idempotent: every caller returns once that is done.
  void Shutdown(double drain_seconds, double notice_seconds = 0);

 private:
  struct State;
  explicit FuseboxServer(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// The host memory this process may use: the RAM, or less where a cgroup says so
// (a container's memory limit): v2 memory.max or v1 memory.limit_in_bytes under
// `cgroup_root`, of the root and of this process's cgroups (`self_cgroup`).
int64_t HostMemoryBytes(const std::string& cgroup_root = "/sys/fs/cgroup",
                        const std::string& self_cgroup = "/proc/self/cgroup");

// Serves until SIGTERM or SIGINT (CatchShutdownSignals must have run), then
// drains and returns.
absl::Status RunServer(const ServerOptions& options);

// Installs the SIGTERM / SIGINT handler that RunServer waits on. A handler, not
// a blocked mask: threads started before main (OpenBLAS starts one in a library
// constructor) could not be masked, and a signal they took killed the process.
// Later signals while the server drains are absorbed. Call at the top of main.
void CatchShutdownSignals();

}  // namespace fusebox
