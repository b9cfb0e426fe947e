// fusebox.v1.KernelService on gRPC's callback API. Op methods validate their
// request (server/core/request.h), submit the call to the backend and return; the
// backend's thread finishes the RPC. Upload and Download stream chunks through
// the backend's copy queue. No gRPC thread ever waits on compute or copies.
// One concern a file: ops.cc, upload.cc, download.cc, tensors.cc, execute.cc (the op stream);
// service.cc the shared parts.
// Every method is registered raw: the service parses its requests and serializes its replies
// itself (messages.h), so it checks a request's wire bytes before parsing them, and answers a
// body that does not parse with INVALID_ARGUMENT.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/functional/function_ref.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/rpc/auth.h"
#include "server/exec/backend.h"
#include "server/rpc/metrics.h"
#include "server/core/request.h"
#include "server/rpc/stall_watch.h"
#include "server/core/tensor_store.h"
#include "server/core/pending_uploads.h"

namespace fusebox {

using RawKernelService = v1::KernelService::WithRawCallbackMethod_RegisterSharedMemory<
    v1::KernelService::WithRawCallbackMethod_UnregisterSharedMemory<
    v1::KernelService::WithRawCallbackMethod_ListSharedMemory<
    v1::KernelService::WithRawCallbackMethod_Gelu<
    v1::KernelService::WithRawCallbackMethod_Softmax<
        v1::KernelService::WithRawCallbackMethod_RowSum<
            v1::KernelService::WithRawCallbackMethod_MatmulRelu<
                v1::KernelService::WithRawCallbackMethod_Upload<
                    v1::KernelService::WithRawCallbackMethod_Download<
                        v1::KernelService::WithRawCallbackMethod_FreeTensor<
                            v1::KernelService::WithRawCallbackMethod_ListTensors<
                                v1::KernelService::WithRawCallbackMethod_CreateUpload<
                                    v1::KernelService::WithRawCallbackMethod_WriteUpload<
                                        v1::KernelService::WithRawCallbackMethod_CommitUpload<
                                            v1::KernelService::WithRawCallbackMethod_AbortUpload<
                                                v1::KernelService::WithRawCallbackMethod_Execute<
                                                v1::KernelService::Service>>>>>>>>>>>>>>>>;

class OpSink;  // service_parts.h

class KernelServiceImpl final : public RawKernelService {
 public:
  // `metrics` and `store` may be null (no /metrics; no resident tensors).
  // All must outlive this.
  // `shm`: registered shared memory; null = none (RegisterSharedMemory refused).
  KernelServiceImpl(Backend* backend, Metrics* metrics, TensorStore* store,
                    const Authenticator* auth, RequestLimits limits,
                    SharedMemoryRegistry* shm = nullptr);

  grpc::ServerUnaryReactor* Gelu(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Softmax(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* RowSum(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* MatmulRelu(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;

  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* ctx,
                                                    grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* FreeTensor(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  // shared_memory.cc
  grpc::ServerUnaryReactor* RegisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* req,
                                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req,
                                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListSharedMemory(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req,
                                             grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Execute(
      grpc::CallbackServerContext* ctx) override;

  // The server is shutting down: every Execute stream stops reading, answers what it has
  // read, and ends UNAVAILABLE; a stream opened from now on ends so at once. Unary calls are
  // gRPC's to drain (Server::Shutdown).
  void Drain();
  // Host bytes the in-flight budget holds now (InflightBytes::used; 0 without a limit).
  int64_t InflightUsed() const;

  // Ranged uploads (ranged_upload.cc): a reservation, writes of byte ranges on any number of
  // streams, and a commit once every byte is written.
  grpc::ServerUnaryReactor* CreateUpload(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* WriteUpload(grpc::CallbackServerContext* ctx,
                                                         grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* CommitUpload(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* AbortUpload(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;

  // Cancels the calls that have waited on their clients past the stall timeout (StallWatch),
  // and drops ranged uploads left idle past it; returns how many calls it cancelled. The
  // server's sweeper calls it.
  int CancelStalled();
  // Ranged uploads open (created, not yet committed, aborted or dropped); 0 without a store.
  int64_t PendingUploadCount() const;

 private:
  class UploadReactor;
  class DownloadReactor;
  class WriteUploadReactor;
  class ExecuteReactor;

  // An RPC that runs no op (Upload, Download, FreeTensor, ListTensors) in the
  // metrics, if any: StartOther when it arrives (calls_in_flight), RecordOther
  // once when it ends.
  void StartOther() const;
  void RecordOther(const char* method, const grpc::Status& status, int64_t bytes_in,
                   int64_t bytes_out) const;
  // Parses a ListTensors request into *req and fills its reply, after reserving in-flight
  // budget for a large one in *held; *tenant is the caller's.
  grpc::Status ListInto(const grpc::CallbackServerContext& ctx, const grpc::ByteBuffer* wire,
                        v1::ListTensorsRequest* req, v1::ListTensorsResponse* resp,
                        std::shared_ptr<void>* held, std::string* tenant) const;
  // Reserves `bytes` of the in-flight budget (and of `tenant`'s share) for a transfer's or a
  // listing's buffers: a token to hold while they live (null where there is no limit), or
  // RESOURCE_EXHAUSTED naming `what` and ending with `advice`.
  absl::StatusOr<std::shared_ptr<void>> ReserveTransfer(const std::string& tenant, int64_t bytes,
                                                        const char* what,
                                                        const char* advice) const;
  // What an upload stream (Upload, WriteUpload) holds of the message it is on: each stays in
  // host memory until the backend has copied it in, so one at a time, under an in-flight
  // reservation sized for the largest message so far.
  struct StreamMessage {
    grpc::ByteBuffer wire;         // the next message as it arrives
    std::shared_ptr<void> budget;  // in-flight budget for one message of budget_bytes
    int64_t budget_bytes = 0;      // the largest message so far
  };
  // Makes `m`'s budget cover a message of `n` bytes of `tenant`'s: for one larger than any
  // before, the old reservation goes back first, then a new one is made (ReserveTransfer,
  // naming `what`), or RESOURCE_EXHAUSTED.
  absl::Status HoldMessage(const std::string& tenant, int64_t n, const char* what,
                           StreamMessage* m) const;
  // Ends an upload stream that has no copy in flight, with `s`, counted as `method` with
  // `written` bytes in: the parsed message `msg` and `m`'s bytes and budget go back before the
  // status does, so the client's next call finds them free; then the call leaves the stall
  // watch (`stall`) and `reactor` finishes.
  void EndUploadStream(grpc::ServerReadReactor<grpc::ByteBuffer>* reactor,
                       StallWatch::Call* stall, const char* method, const grpc::Status& s,
                       int64_t written, google::protobuf::Message* msg, StreamMessage* m) const;
  // Readies a kept output or an upload for its commit, once its call's status is OK: none
  // past the call's deadline (the server's is never before the client's: the client has given
  // up, and a handle sent now reaches no one), DEADLINE_EXCEEDED instead; and one whose reply
  // leaves less than kUnsureBeforeDeadline before the deadline may still arrive after the
  // client gave up, which the server cannot see (gRPC reports the call complete), so it is
  // held unclaimed: freed after the stall timeout unless a call names its handle first.
  absl::Status BeforeCommit(const grpc::CallbackServerContext& ctx, StoredTensor* t) const;
  // The one body of the unary RPCs with a small request and reply that run no op (FreeTensor,
  // the ranged uploads' Create and Abort, the shared-memory registry), answered on the calling
  // thread: who calls, `wire` parsed into `req`, then `answer` for the caller fills the reply
  // and gives the status the call ends with, counted as `method`.
  grpc::ServerUnaryReactor* AnswerUnary(
      const char* method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
      google::protobuf::Message* req,
      absl::FunctionRef<absl::Status(const RequestContext&)> answer);
  // Who is calling and where their handles resolve, or UNAUTHENTICATED.
  absl::StatusOr<RequestContext> Context(const grpc::CallbackServerContext& ctx) const;
  // Validates and runs one op request to its end at sink->Reply (ops.cc): the one body of the
  // four op methods and of Execute's requests. `caller` is who calls (or why not), `parsed`
  // whether `req` parsed, `payloads` where its tensor bytes stayed (ReceivedPayloads); the
  // result goes into `output` (the kernel writes an inline one in place) and `timing`.
  // `arrived` (steady ns) is the origin of queue_us and total_us.
  template <typename Req>
  void RunOp(grpc::CallbackServerContext* ctx, int64_t arrived,
             const absl::StatusOr<RequestContext>& caller, absl::Status parsed, const Req& req,
             const InlinePayloads* payloads, v1::TensorRef* output, v1::Timing* timing,
             OpSink* sink);
  // Answers an Execute request that names no op or does not parse with `s`, counted in the
  // metrics as an Execute call.
  void Refuse(OpSink* request, const absl::Status& s);
  // A unary op method: parses the request and hands it to RunOp with an OpReactor.
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* UnaryOp(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* wire, grpc::ByteBuffer* reply);

  Backend* const backend_;
  Metrics* const metrics_;
  TensorStore* const store_;
  const Authenticator* const auth_;
  const RequestLimits limits_;
  const std::unique_ptr<InflightBytes> inflight_;  // null: no limit
  StallWatch stalls_;
  SharedMemoryRegistry* const shm_;  // null: no shared memory
  // Ranged uploads; null without a store. Idle ones are dropped after the stall timeout (the
  // idle expiry where that is 0), from CancelStalled.
  const std::unique_ptr<PendingUploads> uploads_;
  // Execute streams open now, for Drain; a stream leaves in its OnDone.
  std::mutex streams_mu_;
  std::set<ExecuteReactor*> streams_;  // guarded by streams_mu_
  bool draining_ = false;              // guarded by streams_mu_
};

}  // namespace fusebox
