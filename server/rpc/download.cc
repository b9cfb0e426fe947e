// Download: a held tensor streamed back in chunks, copied out one chunk ahead of the writer.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/service_parts.h"
#include "server/rpc/status_util.h"

namespace fusebox {
namespace {

// 64 KiB under 4 MiB: a message with its header still fits gRPC's default 4 MiB receive limit,
// so stock clients (grpcurl, a generated stub) can Download without raising it.
constexpr int64_t kDefaultChunkBytes = (4 << 20) - (64 << 10);
constexpr int64_t kMaxChunkBytes = 64 << 20;

}  // namespace

// Download: header with the first chunk, then one chunk per message; each is
// copied out of the tensor's memory by the backend before it is written.
class KernelServiceImpl::DownloadReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx,
                  const grpc::ByteBuffer* wire)
      : svc_(svc), stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    auto c = svc_->Context(*ctx);
    if (!c.ok()) {
      End(ToGrpcStatus(c.status()));
      return;
    }
    v1::DownloadRequest request;
    if (absl::Status parsed = ParseRequest(wire, &request); !parsed.ok()) {
      End(ToGrpcStatus(parsed));
      return;
    }
    const v1::DownloadRequest* req = &request;
    if (svc_->store_ == nullptr) {
      End(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this server holds no tensors"));
      return;
    }
    if (req->chunk_bytes() < 0) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "chunk_bytes must be >= 0"));
      return;
    }
    if (req->offset() < 0 || req->length() < 0) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       absl::StrCat("a download range has offset and length >= 0 (asked for ",
                                    req->offset(), " and ", req->length(), ")")));
      return;
    }
    auto t = svc_->store_->Get(c->tenant, req->handle());
    if (!t.ok()) {
      End(ToGrpcStatus(t.status()));
      return;
    }
    tensor_ = *std::move(t);
    // The range [sent_, end_): length 0 is the rest of the tensor from the offset.
    if (req->offset() > tensor_->bytes || req->length() > tensor_->bytes - req->offset()) {
      End(grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                       absl::StrCat("bytes [", req->offset(), ", ", req->offset() + req->length(),
                                    ") are past the end of the tensor (", tensor_->bytes,
                                    " bytes)")));
      return;
    }
    sent_ = begin_ = req->offset();
    end_ = req->length() == 0 ? tensor_->bytes : req->offset() + req->length();
    FillInfo(*tensor_, msg_.mutable_tensor());
    // Every message, the first with its header, must fit the server's message limit
    // (max_output_bytes leaves 4 KiB for the rest of a message; the header's own size is
    // taken off too).
    const int64_t header = static_cast<int64_t>(msg_.tensor().ByteSizeLong());
    chunk_ = std::min({req->chunk_bytes() == 0 ? kDefaultChunkBytes : req->chunk_bytes(),
                       kMaxChunkBytes, std::max<int64_t>(1, svc_->limits_.max_output_bytes - header)});
    // A chunk is in host memory twice while it is sent: ours, and gRPC's serialized copy.
    auto token = svc_->ReserveTransfer(c->tenant, 2 * std::min(chunk_, end_ - sent_), "download",
                                       ", or ask for a smaller chunk_bytes");
    if (!token.ok()) {
      End(ToGrpcStatus(token.status()));
      return;
    }
    held_ = *std::move(token);
    Next();
  }

  void OnWriteDone(bool ok) override {
    stall_.Working(static_cast<int64_t>(msg_.data().size()));
    out_.Clear();
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "the download was cancelled"));
      return;
    }
    msg_.clear_tensor();
    if (sent_ == end_) {
      End(grpc::Status::OK);
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  // Copies the next chunk out and writes it (the header alone for an empty range).
  void Next() {
    tensor_->last_used_ns = SteadyNowNs();  // in use: idle expiry waits for the reader
    const int64_t n = std::min(chunk_, end_ - sent_);
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
    SerializeReply(msg_, &out_);
    StartWrite(&out_);
  }

  // No copy or write is in flight here: the chunk and its budget go back before the status
  // does, so the client's next call finds them free.
  void End(const grpc::Status& s) {
    svc_->RecordOther("Download", s, 0, sent_ - begin_);
    msg_.Clear();
    out_.Clear();
    held_.reset();
    stall_.Finishing();
    Finish(s);
  }

  KernelServiceImpl* const svc_;
  std::shared_ptr<StoredTensor> tensor_;  // held: a Free meanwhile cannot pull it away
  v1::DownloadResponse msg_;
  grpc::ByteBuffer out_;  // msg_ serialized, until written
  int64_t chunk_ = kDefaultChunkBytes;
  int64_t begin_ = 0, sent_ = 0, end_ = 0;  // the range, and how far it has gone
  std::shared_ptr<void> held_;  // in-flight budget for the chunk's two copies
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* KernelServiceImpl::Download(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return new DownloadReactor(this, ctx, req);
}

}  // namespace fusebox
