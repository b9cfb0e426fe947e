// fusebox.v1.KernelService on gRPC's callback API. Each method validates its
// request (server/request.h), submits the call to the backend and returns; the
// backend's thread finishes the RPC. No gRPC thread ever waits on compute.
#pragma once

#include <cstdint>

#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/backend.h"
#include "server/metrics.h"
#include "server/request.h"

namespace fusebox {

class KernelServiceImpl final : public v1::KernelService::CallbackService {
 public:
  // `metrics` may be null (no /metrics endpoint). Both must outlive this.
  KernelServiceImpl(Backend* backend, Metrics* metrics, RequestLimits limits);

  grpc::ServerUnaryReactor* Gelu(grpc::CallbackServerContext* ctx, const v1::GeluRequest* req,
                                 v1::GeluResponse* resp) override;
  grpc::ServerUnaryReactor* Softmax(grpc::CallbackServerContext* ctx,
                                    const v1::SoftmaxRequest* req,
                                    v1::SoftmaxResponse* resp) override;
  grpc::ServerUnaryReactor* RowSum(grpc::CallbackServerContext* ctx, const v1::RowSumRequest* req,
                                   v1::RowSumResponse* resp) override;
  grpc::ServerUnaryReactor* MatmulRelu(grpc::CallbackServerContext* ctx,
                                       const v1::MatmulReluRequest* req,
                                       v1::MatmulReluResponse* resp) override;

 private:
  // Common tail of every op method: run `prepared` (or report why it can't
  // run), fill `timing`, record metrics, finish the RPC.
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const char* method, Op op,
                                int64_t arrived_ns, absl::StatusOr<PreparedCall> prepared,
                                v1::Timing* timing);

  Backend* const backend_;
  Metrics* const metrics_;
  const RequestLimits limits_;
};

}  // namespace fusebox
