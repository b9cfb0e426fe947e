// KernelServiceImpl: see service.h. One op request's path: method -> RunOp ->
// Prepare* (validate, resolve handles, shape the output in place) ->
// Backend::Submit -> backend thread -> done callback -> commit a kept output,
// timing + metrics -> Finish.
#include "server/rpc/service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<PreparedCall> Prepare(const v1::GeluRequest& r, const RequestContext& c,
                                     v1::Tensor* o) {
  return PrepareGelu(r, c, o);
}
absl::StatusOr<PreparedCall> Prepare(const v1::SoftmaxRequest& r, const RequestContext& c,
                                     v1::Tensor* o) {
  return PrepareSoftmax(r, c, o);
}
absl::StatusOr<PreparedCall> Prepare(const v1::RowSumRequest& r, const RequestContext& c,
                                     v1::Tensor* o) {
  return PrepareRowSum(r, c, o);
}
absl::StatusOr<PreparedCall> Prepare(const v1::MatmulReluRequest& r, const RequestContext& c,
                                     v1::Tensor* o) {
  return PrepareMatmulRelu(r, c, o);
}

// A unary call's reactor (the ops, ListTensors): holds the call's in-flight budget and
// watches its reply until it has gone, and gives back a kept output whose handle never
// reached the caller (the call was cancelled or passed its deadline after the commit).
class OpReactor final : public grpc::ServerUnaryReactor {
 public:
  OpReactor(TensorStore* store, StallWatch* stalls, grpc::CallbackServerContext* ctx)
      : store_(store), ctx_(ctx), stall_(stalls, ctx) {}
  void Kept(const StoredTensor& t) {
    tenant_ = t.tenant;
    handle_ = t.handle;
  }
  // Held until the reply has gone (the reply's tensor bytes live until then).
  void Hold(std::shared_ptr<void> inflight) { inflight_ = std::move(inflight); }
  // Sends the reply (`bytes` of tensor data); until it has gone the call waits on its client.
  void Reply(const grpc::Status& s, int64_t bytes) {
    stall_.Waiting(bytes);
    Finish(s);
  }
  void OnDone() override {
    if (!handle_.empty() && ctx_->IsCancelled()) store_->Free(tenant_, handle_).IgnoreError();
    delete this;
  }

 private:
  TensorStore* const store_;
  grpc::CallbackServerContext* const ctx_;
  std::string tenant_, handle_;
  std::shared_ptr<void> inflight_;
  StallWatch::Call stall_;
};

// 64 KiB under 4 MiB: a message with its header still fits gRPC's default 4 MiB receive limit,
// so stock clients (grpcurl, a generated stub) can Download without raising it.
constexpr int64_t kDefaultChunkBytes = (4 << 20) - (64 << 10);
constexpr int64_t kMaxChunkBytes = 64 << 20;
// More than an Upload message's fields other than its data take.
constexpr int64_t kMessageFramingBytes = 4 << 10;
// A ListTensors reply smaller than this takes no in-flight budget.
constexpr int64_t kSmallReplyBytes = 64 << 10;

}  // namespace

KernelServiceImpl::KernelServiceImpl(Backend* backend, Metrics* metrics, TensorStore* store,
                                     const Authenticator* auth, RequestLimits limits)
    : backend_(backend),
      metrics_(metrics),
      store_(store),
      auth_(auth),
      limits_(limits),
      inflight_(limits.max_inflight_bytes > 0
                    ? std::make_unique<InflightBytes>(limits.max_inflight_bytes)
                    : nullptr),
      stalls_(limits.stall_timeout_seconds) {}

int KernelServiceImpl::CancelStalled() { return stalls_.CancelStalled(SteadyNowNs()); }

absl::StatusOr<std::shared_ptr<void>> KernelServiceImpl::ReserveTransfer(
    int64_t bytes, const char* what, const char* advice) const {
  if (inflight_ == nullptr) return std::shared_ptr<void>();
  std::shared_ptr<void> token = inflight_->TryReserve(bytes);
  if (token == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server holds ", inflight_->used(), " bytes for calls in flight, and this ", what,
        " needs ", bytes, " more (limit ", inflight_->limit(), ", --inflight_mib); retry later",
        advice));
  }
  return token;
}

absl::StatusOr<RequestContext> KernelServiceImpl::Context(
    const grpc::CallbackServerContext& ctx) const {
  auto tenant = auth_->TenantOf(ctx);
  if (!tenant.ok()) return tenant.status();
  RequestContext c;
  c.limits = limits_;
  c.store = store_;
  c.inflight = inflight_.get();
  c.tenant = *std::move(tenant);
  return c;
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

template <typename Req>
grpc::ServerUnaryReactor* KernelServiceImpl::RunOp(grpc::CallbackServerContext* ctx,
                                                   const char* method, Op op, const Req& req,
                                                   v1::TensorRef* output, v1::Timing* timing) {
  const int64_t arrived = SteadyNowNs();
  auto* reactor = new OpReactor(store_, &stalls_, ctx);
  if (metrics_) metrics_->CallStarted();
  CallRecord record;
  record.method = method;
  record.op = op;
  // Ends the call: one place for timing, metrics and Finish. A kept output is committed
  // only while the caller still waits for its handle.
  auto finish = [this, ctx, reactor, timing, output](CallRecord record, absl::Status s,
                                                     const OpTiming& t, PreparedCall* p) {
    if (s.ok() && p->kept_output && ctx->IsCancelled()) {
      s = absl::CancelledError(
          "the call was cancelled or passed its deadline; its output was not kept");
    }
    record.grpc_code = static_cast<int>(s.code());
    if (s.ok()) {
      if (p->kept_output) {
        store_->Commit(p->kept_output);
        output->set_handle(p->kept_output->handle);
        reactor->Kept(*p->kept_output);
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
    reactor->Reply(ToGrpcStatus(s), record.bytes_out);
  };

  absl::StatusOr<PreparedCall> prepared = absl::UnknownError("");
  if (auto c = Context(*ctx); !c.ok()) {
    prepared = c.status();
  } else {
    try {
      prepared = Prepare(req, *c, output->mutable_tensor());
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
    return reactor;
  }
  auto p = std::make_shared<PreparedCall>(*std::move(prepared));
  reactor->Hold(std::move(p->inflight));
  record.dtype = p->call.dtype;
  record.bytes_in = p->bytes_in;
  record.bytes_out = p->bytes_out;
  if (p->trivial && p->trivial_bytes.empty()) {
    OpTiming t;
    t.total_us = (SteadyNowNs() - arrived) / 1e3;
    finish(record, absl::OkStatus(), t, p.get());
    return reactor;
  }
  auto done = [finish, record, p](absl::Status s, const OpTiming& t) {
    finish(record, s, t, p.get());
  };
  p->call.abandoned = [ctx] { return ctx->IsCancelled(); };  // ctx outlives `done`
  if (p->trivial) {  // a kept output whose value needs no kernel: copy it in
    backend_->SubmitWrite(p->kept_output->buffer.get(), 0, p->trivial_bytes.data(),
                          p->trivial_bytes.size(), arrived, std::move(done));
  } else {
    backend_->Submit(p->call, arrived, std::move(done));
  }
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Gelu(grpc::CallbackServerContext* ctx,
                                                  const v1::GeluRequest* req,
                                                  v1::GeluResponse* resp) {
  return RunOp(ctx, "Gelu", Op::kGelu, *req, resp->mutable_output(), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::Softmax(grpc::CallbackServerContext* ctx,
                                                     const v1::SoftmaxRequest* req,
                                                     v1::SoftmaxResponse* resp) {
  return RunOp(ctx, "Softmax", Op::kSoftmax, *req, resp->mutable_output(),
               resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::RowSum(grpc::CallbackServerContext* ctx,
                                                    const v1::RowSumRequest* req,
                                                    v1::RowSumResponse* resp) {
  return RunOp(ctx, "RowSum", Op::kRowSum, *req, resp->mutable_output(), resp->mutable_timing());
}

grpc::ServerUnaryReactor* KernelServiceImpl::MatmulRelu(grpc::CallbackServerContext* ctx,
                                                        const v1::MatmulReluRequest* req,
                                                        v1::MatmulReluResponse* resp) {
  return RunOp(ctx, "MatmulRelu", Op::kMatmulRelu, *req, resp->mutable_output(),
               resp->mutable_timing());
}

// Upload: header first, then each chunk is copied into the tensor's memory
// through the backend (pinned staging -> device on CUDA) before the next chunk
// is read, so host memory holds at most one chunk of the tensor at a time.
// The tensor becomes visible (gets its handle) only after the last byte.
class KernelServiceImpl::UploadReactor final : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  UploadReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx, v1::UploadResponse* resp)
      : svc_(svc), ctx_(ctx), resp_(resp), stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    auto c = svc_->Context(*ctx);
    if (!c.ok()) {
      End(ToGrpcStatus(c.status()));
      return;
    }
    if (svc_->store_ == nullptr) {
      End(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this server holds no tensors"));
      return;
    }
    tenant_ = c->tenant;
    Read();
  }

  void OnReadDone(bool ok) override {
    stall_.Working();
    if (!ok) {  // the client closed its side, or the call broke
      Complete();
      return;
    }
    if (!tensor_) {
      if (auto s = Begin(); !s.ok()) return Fail(s);
    } else if (msg_.dtype() != v1::DTYPE_UNSPECIFIED || msg_.shape_size() > 0) {
      return Fail(absl::InvalidArgumentError("dtype and shape belong in the first message only"));
    }
    const int64_t n = static_cast<int64_t>(msg_.data().size());
    if (written_ + n > tensor_->bytes) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("the upload sent more than the ", tensor_->bytes, " bytes its shape needs")));
    }
    if (n == 0) {
      Read();
      return;
    }
    if (n > held_bytes_) {  // this message, in host memory until it is copied in
      held_.reset();
      auto token = svc_->ReserveTransfer(n, "upload", ", or send smaller messages");
      if (!token.ok()) return Fail(token.status());
      held_ = *std::move(token);
      held_bytes_ = n;
    }
    svc_->backend_->SubmitWrite(tensor_->buffer.get(), static_cast<size_t>(written_),
                                msg_.data().data(), static_cast<size_t>(n), SteadyNowNs(),
                                [this, n](absl::Status s, const OpTiming&) {
                                  if (!s.ok()) return Fail(s);
                                  written_ += n;
                                  Read();
                                });
  }

  // An uncommitted tensor is freed here, and so is a committed one whose reply never reached
  // the client (it cancelled after the last byte).
  void OnDone() override {
    if (tensor_ && !tensor_->handle.empty() && ctx_->IsCancelled()) {
      svc_->store_->Free(tenant_, tensor_->handle).IgnoreError();
    }
    delete this;
  }

 private:
  // The next message is allowed as long as the largest it could be needs (StallWatch): the
  // first, with the header, up to the message limit; a later one, the bytes still missing and
  // its framing. So a client sending at 1 MiB/s or faster is never cancelled, however it
  // sizes its messages.
  void Read() {
    const int64_t limit = svc_->limits_.max_message_bytes;
    stall_.Waiting(tensor_ ? std::min(tensor_->bytes - written_ + kMessageFramingBytes, limit)
                           : limit);
    StartRead(&msg_);
  }

  absl::Status Begin() {
    started_ns_ = SteadyNowNs();
    auto dtype = CheckedDType(msg_.dtype(), "upload");
    if (!dtype.ok()) return dtype.status();
    auto bytes = CheckedBytes(*dtype, msg_.shape(), "upload");
    if (!bytes.ok()) return bytes.status();
    std::vector<int64_t> shape(msg_.shape().begin(), msg_.shape().end());
    auto t = svc_->store_->Create(tenant_, *dtype, shape);
    if (!t.ok()) return t.status();
    tensor_ = *std::move(t);
    return absl::OkStatus();
  }

  void Complete() {
    // Reads end both when the client closes its side and when the call breaks.
    if (ctx_->IsCancelled()) {
      return Fail(absl::CancelledError("the upload was cancelled; nothing was kept"));
    }
    if (!tensor_) return Fail(absl::InvalidArgumentError("the upload sent no header"));
    if (written_ != tensor_->bytes) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "the upload ended after ", written_, " of ", tensor_->bytes, " bytes; nothing was kept")));
    }
    svc_->store_->Commit(tensor_);
    FillInfo(*tensor_, resp_->mutable_tensor());
    const double secs = (SteadyNowNs() - started_ns_) / 1e9;
    resp_->set_copy_gbps(secs > 0 ? tensor_->bytes / secs / 1e9 : 0);
    End(grpc::Status::OK);
  }

  void Fail(const absl::Status& s) {
    tensor_.reset();  // frees memory and reservation
    End(ToGrpcStatus(s));
  }

  // No copy is in flight here: the message buffer and its budget go back before the status
  // does, so the client's next call finds them free.
  void End(const grpc::Status& s) {
    svc_->RecordOther("Upload", s, written_, 0);
    msg_.Clear();
    held_.reset();
    stall_.Waiting();
    Finish(s);
  }

  KernelServiceImpl* const svc_;
  grpc::CallbackServerContext* const ctx_;
  v1::UploadResponse* const resp_;
  std::string tenant_;
  v1::UploadRequest msg_;
  std::shared_ptr<StoredTensor> tensor_;
  int64_t written_ = 0;
  int64_t started_ns_ = 0;
  std::shared_ptr<void> held_;  // in-flight budget for one message of held_bytes_
  int64_t held_bytes_ = 0;      // the largest message so far
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerReadReactor<v1::UploadRequest>* KernelServiceImpl::Upload(
    grpc::CallbackServerContext* ctx, v1::UploadResponse* resp) {
  return new UploadReactor(this, ctx, resp);
}

// Download: header with the first chunk, then one chunk per message; each is
// copied out of the tensor's memory by the backend before it is written.
class KernelServiceImpl::DownloadReactor final
    : public grpc::ServerWriteReactor<v1::DownloadResponse> {
 public:
  DownloadReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx,
                  const v1::DownloadRequest* req)
      : svc_(svc), stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    auto c = svc_->Context(*ctx);
    if (!c.ok()) {
      End(ToGrpcStatus(c.status()));
      return;
    }
    if (svc_->store_ == nullptr) {
      End(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this server holds no tensors"));
      return;
    }
    if (req->chunk_bytes() < 0) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "chunk_bytes must be >= 0"));
      return;
    }
    auto t = svc_->store_->Get(c->tenant, req->handle());
    if (!t.ok()) {
      End(ToGrpcStatus(t.status()));
      return;
    }
    tensor_ = *std::move(t);
    FillInfo(*tensor_, msg_.mutable_tensor());
    // Every message, the first with its header, must fit the server's message limit
    // (max_output_bytes leaves 4 KiB for the rest of a message; the header's own size is
    // taken off too).
    const int64_t header = static_cast<int64_t>(msg_.tensor().ByteSizeLong());
    chunk_ = std::min({req->chunk_bytes() == 0 ? kDefaultChunkBytes : req->chunk_bytes(),
                       kMaxChunkBytes, std::max<int64_t>(1, svc_->limits_.max_output_bytes - header)});
    // A chunk is in host memory twice while it is sent: ours, and gRPC's serialized copy.
    auto token = svc_->ReserveTransfer(2 * std::min(chunk_, tensor_->bytes), "download",
                                       ", or ask for a smaller chunk_bytes");
    if (!token.ok()) {
      End(ToGrpcStatus(token.status()));
      return;
    }
    held_ = *std::move(token);
    Next();
  }

  void OnWriteDone(bool ok) override {
    stall_.Working();
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "the download was cancelled"));
      return;
    }
    msg_.clear_tensor();
    if (sent_ == tensor_->bytes) {
      End(grpc::Status::OK);
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  // Copies the next chunk out and writes it (the header alone for an empty tensor).
  void Next() {
    tensor_->last_used_ns = SteadyNowNs();  // in use: idle expiry waits for the reader
    const int64_t n = std::min(chunk_, tensor_->bytes - sent_);
    msg_.mutable_data()->resize(static_cast<size_t>(n));
    if (n == 0) {
      Write();
      return;
    }
    svc_->backend_->SubmitRead(tensor_->buffer.get(), static_cast<size_t>(sent_),
                               msg_.mutable_data()->data(), static_cast<size_t>(n), SteadyNowNs(),
                               [this, n](absl::Status s, const OpTiming&) {
                                 if (!s.ok()) {
                                   End(ToGrpcStatus(s));
                                   return;
                                 }
                                 sent_ += n;
                                 Write();
                               });
  }

  void Write() {
    stall_.Waiting(static_cast<int64_t>(msg_.data().size()));
    StartWrite(&msg_);
  }

  // No copy or write is in flight here: the chunk and its budget go back before the status
  // does, so the client's next call finds them free.
  void End(const grpc::Status& s) {
    svc_->RecordOther("Download", s, 0, sent_);
    msg_.Clear();
    held_.reset();
    stall_.Waiting();
    Finish(s);
  }

  KernelServiceImpl* const svc_;
  std::shared_ptr<StoredTensor> tensor_;  // held: a Free meanwhile cannot pull it away
  v1::DownloadResponse msg_;
  int64_t chunk_ = kDefaultChunkBytes;
  int64_t sent_ = 0;
  std::shared_ptr<void> held_;  // in-flight budget for the chunk's two copies
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerWriteReactor<v1::DownloadResponse>* KernelServiceImpl::Download(
    grpc::CallbackServerContext* ctx, const v1::DownloadRequest* req) {
  return new DownloadReactor(this, ctx, req);
}

grpc::ServerUnaryReactor* KernelServiceImpl::FreeTensor(grpc::CallbackServerContext* ctx,
                                                        const v1::FreeTensorRequest* req,
                                                        v1::FreeTensorResponse* resp) {
  StartOther();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status;
  auto c = Context(*ctx);
  if (!c.ok()) {
    status = ToGrpcStatus(c.status());
  } else if (store_ == nullptr) {
    status = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this server holds no tensors");
  } else if (auto freed = store_->Free(c->tenant, req->handle()); !freed.ok()) {
    status = ToGrpcStatus(freed.status());
  } else {
    resp->set_freed_bytes(*freed);
  }
  RecordOther("FreeTensor", status, 0, 0);
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::ListTensors(grpc::CallbackServerContext* ctx,
                                                         const v1::ListTensorsRequest* req,
                                                         v1::ListTensorsResponse* resp) {
  StartOther();
  // A listing can be large (a tenant's every tensor and shape): it holds in-flight budget for
  // itself and gRPC's copy, and the stall watch ends it if the client does not take it.
  auto* reactor = new OpReactor(store_, &stalls_, ctx);
  std::shared_ptr<void> held;
  const grpc::Status status = ListInto(*ctx, *req, resp, &held);
  if (!status.ok()) resp->Clear();
  reactor->Hold(std::move(held));
  RecordOther("ListTensors", status, 0, 0);
  reactor->Reply(status, static_cast<int64_t>(resp->ByteSizeLong()));
  return reactor;
}

grpc::Status KernelServiceImpl::ListInto(const grpc::CallbackServerContext& ctx,
                                         const v1::ListTensorsRequest& req,
                                         v1::ListTensorsResponse* resp,
                                         std::shared_ptr<void>* held) const {
  auto c = Context(ctx);
  if (!c.ok()) return ToGrpcStatus(c.status());
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
    auto token = ReserveTransfer(2 * bytes, "listing", ", or ask for one handle at a time");
    if (!token.ok()) return ToGrpcStatus(token.status());
    *held = *std::move(token);
  }
  for (const auto& t : tensors) FillInfo(*t, resp->add_tensors());
  resp->set_used_bytes(store_->TenantUsedBytes(c->tenant));
  resp->set_quota_bytes(store_->limits().tenant_quota_bytes);
  return grpc::Status::OK;
}

}  // namespace fusebox
