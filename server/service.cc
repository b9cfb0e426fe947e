// KernelServiceImpl: see service.h. One request's path: method -> Prepare*
// (validate, shape the response's output in place) -> Backend::Submit ->
// backend thread -> done callback -> timing + metrics -> Finish.
#include "server/service.h"

#include <chrono>
#include <utility>

#include "server/status_util.h"

namespace fusebox {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void FillTiming(const OpTiming& t, const Backend& backend, v1::Timing* out) {
  out->set_queue_us(t.queue_us);
  out->set_copy_in_us(t.copy_in_us);
  out->set_kernel_us(t.kernel_us);
  out->set_copy_out_us(t.copy_out_us);
  out->set_total_us(t.total_us);
  out->set_backend(backend.name());
  out->set_device(backend.device());
  out->set_stream(t.stream);
}

}  // namespace

KernelServiceImpl::KernelServiceImpl(Backend* backend, Metrics* metrics, RequestLimits limits)
    : backend_(backend), metrics_(metrics), limits_(limits) {}

grpc::ServerUnaryReactor* KernelServiceImpl::Gelu(grpc::CallbackServerContext* ctx,
                                                  const v1::GeluRequest* req,
                                                  v1::GeluResponse* resp) {
  const int64_t t0 = NowNs();
  auto p = PrepareGelu(*req, limits_, resp->mutable_output()->mutable_tensor());
  return Run(ctx, "Gelu", Op::kGelu, t0, std::move(p), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::Softmax(grpc::CallbackServerContext* ctx,
                                                     const v1::SoftmaxRequest* req,
                                                     v1::SoftmaxResponse* resp) {
  const int64_t t0 = NowNs();
  auto p = PrepareSoftmax(*req, limits_, resp->mutable_output()->mutable_tensor());
  return Run(ctx, "Softmax", Op::kSoftmax, t0, std::move(p), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::RowSum(grpc::CallbackServerContext* ctx,
                                                    const v1::RowSumRequest* req,
                                                    v1::RowSumResponse* resp) {
  const int64_t t0 = NowNs();
  auto p = PrepareRowSum(*req, limits_, resp->mutable_output()->mutable_tensor());
  return Run(ctx, "RowSum", Op::kRowSum, t0, std::move(p), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::MatmulRelu(grpc::CallbackServerContext* ctx,
                                                        const v1::MatmulReluRequest* req,
                                                        v1::MatmulReluResponse* resp) {
  const int64_t t0 = NowNs();
  auto p = PrepareMatmulRelu(*req, limits_, resp->mutable_output()->mutable_tensor());
  return Run(ctx, "MatmulRelu", Op::kMatmulRelu, t0, std::move(p), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::Run(grpc::CallbackServerContext* ctx,
                                                 const char* method, Op op, int64_t arrived_ns,
                                                 absl::StatusOr<PreparedCall> prepared,
                                                 v1::Timing* timing) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (metrics_) metrics_->CallStarted();
  CallRecord record;
  record.method = method;
  record.op = op;
  if (!prepared.ok()) {
    record.grpc_code = static_cast<int>(prepared.status().code());
    if (metrics_) {
      metrics_->RecordCall(record);
      metrics_->CallFinished();
    }
    reactor->Finish(ToGrpcStatus(prepared.status()));
    return reactor;
  }
  record.dtype = prepared->call.dtype;
  record.bytes_in = prepared->bytes_in;
  record.bytes_out = prepared->bytes_out;
  if (prepared->trivial) {
    OpTiming t;
    t.total_us = (NowNs() - arrived_ns) / 1e3;
    FillTiming(t, *backend_, timing);
    record.ran = true;
    record.timing = t;
    if (metrics_) {
      metrics_->RecordCall(record);
      metrics_->CallFinished();
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  backend_->Submit(prepared->call, arrived_ns,
                   [this, reactor, timing, record](absl::Status s, const OpTiming& t) mutable {
                     record.grpc_code = static_cast<int>(s.code());
                     if (s.ok()) {
                       FillTiming(t, *backend_, timing);
                       record.ran = true;
                       record.timing = t;
                     } else {
                       record.bytes_out = 0;
                     }
                     if (metrics_) {
                       metrics_->RecordCall(record);
                       metrics_->CallFinished();
                     }
                     reactor->Finish(ToGrpcStatus(s));
                   });
  return reactor;
}

}  // namespace fusebox
