// KernelServiceImpl's shared parts (see service.h): who is calling, the in-flight budget for
// transfers (and the upload streams' message budget and end), the one body of the small unary
// RPCs that run no op (AnswerUnary), and their metrics. The RPCs live one concern a file:
// ops.cc (the four ops), execute.cc, upload.cc, ranged_upload.cc, download.cc, tensors.cc
// (FreeTensor, ListTensors), shared_memory.cc (the shared-memory registry).
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/service_parts.h"
#include "server/rpc/status_util.h"

namespace fusebox {

void FillInfo(const StoredTensor& t, v1::TensorInfo* out) {
  out->set_handle(t.handle);
  out->set_dtype(static_cast<v1::DType>(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
  out->set_size_bytes(t.bytes);
  out->set_created_unix_ms(t.created_unix_ms);
  const int64_t idle_ms = (SteadyNowNs() - t.last_used_ns.load()) / 1000000;
  out->set_last_used_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count() -
      idle_ms);
}

void OpReactor::Reply(const absl::Status& s) { Reply(ToGrpcStatus(s)); }

void OpReactor::Reply(const grpc::Status& s) {
  int64_t bytes = 0;
  if (s.ok()) {
    bytes = in_place_ ? SerializeReply(*response_, in_place_tensor_, std::move(in_place_),
                                       in_place_bytes_, reply_)
                      : SerializeReply(*response_, reply_);
    if (bytes < 0) return Reply(grpc::Status(grpc::StatusCode::INTERNAL, "the reply could not be built"));
  }
  in_place_.reset();
  request_.reset();
  response_.reset();
  payloads_ = ReceivedPayloads();
  if (inflight_ != nullptr && bytes > 0) sending_ = inflight_->Sending(bytes, caller_);
  held_.reset();
  stall_.Finishing(bytes);
  Finish(s);
}

KernelServiceImpl::KernelServiceImpl(Backend* backend, Metrics* metrics, TensorStore* store,
                                     const Authenticator* auth, RequestLimits limits,
                                     SharedMemoryRegistry* shm)
    : backend_(backend),
      metrics_(metrics),
      store_(store),
      auth_(auth),
      limits_(limits),
      inflight_(limits.max_inflight_bytes > 0
                    ? std::make_unique<InflightBytes>(limits.max_inflight_bytes,
                                                      limits.max_sending_bytes,
                                                      limits.max_tenant_inflight_bytes)
                    : nullptr),
      stalls_(limits.stall_timeout_seconds),
      shm_(shm),
      uploads_(store == nullptr ? nullptr
                                : std::make_unique<PendingUploads>(
                                      store, limits.stall_timeout_seconds > 0
                                                 ? limits.stall_timeout_seconds
                                                 : store->limits().idle_expiry_seconds)) {}

int KernelServiceImpl::CancelStalled() {
  const int64_t now = SteadyNowNs();
  if (uploads_) uploads_->ExpireIdle(now);
  return stalls_.CancelStalled(now);
}

int64_t KernelServiceImpl::PendingUploadCount() const {
  return uploads_ ? uploads_->count() : 0;
}

absl::StatusOr<std::shared_ptr<void>> KernelServiceImpl::ReserveTransfer(
    const std::string& tenant, int64_t bytes, const char* what, const char* advice) const {
  if (inflight_ == nullptr) return std::shared_ptr<void>();
  absl::StatusOr<std::shared_ptr<void>> token = inflight_->Reserve(bytes, tenant, what);
  if (!token.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(token.status().message(), advice));
  }
  return token;
}

absl::Status KernelServiceImpl::HoldMessage(const std::string& tenant, int64_t n,
                                            const char* what, StreamMessage* m) const {
  if (n <= m->budget_bytes) return absl::OkStatus();
  m->budget.reset();
  auto token = ReserveTransfer(tenant, n, what, ", or send smaller messages");
  if (!token.ok()) return token.status();
  m->budget = *std::move(token);
  m->budget_bytes = n;
  return absl::OkStatus();
}

void KernelServiceImpl::EndUploadStream(grpc::ServerReadReactor<grpc::ByteBuffer>* reactor,
                                        StallWatch::Call* stall, const char* method,
                                        const grpc::Status& s, int64_t written,
                                        google::protobuf::Message* msg, StreamMessage* m) const {
  RecordOther(method, s, written, 0);
  msg->Clear();
  m->wire.Clear();
  m->budget.reset();
  stall->Finishing();
  reactor->Finish(s);
}

absl::Status KernelServiceImpl::BeforeCommit(const grpc::CallbackServerContext& ctx,
                                             StoredTensor* t) const {
  constexpr auto kUnsureBeforeDeadline = std::chrono::seconds(1);
  const auto left = ctx.deadline() - std::chrono::system_clock::now();
  if (left <= std::chrono::system_clock::duration::zero()) {
    return absl::DeadlineExceededError(
        "the call passed its deadline before its result could be kept; nothing was kept");
  }
  if (left < kUnsureBeforeDeadline && limits_.stall_timeout_seconds > 0) {
    t->unclaimed_until_ns =
        SteadyNowNs() + static_cast<int64_t>(limits_.stall_timeout_seconds * 1e9);
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestContext> KernelServiceImpl::Context(
    const grpc::CallbackServerContext& ctx) const {
  auto tenant = auth_->TenantOf(ctx);
  if (!tenant.ok()) return tenant.status();
  RequestContext c;
  c.limits = limits_;
  c.store = store_;
  c.inflight = inflight_.get();
  c.shm = shm_;
  c.tenant = *std::move(tenant);
  return c;
}

absl::Status NoStore() { return absl::UnimplementedError("this server holds no tensors"); }

grpc::ServerUnaryReactor* KernelServiceImpl::AnswerUnary(
    const char* method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
    google::protobuf::Message* req, absl::FunctionRef<absl::Status(const RequestContext&)> answer) {
  StartOther();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status status;
  auto c = Context(*ctx);
  if (!c.ok()) {
    status = c.status();
  } else if (status = ParseRequest(wire, req); status.ok()) {
    status = answer(*c);
  }
  const grpc::Status s = ToGrpcStatus(status);
  RecordOther(method, s, 0, 0);
  reactor->Finish(s);
  return reactor;
}

void KernelServiceImpl::StartOther() const {
  if (metrics_) metrics_->CallStarted();
}

void KernelServiceImpl::RecordOther(const char* method, const grpc::Status& status,
                                    int64_t bytes_in, int64_t bytes_out) const {
  if (metrics_ == nullptr) return;
  CallRecord r;
  r.method = method;
  r.grpc_code = static_cast<int>(status.error_code());
  r.bytes_in = bytes_in;
  r.bytes_out = bytes_out;
  metrics_->RecordCall(r);
  metrics_->CallFinished();
}

}  // namespace fusebox
