// Upload: a client stream of one header and the tensor's bytes, copied in as they arrive.
#include <algorithm>
#include <atomic>
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

// More than an Upload message's fields other than its data take.
constexpr int64_t kMessageFramingBytes = 4 << 10;

}  // namespace

// Upload: header first, then each chunk is copied into the tensor's memory
// through the backend (pinned staging -> device on CUDA) before the next chunk
// is read, so host memory holds at most one chunk of the tensor at a time.
// The tensor becomes visible (gets its handle) only after the last byte.
class KernelServiceImpl::UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* reply)
      : svc_(svc), ctx_(ctx), reply_(reply), stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    auto c = svc_->Context(*ctx);
    if (!c.ok()) {
      End(ToGrpcStatus(c.status()));
      return;
    }
    if (svc_->store_ == nullptr) {
      End(ToGrpcStatus(NoStore()));
      return;
    }
    tenant_ = c->tenant;
    Read();
  }

  void OnReadDone(bool ok) override {
    stall_.Working(ok ? static_cast<int64_t>(msg_.data().size()) : 0);
    if (!ok) {  // the client closed its side, or the call broke
      Complete();
      return;
    }
    if (absl::Status parsed = ParseRequest(&in_.wire, &msg_); !parsed.ok()) return Fail(parsed);
    if (!tensor_) {
      if (msg_.has_shared()) return BeginShared();
      if (auto s = Begin(); !s.ok()) return Fail(s);
    } else if (msg_.dtype() != v1::DTYPE_UNSPECIFIED || msg_.shape_size() > 0 ||
               msg_.has_shared()) {
      return Fail(absl::InvalidArgumentError(
          "dtype, shape and shared belong in the first message only"));
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
    if (auto s = svc_->HoldMessage(tenant_, n, "upload", &in_); !s.ok()) return Fail(s);
    svc_->backend_->SubmitWrite(tensor_->buffer.get(), static_cast<size_t>(written_),
                                msg_.data().data(), static_cast<size_t>(n), SteadyNowNs(),
                                [this, n](absl::Status s, const OpTiming&) {
                                  if (!s.ok()) return Fail(s);
                                  written_ += n;
                                  Read();
                                });
  }

  void OnCancel() override { cancelled_ = true; }
  // An uncommitted tensor is freed here, and so is a committed one whose reply never reached
  // the client (it cancelled after the last byte).
  void OnDone() override {
    if (tensor_ && !tensor_->handle.empty() && Cancelled()) {
      svc_->store_->Free(tenant_, tensor_->handle).IgnoreError();
    }
    delete this;
  }

 private:
  // The next message may take what is left of the upload's allowance (StallWatch) with the
  // largest it could be: the first, with the header, up to the message limit; a later one, the
  // bytes still missing and its framing. So a client sending at 1 MiB/s or faster is never
  // cancelled, however it sizes its messages, and one that trickles is, however often it sends.
  void Read() {
    const int64_t limit = svc_->limits_.max_message_bytes;
    stall_.Waiting(tensor_ ? std::min(tensor_->bytes - written_ + kMessageFramingBytes, limit)
                           : limit);
    StartRead(&in_.wire);
  }

  bool Cancelled() const { return cancelled_.load() || ctx_->IsCancelled(); }

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

  // An upload whose bytes come from a registered shared-memory region (UploadRequest.shared):
  // one copy from the region into the new tensor, the region held mapped until it is done;
  // then the client closes its side as after any upload.
  void BeginShared() {
    started_ns_ = SteadyNowNs();
    if (msg_.dtype() != v1::DTYPE_UNSPECIFIED || msg_.shape_size() > 0 || !msg_.data().empty()) {
      return Fail(absl::InvalidArgumentError(
          "an upload from shared memory takes dtype and shape from shared, and sends no data"));
    }
    RequestContext c;
    c.tenant = tenant_;
    c.shm = svc_->shm_;
    auto src = ResolveShared(msg_.shared(), c, "upload.shared");
    if (!src.ok()) return Fail(src.status());
    auto t = svc_->store_->Create(tenant_, src->dtype, src->shape);
    if (!t.ok()) return Fail(t.status());
    tensor_ = *std::move(t);
    if (src->bytes == 0) return Read();
    std::shared_ptr<SharedRegion> region = std::move(src->region);
    const int64_t n = src->bytes;
    svc_->backend_->SubmitWrite(tensor_->buffer.get(), 0, src->data, static_cast<size_t>(n),
                                SteadyNowNs(),
                                [this, n, region](absl::Status s, const OpTiming&) {
                                  if (s.ok() && region->Faulted()) {
                                    s = absl::FailedPreconditionError(absl::StrCat(
                                        "shared-memory region '", region->name,
                                        "' was truncated while it was read; nothing was kept"));
                                  }
                                  if (!s.ok()) return Fail(s);
                                  written_ += n;
                                  Read();
                                });
  }

  void Complete() {
    // Reads end both when the client closes its side and when the call breaks.
    if (Cancelled()) {
      return Fail(absl::CancelledError("the upload was cancelled; nothing was kept"));
    }
    if (!tensor_) return Fail(absl::InvalidArgumentError("the upload sent no header"));
    if (written_ != tensor_->bytes) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "the upload ended after ", written_, " of ", tensor_->bytes, " bytes; nothing was kept")));
    }
    if (auto s = svc_->BeforeCommit(*ctx_, tensor_.get()); !s.ok()) return Fail(s);
    svc_->store_->Commit(tensor_);
    v1::UploadResponse resp;
    FillInfo(*tensor_, resp.mutable_tensor());
    const double secs = (SteadyNowNs() - started_ns_) / 1e9;
    resp.set_copy_gbps(secs > 0 ? tensor_->bytes / secs / 1e9 : 0);
    SerializeReply(resp, reply_);
    End(grpc::Status::OK);
  }

  void Fail(const absl::Status& s) {
    tensor_.reset();  // frees memory and reservation
    End(ToGrpcStatus(s));
  }

  // No copy is in flight here.
  void End(const grpc::Status& s) {
    svc_->EndUploadStream(this, &stall_, "Upload", s, written_, &msg_, &in_);
  }

  KernelServiceImpl* const svc_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const reply_;
  std::string tenant_;
  StreamMessage in_;       // the next message as it arrives, and its budget
  v1::UploadRequest msg_;  // and parsed
  std::shared_ptr<StoredTensor> tensor_;
  int64_t written_ = 0;
  int64_t started_ns_ = 0;
  std::atomic<bool> cancelled_{false};
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerReadReactor<grpc::ByteBuffer>* KernelServiceImpl::Upload(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  return new UploadReactor(this, ctx, resp);
}

}  // namespace fusebox
