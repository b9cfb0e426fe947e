// Download: a held tensor streamed back in chunks, copied out one chunk ahead of the writer.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
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

// Download: header with the first chunk, then one chunk per message. Each chunk is copied out of
// the tensor's memory by the backend into a buffer of its own, which the message then sends as
// it is (no serialized copy); the copy of the next chunk runs while the one before is written,
// so at most two chunks are in host memory.
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
      End(ToGrpcStatus(NoStore()));
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
    sent_ = begin_ = copied_ = req->offset();
    end_ = req->length() == 0 ? tensor_->bytes : req->offset() + req->length();
    FillInfo(*tensor_, &info_);
    // Every message, the first with its header, must fit the server's message limit
    // (max_output_bytes leaves 4 KiB for the rest of a message; the header's own size is
    // taken off too).
    const int64_t header = static_cast<int64_t>(info_.ByteSizeLong());
    chunk_ = std::min({req->chunk_bytes() == 0 ? kDefaultChunkBytes : req->chunk_bytes(),
                       kMaxChunkBytes, std::max<int64_t>(1, svc_->limits_.max_output_bytes - header)});
    // Two chunks are in host memory at once: the one being written, and the next being copied.
    auto token = svc_->ReserveTransfer(c->tenant, 2 * std::min(chunk_, end_ - sent_), "download",
                                       ", or ask for a smaller chunk_bytes");
    if (!token.ok()) {
      End(ToGrpcStatus(token.status()));
      return;
    }
    held_ = *std::move(token);
    std::unique_lock<std::mutex> lock(mu_);
    Advance(lock);
  }

  void OnWriteDone(bool ok) override {
    stall_.Working(writing_bytes_);
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    out_.Clear();
    if (!ok && error_.ok()) {
      error_ = grpc::Status(grpc::StatusCode::CANCELLED, "the download was cancelled");
    }
    Advance(lock);
  }

  void OnDone() override { delete this; }

 private:
  // Does what is due, with mu_ held by `lock` (released on return): writes the chunk that is
  // ready when no write is out, copies the next one out when none is being copied or waiting,
  // and ends once nothing is out and everything was sent or something failed.
  void Advance(std::unique_lock<std::mutex>& lock) {
    if (finished_) return;
    const bool failed = !error_.ok();
    bool write = false, read = false;
    if (!failed && !writing_ && has_ready_) {
      writing_ = write = true;
      has_ready_ = false;
    }
    const bool more = copied_ < end_ || !started_;  // an empty range sends its header once
    if (!failed && !reading_ && !has_ready_ && more) {
      reading_ = read = started_ = true;
    }
    if (!write && !read && !writing_ && !reading_ && (failed || (!has_ready_ && !more))) {
      finished_ = true;
      lock.unlock();
      End(failed ? error_ : grpc::Status::OK);
      return;
    }
    Chunk chunk;
    if (write) chunk = std::move(ready_);
    const int64_t at = copied_, n = std::min(chunk_, end_ - copied_);
    if (read) copied_ += n;
    lock.unlock();
    if (write) Write(std::move(chunk));
    if (read) Read(at, n);
  }

  struct Chunk {
    HostBytes data;
    int64_t bytes = 0;
  };

  // Copies [at, at + n) out into a chunk of its own (an empty one for an empty range).
  void Read(int64_t at, int64_t n) {
    tensor_->last_used_ns = SteadyNowNs();  // in use: idle expiry waits for the reader
    Chunk c;
    c.bytes = n;
    if (n > 0) c.data = svc_->backend_->AllocateHostBytes(static_cast<size_t>(n));
    if (n > 0 && !c.data) {
      return Copied(absl::ResourceExhaustedError(
                        "the server is out of host memory for this download; retry later"),
                    Chunk());
    }
    if (n == 0) return Copied(absl::OkStatus(), std::move(c));
    char* dst = c.data.get();
    auto chunk = std::make_shared<Chunk>(std::move(c));
    svc_->backend_->SubmitRead(tensor_->buffer.get(), static_cast<size_t>(at), dst,
                               static_cast<size_t>(n), SteadyNowNs(),
                               [this, chunk](absl::Status s, const OpTiming&) {
                                 Copied(s, std::move(*chunk));
                               });
  }

  // A chunk's copy has ended (on a backend thread, or at once).
  void Copied(const absl::Status& s, Chunk c) {
    std::unique_lock<std::mutex> lock(mu_);
    reading_ = false;
    if (!s.ok()) {
      if (error_.ok()) error_ = ToGrpcStatus(s);
    } else {
      ready_ = std::move(c);
      has_ready_ = true;
    }
    Advance(lock);
  }

  // Sends a chunk: the header first (with the first chunk), its bytes in place.
  void Write(Chunk c) {
    v1::DownloadResponse msg;
    if (!header_sent_) {
      *msg.mutable_tensor() = info_;
      header_sent_ = true;
    }
    writing_bytes_ = c.bytes;
    if (c.bytes > 0) {
      SerializeReply(msg, &msg, v1::DownloadResponse::kDataFieldNumber, std::move(c.data),
                     static_cast<size_t>(c.bytes), &out_);
    } else {
      SerializeReply(msg, &out_);
    }
    sent_ += c.bytes;
    stall_.Waiting(c.bytes);
    StartWrite(&out_);
  }

  // Nothing is being copied or written here: the chunks and their budget go back before the
  // status does, so the client's next call finds them free.
  void End(const grpc::Status& s) {
    svc_->RecordOther("Download", s, 0, sent_ - begin_);
    ready_ = Chunk();
    out_.Clear();
    held_.reset();
    stall_.Finishing();
    Finish(s);
  }

  KernelServiceImpl* const svc_;
  std::shared_ptr<StoredTensor> tensor_;  // held: a Free meanwhile cannot pull it away
  v1::TensorInfo info_;                   // the header
  grpc::ByteBuffer out_;                  // the message being written
  int64_t chunk_ = kDefaultChunkBytes;
  int64_t begin_ = 0, end_ = 0;  // the range
  int64_t sent_ = 0;             // bytes handed to gRPC (from begin_)
  int64_t writing_bytes_ = 0;    // of the message being written
  std::shared_ptr<void> held_;   // in-flight budget for two chunks
  std::mutex mu_;
  // Guarded by mu_: how far the copies have gone, the chunk copied and not yet written, and
  // what is out.
  int64_t copied_ = 0;
  Chunk ready_;
  bool has_ready_ = false, reading_ = false, writing_ = false, started_ = false;
  bool finished_ = false;
  bool header_sent_ = false;     // by Write alone (one at a time)
  grpc::Status error_;           // the first failure
  StallWatch::Call stall_;  // last: leaves the watch first
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* KernelServiceImpl::Download(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return new DownloadReactor(this, ctx, req);
}

}  // namespace fusebox
