// The in-process server of the gRPC-facing harnesses, and their checks on it (fuzz_server.h).
#include "tests/fuzz/fuzz_server.h"

#include <chrono>
#include <thread>
#include <utility>

#include "tests/fuzz/fuzz_check.h"

namespace fusebox {

FuzzServer& TheFuzzServer(const char* harness) {
  static FuzzServer* w = [harness] {
    auto* w = new FuzzServer();
    w->harness = harness;
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.backend.kind = "cpu";
    o.backend.cpu.workers = 2;
    o.cpu_threads = 1;
    o.max_message_bytes = 1 << 20;
    o.store_budget_bytes = 4 << 20;
    o.max_tensor_bytes = 1 << 20;
    o.inflight_bytes = 8 << 20;
    o.idle_expiry_seconds = 0;
    auto s = FuseboxServer::Start(o);
    FUZZ_CHECK_AS(harness, s.ok(), "%s", s.status().ToString().c_str());
    w->server = *std::move(s);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    w->stub = v1::KernelService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(w->server->port()), grpc::InsecureChannelCredentials(),
        args));
    return w;
  }();
  return *w;
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    default: return "another code";
  }
}

void CheckStoreEmpty(FuzzServer& w, const char* tenant, const char* after) {
  TensorStore& store = w.server->store();
  for (int i = 0; i < 1000; ++i) {
    if (store.stats().count == 0 && store.TenantUsedBytes(tenant) == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FUZZ_CHECK_AS(w.harness, false, "the store still holds %lld tensors, %lld bytes, 10 s after %s",
                static_cast<long long>(store.stats().count),
                static_cast<long long>(store.TenantUsedBytes(tenant)), after);
}

}  // namespace fusebox
