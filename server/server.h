// Starts fusebox-server from its options and runs it until SIGTERM/SIGINT:
// health goes NOT_SERVING, in-flight calls get `drain_seconds` to finish,
// then the backend stops and RunServer returns.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/backend_loader.h"

namespace fusebox {

struct ServerOptions {
  std::string address = "0.0.0.0:50051";  // host:port; port 0 picks a free one
  BackendChoice backend;                  // --backend and its pool sizes
  int cpu_threads = 0;                    // CPU kernels' threads; 0 = all cores
  int64_t max_message_bytes = (int64_t{1} << 30) + (int64_t{1} << 20);  // in and out
  double drain_seconds = 30;              // grace for in-flight calls at shutdown
  std::string metrics_address;            // host:port for /metrics; empty = off
};

// Blocks until a shutdown signal has been handled. The caller must have
// blocked SIGTERM and SIGINT in every thread (BlockShutdownSignals) first.
absl::Status RunServer(const ServerOptions& options);

// Call at the top of main, before any thread starts.
void BlockShutdownSignals();

}  // namespace fusebox
