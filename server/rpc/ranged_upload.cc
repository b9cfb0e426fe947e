// Ranged uploads: CreateUpload reserves a tensor, WriteUpload streams (any number, on any
// connections) copy byte ranges into it, CommitUpload gives it its handle once every byte is
// written, AbortUpload drops it. The bookkeeping is PendingUploads (server/core); this file is
// the RPCs around it.
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

// More than a WriteUpload message's fields other than its data take (an upload id is short;
// a long one is refused as NOT_FOUND after parsing, which the message limit bounds).
constexpr int64_t kMessageFramingBytes = 4 << 10;

}  // namespace

grpc::ServerUnaryReactor* KernelServiceImpl::CreateUpload(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* wire,
                                                          grpc::ByteBuffer* reply) {
  v1::CreateUploadRequest req;
  return AnswerUnary("CreateUpload", ctx, wire, &req, [&](const RequestContext& c) {
    if (uploads_ == nullptr) return NoStore();
    auto dtype = CheckedDType(req.dtype(), "upload");
    if (!dtype.ok()) return dtype.status();
    auto bytes = CheckedBytes(*dtype, req.shape(), "upload");
    if (!bytes.ok()) return bytes.status();
    auto created = uploads_->Create(c.tenant, *dtype,
                                    std::vector<int64_t>(req.shape().begin(), req.shape().end()));
    if (!created.ok()) return created.status();
    v1::CreateUploadResponse resp;
    resp.set_upload_id(created->id);
    resp.set_size_bytes(created->bytes);
    resp.set_idle_timeout_s(uploads_->idle_timeout_seconds());
    SerializeReply(resp, reply);
    return absl::OkStatus();
  });
}

// WriteUpload: every message is a range, claimed (checked against the tensor's end and every
// other range) before its bytes are copied in through the backend, as Upload copies its
// chunks: one message in host memory at a time. The stream's ranges count as written only when
// it ends OK; a failed or cancelled stream takes them back (PendingUploads::Writer).
class KernelServiceImpl::WriteUploadReactor final
    : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteUploadReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx,
                     grpc::ByteBuffer* reply)
      : svc_(svc), ctx_(ctx), reply_(reply), stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    auto c = svc_->Context(*ctx);
    if (!c.ok()) {
      End(ToGrpcStatus(c.status()));
      return;
    }
    if (svc_->uploads_ == nullptr) {
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
    if (!writer_) {
      if (msg_.upload_id().empty()) {
        return Fail(absl::InvalidArgumentError("the first WriteUpload message names no upload_id"));
      }
      auto w = svc_->uploads_->OpenWriter(tenant_, msg_.upload_id());
      if (!w.ok()) return Fail(w.status());
      writer_ = *std::move(w);
    } else if (!msg_.upload_id().empty() && msg_.upload_id() != writer_->id()) {
      return Fail(absl::InvalidArgumentError(
          "one WriteUpload stream writes one upload: a later message names another upload_id"));
    }
    const int64_t n = static_cast<int64_t>(msg_.data().size());
    const int64_t offset = msg_.offset();
    if (auto s = writer_->Claim(offset, n); !s.ok()) return Fail(s);
    if (n == 0) {
      Read();
      return;
    }
    if (auto s = svc_->HoldMessage(tenant_, n, "upload write", &in_); !s.ok()) return Fail(s);
    svc_->backend_->SubmitWrite(writer_->buffer(), static_cast<size_t>(offset), msg_.data().data(),
                                static_cast<size_t>(n), SteadyNowNs(),
                                [this, n](absl::Status s, const OpTiming&) {
                                  if (!s.ok()) return Fail(s);
                                  written_ += n;
                                  Read();
                                });
  }

  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  // The next message may take what is left of the stream's allowance (StallWatch) with the
  // largest it could be: the tensor's size and its framing, within the message limit. A client
  // moving 1 MiB/s or more is never cancelled.
  void Read() {
    const int64_t limit = svc_->limits_.max_message_bytes;
    stall_.Waiting(writer_ ? std::min(writer_->bytes() + kMessageFramingBytes, limit) : limit);
    StartRead(&in_.wire);
  }

  bool Cancelled() const { return cancelled_.load() || ctx_->IsCancelled(); }

  void Complete() {
    if (Cancelled()) {
      return Fail(absl::CancelledError("the write was cancelled; none of its ranges count"));
    }
    if (!writer_) {
      return Fail(absl::InvalidArgumentError("the WriteUpload stream named no upload"));
    }
    auto missing = writer_->Finish();
    if (!missing.ok()) return Fail(missing.status());
    v1::WriteUploadResponse resp;
    resp.set_written_bytes(written_);
    resp.set_missing_bytes(*missing);
    SerializeReply(resp, reply_);
    writer_.reset();
    End(grpc::Status::OK);
  }

  void Fail(const absl::Status& s) {
    writer_.reset();  // takes this stream's ranges back
    End(ToGrpcStatus(s));
  }

  // No copy is in flight here.
  void End(const grpc::Status& s) {
    svc_->EndUploadStream(this, &stall_, "WriteUpload", s, written_, &msg_, &in_);
  }

  KernelServiceImpl* const svc_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const reply_;
  std::string tenant_;
  StreamMessage in_;            // the next message as it arrives, and its budget
  v1::WriteUploadRequest msg_;  // and parsed
  std::unique_ptr<PendingUploads::Writer> writer_;
  int64_t written_ = 0;
  std::atomic<bool> cancelled_{false};
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerReadReactor<grpc::ByteBuffer>* KernelServiceImpl::WriteUpload(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  return new WriteUploadReactor(this, ctx, resp);
}

grpc::ServerUnaryReactor* KernelServiceImpl::CommitUpload(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* wire,
                                                          grpc::ByteBuffer* reply) {
  StartOther();
  // An OpReactor, as for a kept output: a commit whose call is cancelled before its reply has
  // gone frees the tensor again (its handle never reached the caller).
  auto* reactor = new OpReactor(store_, &stalls_, inflight_.get(), ctx, reply);
  auto [req, resp] = reactor->Messages<v1::CommitUploadRequest, v1::CommitUploadResponse>();
  grpc::Status status;
  auto c = Context(*ctx);
  if (!c.ok()) {
    status = ToGrpcStatus(c.status());
  } else if (absl::Status parsed = ParseRequest(wire, req); !parsed.ok()) {
    status = ToGrpcStatus(parsed);
  } else if (uploads_ == nullptr) {
    status = ToGrpcStatus(NoStore());
  } else if (auto t = uploads_->TakeComplete(c->tenant, req->upload_id()); !t.ok()) {
    status = ToGrpcStatus(t.status());
  } else if (absl::Status before = BeforeCommit(*ctx, t->get()); !before.ok()) {
    status = ToGrpcStatus(before);  // the tensor goes with `t`
  } else {
    store_->Commit(*t);
    reactor->Kept(**t);
    FillInfo(**t, resp->mutable_tensor());
  }
  RecordOther("CommitUpload", status, 0, 0);
  reactor->Reply(status);
  return reactor;
}

grpc::ServerUnaryReactor* KernelServiceImpl::AbortUpload(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* wire,
                                                         grpc::ByteBuffer* reply) {
  v1::AbortUploadRequest req;
  return AnswerUnary("AbortUpload", ctx, wire, &req, [&](const RequestContext& c) {
    if (uploads_ == nullptr) return NoStore();
    auto freed = uploads_->Abort(c.tenant, req.upload_id());
    if (!freed.ok()) return freed.status();
    v1::AbortUploadResponse resp;
    resp.set_freed_bytes(*freed);
    SerializeReply(resp, reply);
    return absl::OkStatus();
  });
}

}  // namespace fusebox
