// The four op RPCs, and the one body (RunOp) that runs an op for them and for Execute's
// requests (execute.cc). One request's path: method -> UnaryOp -> RunOp -> its op's Prepare (validate, resolve
// handles, shape the output in place; server/core/request.h) -> Backend::Check ->
// Backend::Submit -> a backend thread -> done: commit a kept output, timing and metrics ->
// Finish. Requests arrive as wire bytes and are parsed here (messages.h). OpSpec below is the
// one place that ties a request type to its op.
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/service_parts.h"
#include "server/rpc/status_util.h"

namespace fusebox {
namespace {

void FillTiming(const OpTiming& t, const Backend& backend, v1::Timing* out) {
  out->set_queue_us(t.queue_us);
  out->set_copy_in_us(t.copy_in_us);
  out->set_launch_us(t.launch_us);
  out->set_kernel_us(t.kernel_us);
  out->set_copy_out_us(t.copy_out_us);
  out->set_total_us(t.total_us);
  out->set_backend(backend.name());
  out->set_device(backend.device());
  out->set_stream(t.stream);
}

// Each op's request type, its Op and the function that checks and prepares it.
template <typename Req>
struct OpSpec;
template <>
struct OpSpec<v1::GeluRequest> {
  static constexpr Op kOp = Op::kGelu;
  static constexpr auto Prepare = &PrepareGelu;
};
template <>
struct OpSpec<v1::SoftmaxRequest> {
  static constexpr Op kOp = Op::kSoftmax;
  static constexpr auto Prepare = &PrepareSoftmax;
};
template <>
struct OpSpec<v1::RowSumRequest> {
  static constexpr Op kOp = Op::kRowSum;
  static constexpr auto Prepare = &PrepareRowSum;
};
template <>
struct OpSpec<v1::MatmulReluRequest> {
  static constexpr Op kOp = Op::kMatmulRelu;
  static constexpr auto Prepare = &PrepareMatmulRelu;
};

}  // namespace

template <typename Req>
void KernelServiceImpl::RunOp(grpc::CallbackServerContext* ctx, int64_t arrived,
                              const absl::StatusOr<RequestContext>& caller, absl::Status parsed,
                              const Req& req, const InlinePayloads* payloads,
                              v1::TensorRef* output, v1::Timing* timing, OpSink* sink) {
  constexpr Op op = OpSpec<Req>::kOp;
  if (metrics_) metrics_->CallStarted();
  CallRecord record;
  record.method = OpName(op);
  record.op = op;
  // Ends the call: one place for timing, metrics and the reply. A kept output is committed
  // only while the caller still waits for its handle (BeforeCommit).
  auto finish = [this, ctx, sink, timing, output](CallRecord record, absl::Status s,
                                                  const OpTiming& t, PreparedCall* p) {
    if (s.ok()) s = SharedRegionsIntact(*p);  // a file truncated under the call
    if (s.ok() && p->kept_output) {
      s = sink->Cancelled()
              ? absl::CancelledError("the call was cancelled; its output was not kept")
              : BeforeCommit(*ctx, p->kept_output.get());
    }
    record.grpc_code = static_cast<int>(s.code());
    if (s.ok()) {
      if (p->kept_output) {
        store_->Commit(p->kept_output);
        output->set_handle(p->kept_output->handle);
        sink->Kept(*p->kept_output);
      } else if (p->inline_output) {
        sink->SendInPlace(&output->tensor(), std::move(p->inline_output), p->call.output_bytes);
      } else if (p->has_shared_output) {
        output->mutable_shared()->Swap(&p->shared_output);
      }
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
    sink->Reply(s);
  };

  absl::StatusOr<PreparedCall> prepared = absl::UnknownError("");
  std::string tenant;
  if (!caller.ok()) {
    prepared = caller.status();
  } else if (!parsed.ok()) {
    prepared = parsed;
  } else {
    tenant = caller->tenant;
    RequestContext context = *caller;
    context.payloads = payloads;
    context.backend = backend_;
    try {
      prepared = OpSpec<Req>::Prepare(req, context, output->mutable_tensor());
    } catch (const std::bad_alloc&) {  // an output buffer the host cannot give now
      output->Clear();
      prepared = absl::ResourceExhaustedError(
          "the server is out of host memory for this call's output; retry later or keep the "
          "output on the server");
    }
  }
  // A call the backend cannot run is refused before it waits in the queue; dropping the
  // prepared call gives back its kept output and its in-flight bytes at once.
  if (prepared.ok() && !prepared->trivial) {
    if (absl::Status s = backend_->Check(prepared->call); !s.ok()) {
      output->Clear();
      prepared = std::move(s);
    }
  }
  if (!prepared.ok()) {
    PreparedCall none;
    finish(record, prepared.status(), OpTiming{}, &none);
    return;
  }
  auto p = std::make_shared<PreparedCall>(*std::move(prepared));
  sink->Hold(std::move(p->inflight), std::move(tenant));
  record.dtype = p->call.dtype;
  record.bytes_in = p->bytes_in;
  record.bytes_out = p->bytes_out;
  if (p->trivial && p->trivial_bytes.empty()) {
    OpTiming t;
    t.total_us = (SteadyNowNs() - arrived) / 1e3;
    finish(record, absl::OkStatus(), t, p.get());
    return;
  }
  auto done = [finish, record, p](absl::Status s, const OpTiming& t) {
    finish(record, s, t, p.get());
  };
  // The sink outlives `done`: a unary reactor until its Finish, a stream until its last op
  // has answered.
  p->call.abandoned = [sink] { return sink->Cancelled(); };
  if (p->trivial) {  // a kept output whose value needs no kernel: copy it in
    backend_->SubmitWrite(p->kept_output->buffer.get(), 0, p->trivial_bytes.data(),
                          p->trivial_bytes.size(), arrived, std::move(done));
  } else {
    backend_->Submit(p->call, arrived, std::move(done));
  }
}

// Execute's requests reach RunOp from execute.cc.
template void KernelServiceImpl::RunOp<v1::GeluRequest>(
    grpc::CallbackServerContext*, int64_t, const absl::StatusOr<RequestContext>&, absl::Status,
    const v1::GeluRequest&, const InlinePayloads*, v1::TensorRef*, v1::Timing*, OpSink*);
template void KernelServiceImpl::RunOp<v1::SoftmaxRequest>(
    grpc::CallbackServerContext*, int64_t, const absl::StatusOr<RequestContext>&, absl::Status,
    const v1::SoftmaxRequest&, const InlinePayloads*, v1::TensorRef*, v1::Timing*, OpSink*);
template void KernelServiceImpl::RunOp<v1::RowSumRequest>(
    grpc::CallbackServerContext*, int64_t, const absl::StatusOr<RequestContext>&, absl::Status,
    const v1::RowSumRequest&, const InlinePayloads*, v1::TensorRef*, v1::Timing*, OpSink*);
template void KernelServiceImpl::RunOp<v1::MatmulReluRequest>(
    grpc::CallbackServerContext*, int64_t, const absl::StatusOr<RequestContext>&, absl::Status,
    const v1::MatmulReluRequest&, const InlinePayloads*, v1::TensorRef*, v1::Timing*, OpSink*);

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* KernelServiceImpl::UnaryOp(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* wire,
                                                     grpc::ByteBuffer* reply) {
  const int64_t arrived = SteadyNowNs();
  auto* reactor = new OpReactor(store_, &stalls_, inflight_.get(), ctx, reply);
  auto [req, resp] = reactor->Messages<Req, Resp>();
  absl::StatusOr<RequestContext> caller = Context(*ctx);
  absl::Status parsed =
      caller.ok() ? ParseRequest(wire, req, reactor->payloads()) : absl::OkStatus();
  RunOp<Req>(ctx, arrived, caller, std::move(parsed), *req, &reactor->payloads()->by_tensor,
             resp->mutable_output(), resp->mutable_timing(), reactor);
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Gelu(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req,
                                                  grpc::ByteBuffer* resp) {
  return UnaryOp<v1::GeluRequest, v1::GeluResponse>(ctx, req, resp);
}

grpc::ServerUnaryReactor* KernelServiceImpl::Softmax(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req,
                                                     grpc::ByteBuffer* resp) {
  return UnaryOp<v1::SoftmaxRequest, v1::SoftmaxResponse>(ctx, req, resp);
}

grpc::ServerUnaryReactor* KernelServiceImpl::RowSum(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req,
                                                    grpc::ByteBuffer* resp) {
  return UnaryOp<v1::RowSumRequest, v1::RowSumResponse>(ctx, req, resp);
}

grpc::ServerUnaryReactor* KernelServiceImpl::MatmulRelu(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* req,
                                                        grpc::ByteBuffer* resp) {
  return UnaryOp<v1::MatmulReluRequest, v1::MatmulReluResponse>(ctx, req, resp);
}

}  // namespace fusebox
