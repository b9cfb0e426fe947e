// RegisterSharedMemory, UnregisterSharedMemory and ListSharedMemory: a tenant's shared-memory
// regions (server/core/shared_memory.h). Each answers on the calling thread: registering maps
// the object (and on CUDA pins it, which touches every page: about 0.1-0.3 s per GiB), the
// others only look at the registry.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/status_util.h"

namespace fusebox {
namespace {

void FillRegion(const SharedRegion& r, v1::SharedMemoryInfo* out) {
  out->set_name(r.name);
  if (r.kind == SharedRegion::Kind::kSystem) {
    auto* sys = out->mutable_system();
    sys->set_key(r.key);
    sys->set_offset(r.offset);
    sys->set_size(r.size);
  } else {
    auto* cuda = out->mutable_cuda();
    cuda->set_device(r.device);
    cuda->set_size(r.size);
  }
  out->set_pinned(r.pinned());
  out->set_registered_unix_ms(r.created_unix_ms);
  const int64_t idle_ms = (SteadyNowNs() - r.last_used_ns.load()) / 1000000;
  out->set_last_used_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count() -
      idle_ms);
}

absl::Status NoRegistry() {
  return absl::FailedPreconditionError(
      "shared memory is off on this server: start it with --allow_shared_memory to use it "
      "(clients on the same node only)");
}

}  // namespace

grpc::ServerUnaryReactor* KernelServiceImpl::RegisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* wire,
                                                                  grpc::ByteBuffer* reply) {
  v1::RegisterSharedMemoryRequest req;
  return AnswerUnary("RegisterSharedMemory", ctx, wire, &req, [&](const RequestContext& c) {
    if (shm_ == nullptr) return NoRegistry();
    absl::StatusOr<std::shared_ptr<SharedRegion>> r;
    switch (req.kind_case()) {
      case v1::RegisterSharedMemoryRequest::kSystem:
        r = shm_->RegisterSystem(c.tenant, req.name(), req.system().key(),
                                 req.system().offset(), req.system().size());
        break;
      case v1::RegisterSharedMemoryRequest::kCuda:
        r = shm_->RegisterCuda(c.tenant, req.name(), req.cuda().ipc_handle(),
                               req.cuda().device(), req.cuda().size());
        break;
      default:
        r = shm_->Allowed().ok()
                ? absl::InvalidArgumentError("set system (POSIX shared memory) or cuda (an IPC handle)")
                : shm_->Allowed();
    }
    if (!r.ok()) return r.status();
    v1::RegisterSharedMemoryResponse resp;
    FillRegion(**r, resp.mutable_region());
    SerializeReply(resp, reply);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KernelServiceImpl::UnregisterSharedMemory(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire, grpc::ByteBuffer* reply) {
  v1::UnregisterSharedMemoryRequest req;
  return AnswerUnary("UnregisterSharedMemory", ctx, wire, &req, [&](const RequestContext& c) {
    if (shm_ == nullptr) return NoRegistry();
    absl::Status status = shm_->Unregister(c.tenant, req.name());
    if (status.ok()) SerializeReply(v1::UnregisterSharedMemoryResponse(), reply);
    return status;
  });
}

grpc::ServerUnaryReactor* KernelServiceImpl::ListSharedMemory(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* wire,
                                                              grpc::ByteBuffer* reply) {
  v1::ListSharedMemoryRequest req;
  return AnswerUnary("ListSharedMemory", ctx, wire, &req, [&](const RequestContext& c) {
    if (shm_ == nullptr) return NoRegistry();
    absl::Status status = shm_->Allowed();
    if (!status.ok()) return status;
    // A tenant holds at most --max_shm_regions_per_tenant regions: the reply stays small.
    v1::ListSharedMemoryResponse resp;
    if (!req.name().empty()) {
      auto r = shm_->Get(c.tenant, req.name());
      if (r.ok()) FillRegion(**r, resp.add_regions());
      status = r.status();
    } else {
      for (const auto& r : shm_->List(c.tenant)) FillRegion(*r, resp.add_regions());
    }
    if (status.ok()) {
      resp.set_used_bytes(shm_->TenantBytes(c.tenant));
      resp.set_quota_bytes(shm_->limits().tenant_quota_bytes);
      resp.set_max_regions(shm_->limits().max_regions_per_tenant);
      SerializeReply(resp, reply);
    }
    return status;
  });
}

}  // namespace fusebox
