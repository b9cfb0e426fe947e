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
#include "server/core/tensor_store.h"
#include "server/options.h"

namespace fusebox {

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
