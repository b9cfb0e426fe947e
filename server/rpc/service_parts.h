// What the service's files share: where an op call ends (OpSink: the reply reactor of unary
// calls, or one request of an Execute stream), and a held tensor's TensorInfo. Internal to
// server/rpc.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "fusebox/v1/kernel_service.pb.h"
#include "server/core/inflight_bytes.h"
#include "server/core/request.h"
#include "server/core/tensor_store.h"
#include "server/rpc/messages.h"
#include "server/rpc/stall_watch.h"

namespace fusebox {

// UNIMPLEMENTED: the calls on held tensors, when the server was started without a store.
absl::Status NoStore();

// A held tensor as ListTensors, Upload and Download describe it.
void FillInfo(const StoredTensor& t, v1::TensorInfo* out);

// Where one op call ends (KernelServiceImpl::RunOp): a unary call's reactor, or one request of
// an Execute stream (execute.cc). RunOp calls Hold and Kept at most once each, then Reply once.
class OpSink {
 public:
  virtual ~OpSink() = default;
  // Whether the caller has gone (cancelled, past its deadline, ended by the stall watch): a
  // kept output is then not committed.
  virtual bool Cancelled() const = 0;
  // The call's in-flight reservation, to hold until its reply is on its way; its serialized
  // reply is counted as `tenant`'s.
  virtual void Hold(std::shared_ptr<void> inflight, std::string tenant) = 0;
  // The call's output was kept as `t`: free it should its reply never reach the caller.
  virtual void Kept(const StoredTensor& t) = 0;
  // The call's inline result is `bytes` of `data`, the data of `tensor` (a Tensor in the
  // response, its own data empty): the reply sends them from there (messages.h). At most once,
  // before Reply with OK.
  virtual void SendInPlace(const v1::Tensor* tensor, HostBytes data, size_t bytes) = 0;
  // Ends the call: its response (filled by RunOp) with OK, else the error alone.
  virtual void Reply(const absl::Status& s) = 0;
};

// A unary call's reactor (the ops, ListTensors). It owns the call's request and response
// messages (the service parses and serializes them itself: messages.h), holds the call's
// in-flight budget, watches its reply until it has gone, and gives back a kept output whose
// call was cancelled after the commit (its handle never reached the caller).
class OpReactor final : public grpc::ServerUnaryReactor, public OpSink {
 public:
  // `inflight` may be null (no limit); `reply` is the buffer gRPC sends.
  OpReactor(TensorStore* store, StallWatch* stalls, InflightBytes* inflight,
            grpc::CallbackServerContext* ctx, grpc::ByteBuffer* reply)
      : store_(store), inflight_(inflight), ctx_(ctx), reply_(reply), stall_(stalls, ctx) {}

  // The call's messages, which live until its reply is sent.
  template <typename Req, typename Resp>
  std::pair<Req*, Resp*> Messages() {
    auto* req = new Req;
    request_.reset(req);
    auto* resp = new Resp;
    response_.reset(resp);
    return {req, resp};
  }
  const google::protobuf::Message& request() const { return *request_; }
  // Where the request's tensor bytes stay (messages.h), as long as the request.
  ReceivedPayloads* payloads() { return &payloads_; }

  void Kept(const StoredTensor& t) override {
    tenant_ = t.tenant;
    handle_ = t.handle;
  }
  // Held until the reply is sent.
  void Hold(std::shared_ptr<void> inflight, std::string tenant) override {
    held_ = std::move(inflight);
    caller_ = std::move(tenant);
  }
  bool Cancelled() const override { return cancelled_.load() || ctx_->IsCancelled(); }
  void SendInPlace(const v1::Tensor* tensor, HostBytes data, size_t bytes) override {
    in_place_tensor_ = tensor;
    in_place_ = std::move(data);
    in_place_bytes_ = bytes;
  }
  void Reply(const absl::Status& s) override;

  // Sends the status, and with OK the response. The messages go first (the serialized reply
  // holds its own copy), and the call's reservation with them: what is left until the call
  // ends is the serialized reply, counted as one on its way (InflightBytes::Sending). Until
  // it has gone the call waits on its client (StallWatch).
  void Reply(const grpc::Status& s);

  // Both are short and never wait on the network, so gRPC runs them on the thread that ends
  // the call. Otherwise it hands every call's OnDone to its executor thread: a wake-up and a
  // context switch per call (lab/notes/rpc-path.md, "OnDone inline"). gRPC calls OnCancel
  // before OnDone when the call was cancelled, so OnDone reads the flag alone.
  bool InternalInlineable() override { return true; }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    if (!handle_.empty() && cancelled_.load()) store_->Free(tenant_, handle_).IgnoreError();
    delete this;
  }

 private:
  TensorStore* const store_;
  InflightBytes* const inflight_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const reply_;
  std::unique_ptr<google::protobuf::Message> request_, response_;
  ReceivedPayloads payloads_;
  const v1::Tensor* in_place_tensor_ = nullptr;  // SendInPlace's
  HostBytes in_place_;
  size_t in_place_bytes_ = 0;
  std::string tenant_, handle_;
  std::string caller_;             // whose reply it is
  std::shared_ptr<void> held_;     // the call's reservation, until Reply
  std::shared_ptr<void> sending_;  // the serialized reply's, until the call ends
  std::atomic<bool> cancelled_{false};
  StallWatch::Call stall_;  // last: leaves the watch first
};

}  // namespace fusebox
