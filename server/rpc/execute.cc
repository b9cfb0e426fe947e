// Execute: many op calls on one bidirectional stream. Each request is checked on the wire and
// parsed as a unary call's is (messages.h) and run by the same RunOp (ops.cc); its response, or
// its own error, is serialized as soon as its op ends and written as soon as the stream can take
// it, so responses leave in the order the ops finish. Flow control: the stream reads its next
// request only while fewer than RequestLimits::stream_max_inflight of its requests are
// unanswered (read, and their response not yet written), so a client that sends faster than the
// server answers is held back by HTTP/2's flow control instead of being buffered here.
#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "server/rpc/messages.h"
#include "server/rpc/service.h"
#include "server/rpc/service_parts.h"
#include "server/rpc/status_util.h"

namespace fusebox {
namespace {

// The id of a request whose body did not parse, so that its error still reaches the right
// caller: field 1 read from the wire up to the first thing that does not parse (the last one
// seen wins, as in parsing); 0 when there is none.
uint64_t IdOf(const grpc::ByteBuffer& wire) {
  grpc::ByteBuffer view(wire);  // shares the slices
  grpc::ProtoBufferReader reader(&view);
  if (!reader.status().ok()) return 0;
  google::protobuf::io::CodedInputStream in(&reader);
  uint64_t id = 0;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == ((1u << 3) | 0u)) {
      if (!in.ReadVarint64(&id)) break;
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  return id;
}

}  // namespace

class KernelServiceImpl::ExecuteReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ExecuteReactor(KernelServiceImpl* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc),
        ctx_(ctx),
        max_unanswered_(std::max(1, svc->limits_.stream_max_inflight)),
        stall_(&svc->stalls_, ctx) {
    svc_->StartOther();
    caller_ = svc_->Context(*ctx);
    if (!caller_.ok()) {
      End(ToGrpcStatus(caller_.status()));
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    busy_ = 1;  // until the stream is registered: a Drain meanwhile must not end it under us
    lock.unlock();
    bool draining;
    {
      std::lock_guard<std::mutex> streams(svc_->streams_mu_);
      draining = svc_->draining_;
      if (!draining) svc_->streams_.insert(this);
      registered_ = !draining;
    }
    lock.lock();
    busy_ = 0;
    draining_ = draining_ || draining;
    Advance(lock);  // the first read, or UNAVAILABLE when the server is already draining
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or the stream broke
      std::unique_lock<std::mutex> lock(mu_);
      reading_ = false;
      reads_done_ = true;
      Advance(lock);
      return;
    }
    const int64_t arrived = SteadyNowNs();
    auto* r = new Request(this);
    grpc::ByteBuffer wire(wire_);  // for the id, should the body not parse
    absl::Status parsed = ParseRequest(&wire_, &r->req, &r->payloads);
    r->resp.set_id(parsed.ok() ? r->req.id() : IdOf(wire));
    wire.Clear();
    bool draining;
    {
      std::unique_lock<std::mutex> lock(mu_);
      reading_ = false;
      ++unanswered_;
      draining = draining_;
      Advance(lock);  // the next read, while under the bound (wire_ is free again)
    }
    // r's answer may come on another thread at once; the stream lives on at least until this
    // reaction returns (gRPC runs OnDone only after it).
    if (draining) {
      return r->Reply(absl::UnavailableError(
          "the server is shutting down; this request was not run: send it again elsewhere"));
    }
    if (!parsed.ok()) return svc_->Refuse(r, parsed);
    KernelServiceImpl* svc = svc_;
    v1::ExecuteRequest& q = r->req;
    v1::ExecuteResponse& a = r->resp;
    switch (q.op_case()) {
      case v1::ExecuteRequest::kGelu:
        return svc->RunOp(ctx_, arrived, caller_, absl::OkStatus(), q.gelu(),
                          &r->payloads.by_tensor, a.mutable_gelu()->mutable_output(),
                          a.mutable_gelu()->mutable_timing(), r);
      case v1::ExecuteRequest::kSoftmax:
        return svc->RunOp(ctx_, arrived, caller_, absl::OkStatus(), q.softmax(),
                          &r->payloads.by_tensor, a.mutable_softmax()->mutable_output(),
                          a.mutable_softmax()->mutable_timing(), r);
      case v1::ExecuteRequest::kRowSum:
        return svc->RunOp(ctx_, arrived, caller_, absl::OkStatus(), q.row_sum(),
                          &r->payloads.by_tensor, a.mutable_row_sum()->mutable_output(),
                          a.mutable_row_sum()->mutable_timing(), r);
      case v1::ExecuteRequest::kMatmulRelu:
        return svc->RunOp(ctx_, arrived, caller_, absl::OkStatus(), q.matmul_relu(),
                          &r->payloads.by_tensor, a.mutable_matmul_relu()->mutable_output(),
                          a.mutable_matmul_relu()->mutable_timing(), r);
      case v1::ExecuteRequest::OP_NOT_SET:
        break;
    }
    svc->Refuse(r, absl::InvalidArgumentError(
                       "the request names no op: set one of gelu, softmax, row_sum, matmul_relu"));
  }

  void OnWriteDone(bool ok) override {
    stall_.Working(ok ? sent_.size : 0);
    Outgoing done;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done = std::move(sent_);
      writing_ = false;
      --unanswered_;
      if (!ok) broken_ = true;
      Advance(lock);
    }
    if (!ok) FreeKept(done);  // its handle never reached the client
  }

  void OnCancel() override {
    cancelled_ = true;
    std::unique_lock<std::mutex> lock(mu_);
    Advance(lock);
  }

  void OnDone() override {
    if (registered_) {
      std::lock_guard<std::mutex> streams(svc_->streams_mu_);
      svc_->streams_.erase(this);
    }
    delete this;
  }

  // The server drains: read no more, answer what was read, end UNAVAILABLE.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    Advance(lock);
  }

  // One request of the stream, from its read to its answer (then it is deleted; its response
  // lives on serialized, as an Outgoing).
  class Request final : public OpSink {
   public:
    explicit Request(ExecuteReactor* stream) : stream_(stream) {}
    bool Cancelled() const override { return stream_->Cancelled(); }
    void Hold(std::shared_ptr<void> inflight, std::string tenant) override {
      held_ = std::move(inflight);
      caller_ = std::move(tenant);
    }
    void Kept(const StoredTensor& t) override {
      kept_tenant_ = t.tenant;
      kept_handle_ = t.handle;
    }
    void SendInPlace(const v1::Tensor* tensor, HostBytes data, size_t bytes) override {
      in_place_tensor_ = tensor;
      in_place_ = std::move(data);
      in_place_bytes_ = bytes;
    }
    void Reply(const absl::Status& s) override { stream_->Answer(this, s); }

    v1::ExecuteRequest req;
    ReceivedPayloads payloads;  // req's tensor bytes, as long as req
    v1::ExecuteResponse resp;

   private:
    friend class ExecuteReactor;
    ExecuteReactor* const stream_;
    std::shared_ptr<void> held_;  // the op's in-flight reservation
    std::string caller_;
    std::string kept_tenant_, kept_handle_;
    const v1::Tensor* in_place_tensor_ = nullptr;  // SendInPlace's
    HostBytes in_place_;
    size_t in_place_bytes_ = 0;
  };

 private:
  // A response serialized and waiting for (or being) written.
  struct Outgoing {
    grpc::ByteBuffer bytes;
    int64_t size = 0;
    std::shared_ptr<void> sending;  // its bytes in InflightBytes (Sending), until written
    std::string tenant, handle;     // a kept output it carries
  };

  bool Cancelled() const { return cancelled_.load() || broken_.load() || ctx_->IsCancelled(); }

  // Ends request r: its response, or `s` as its error. The request's messages and its
  // reservation go now; the serialized response counts as sending until it is written.
  void Answer(Request* r, const absl::Status& s) {
    if (!s.ok()) {
      r->resp.clear_result();
      v1::Status* e = r->resp.mutable_error();
      e->set_code(static_cast<int>(s.code()));
      e->set_message(std::string(s.message()));
    }
    Outgoing o;
    o.size = s.ok() && r->in_place_
                 ? SerializeReply(r->resp, r->in_place_tensor_, std::move(r->in_place_),
                                  r->in_place_bytes_, &o.bytes)
                 : SerializeReply(r->resp, &o.bytes);
    if (o.size < 0) {  // a bug: this request's answer is an error of its own
      r->resp.clear_result();
      r->resp.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInternal));
      r->resp.mutable_error()->set_message("the reply could not be built");
      o.size = SerializeReply(r->resp, &o.bytes);
    }
    if (svc_->inflight_ != nullptr) o.sending = svc_->inflight_->Sending(o.size, r->caller_);
    o.tenant = std::move(r->kept_tenant_);
    o.handle = std::move(r->kept_handle_);
    delete r;
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(std::move(o));
    Advance(lock);
  }

  void FreeKept(const Outgoing& o) {
    if (!o.handle.empty()) svc_->store_->Free(o.tenant, o.handle).IgnoreError();
  }

  // Does what the stream's state asks for next (write the next response, read the next request,
  // end the stream), the gRPC calls outside mu_; `lock` holds mu_ and is released on return.
  // busy_ counts threads between their decision and their gRPC call, so that no other thread
  // ends the stream (and frees it) meanwhile.
  void Advance(std::unique_lock<std::mutex>& lock) {
    for (;;) {
      if (finished_) return lock.unlock();
      const bool gone = Cancelled();
      if (gone) {  // nobody will take these: their kept outputs go
        for (const Outgoing& o : queue_) FreeKept(o);
        unanswered_ -= static_cast<int>(queue_.size());
        queue_.clear();
      }
      bool write = false, read = false;
      if (!writing_ && !queue_.empty()) {
        sent_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = write = true;
      }
      if (!reading_ && !reads_done_ && !draining_ && !gone && unanswered_ < max_unanswered_) {
        reading_ = read = true;
      }
      if (!write && !read) {
        // Ends once every request read has been answered and no write is out: when the client
        // has closed its side, the server drains, or the client is gone. A read still
        // outstanding (draining) fails once the status is sent.
        if (busy_ == 0 && unanswered_ == 0 && !writing_ && (reads_done_ || draining_ || gone)) {
          finished_ = true;
          lock.unlock();
          if (gone) {
            End(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
          } else if (draining_ && !reads_done_) {
            End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             "the server is shutting down: every request it read was answered; "
                             "send the others again elsewhere"));
          } else {
            End(grpc::Status::OK);
          }
          return;
        }
        return lock.unlock();
      }
      ++busy_;
      lock.unlock();
      if (write) {
        stall_.Waiting(sent_.size);  // a response the client does not take is a stall
        StartWrite(&sent_.bytes);
      }
      if (read) StartRead(&wire_);
      lock.lock();
      --busy_;
    }
  }

  void End(const grpc::Status& s) {
    svc_->RecordOther("Execute", s, 0, 0);
    stall_.Finishing();
    Finish(s);
  }

  KernelServiceImpl* const svc_;
  grpc::CallbackServerContext* const ctx_;
  const int max_unanswered_;
  absl::StatusOr<RequestContext> caller_;
  bool registered_ = false;  // in svc_->streams_
  grpc::ByteBuffer wire_;    // the next request as it arrives
  std::atomic<bool> cancelled_{false}, broken_{false};

  std::mutex mu_;
  int unanswered_ = 0;       // requests read whose response is not yet written
  int busy_ = 0;             // see Advance
  bool reading_ = false;     // a read is out
  bool reads_done_ = false;  // the client closed its side (or the stream broke)
  bool writing_ = false;     // a write (of sent_) is out
  bool draining_ = false;
  bool finished_ = false;
  std::deque<Outgoing> queue_;  // answered, waiting for the write before them
  Outgoing sent_;               // being written
  StallWatch::Call stall_;      // last: leaves the watch first
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KernelServiceImpl::Execute(
    grpc::CallbackServerContext* ctx) {
  return new ExecuteReactor(this, ctx);
}

void KernelServiceImpl::Refuse(OpSink* request, const absl::Status& s) {
  StartOther();
  RecordOther("Execute", ToGrpcStatus(s), 0, 0);
  request->Reply(s);
}

void KernelServiceImpl::Drain() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  draining_ = true;
  for (ExecuteReactor* s : streams_) s->Drain();
}

int64_t KernelServiceImpl::InflightUsed() const {
  return inflight_ != nullptr ? inflight_->used() : 0;
}

}  // namespace fusebox
