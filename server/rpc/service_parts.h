// What the service's files share: the reply reactor of unary calls, and a held tensor's
// TensorInfo. Internal to server/rpc.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <grpcpp/support/server_callback.h>

#include "fusebox/v1/kernel_service.pb.h"
#include "server/core/tensor_store.h"
#include "server/rpc/stall_watch.h"

namespace fusebox {

// A held tensor as ListTensors, Upload and Download describe it.
void FillInfo(const StoredTensor& t, v1::TensorInfo* out);

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
    stall_.Finishing(bytes);
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

}  // namespace fusebox
