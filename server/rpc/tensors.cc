// FreeTensor and ListTensors: what a tenant holds.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/service_parts.h"
#include "server/rpc/status_util.h"

namespace fusebox {
namespace {

// A ListTensors reply smaller than this takes no in-flight budget.
constexpr int64_t kSmallReplyBytes = 64 << 10;

}  // namespace

grpc::ServerUnaryReactor* KernelServiceImpl::FreeTensor(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* wire,
                                                        grpc::ByteBuffer* reply) {
  v1::FreeTensorRequest req;
  return AnswerUnary("FreeTensor", ctx, wire, &req, [&](const RequestContext& c) {
    if (store_ == nullptr) return NoStore();
    auto freed = store_->Free(c.tenant, req.handle());
    if (!freed.ok()) return freed.status();
    v1::FreeTensorResponse resp;
    resp.set_freed_bytes(*freed);
    SerializeReply(resp, reply);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KernelServiceImpl::ListTensors(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* wire,
                                                         grpc::ByteBuffer* reply) {
  StartOther();
  // A listing can be large (a tenant's every tensor and shape): it holds in-flight budget for
  // itself and its serialized copy, and the stall watch ends it if the client does not take it.
  auto* reactor = new OpReactor(store_, &stalls_, inflight_.get(), ctx, reply);
  auto [req, resp] = reactor->Messages<v1::ListTensorsRequest, v1::ListTensorsResponse>();
  std::shared_ptr<void> held;
  std::string tenant;
  const grpc::Status status = ListInto(*ctx, wire, req, resp, &held, &tenant);
  reactor->Hold(std::move(held), std::move(tenant));
  RecordOther("ListTensors", status, 0, 0);
  reactor->Reply(status);
  return reactor;
}

grpc::Status KernelServiceImpl::ListInto(const grpc::CallbackServerContext& ctx,
                                         const grpc::ByteBuffer* wire,
                                         v1::ListTensorsRequest* req_msg,
                                         v1::ListTensorsResponse* resp,
                                         std::shared_ptr<void>* held,
                                         std::string* tenant) const {
  auto c = Context(ctx);
  if (!c.ok()) return ToGrpcStatus(c.status());
  *tenant = c->tenant;
  if (absl::Status parsed = ParseRequest(wire, req_msg); !parsed.ok()) return ToGrpcStatus(parsed);
  const v1::ListTensorsRequest& req = *req_msg;
  if (store_ == nullptr) return grpc::Status::OK;  // nothing held
  std::vector<std::shared_ptr<StoredTensor>> tensors;
  if (!req.handle().empty()) {
    auto t = store_->Get(c->tenant, req.handle());
    if (!t.ok()) return ToGrpcStatus(t.status());
    tensors.push_back(*std::move(t));
  } else {
    tensors = store_->List(c->tenant);
  }
  // The reply's size at most (a TensorInfo: its handle, 10 bytes an axis, 64 for the rest),
  // checked and reserved before a byte of it is built.
  int64_t bytes = 64;
  for (const auto& t : tensors) {
    bytes += static_cast<int64_t>(t->handle.size() + 10 * t->shape.size()) + 64;
  }
  if (bytes > limits_.max_output_bytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the listing of ", tensors.size(), " tensors could take ",
                                     bytes, " bytes, over the ", limits_.max_output_bytes,
                                     " a reply may hold; ask for one handle at a time"));
  }
  if (bytes >= kSmallReplyBytes) {  // a listing of a few tensors takes no budget
    auto token =
        ReserveTransfer(c->tenant, 2 * bytes, "listing", ", or ask for one handle at a time");
    if (!token.ok()) return ToGrpcStatus(token.status());
    *held = *std::move(token);
  }
  for (const auto& t : tensors) FillInfo(*t, resp->add_tensors());
  resp->set_used_bytes(store_->TenantUsedBytes(c->tenant));
  resp->set_quota_bytes(store_->limits().tenant_quota_bytes);
  return grpc::Status::OK;
}

}  // namespace fusebox
