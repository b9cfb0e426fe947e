// RunServer: see server.h.
#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/parallel.h"
#include "server/log.h"
#include "server/service.h"

namespace fusebox {

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::Status RunServer(const ServerOptions& o) {
  if (o.max_message_bytes <= 0 || o.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes must be in 1..", INT_MAX, " (gRPC's limit)"));
  }
  if (o.cpu_threads > 0) cpu::SetCpuThreads(o.cpu_threads);

  auto backend = CreateBackend(o.backend);
  if (!backend.ok()) return backend.status();

  std::unique_ptr<Metrics> metrics;
  if (!o.metrics_address.empty()) {
    auto m = Metrics::Start(o.metrics_address, backend->get());
    if (!m.ok()) return m.status();
    metrics = std::move(*m);
  }

  RequestLimits limits;
  limits.max_output_bytes = o.max_message_bytes - 4096;  // room for the rest of the reply
  KernelServiceImpl service(backend->get(), metrics.get(), limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o.address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    (*backend)->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.address));
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  const std::string host = o.address.substr(0, o.address.rfind(':'));
  std::printf("fusebox-server listening on %s:%d backend=%s device=\"%s\"\n", host.c_str(), port,
              (*backend)->name().c_str(), (*backend)->device().c_str());
  std::fflush(stdout);
  if (!o.metrics_address.empty()) Log("metrics on http://%s/metrics", o.metrics_address.c_str());

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  Log("%s: draining (up to %.0f s)", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.drain_seconds);

  server->GetHealthCheckService()->SetServingStatus(false);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.drain_seconds * 1000));
  server->Shutdown(deadline);  // returns once every call has finished or been cancelled
  (*backend)->Shutdown();
  metrics.reset();
  Log("stopped");
  return absl::OkStatus();
}

}  // namespace fusebox
