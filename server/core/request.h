// Turns an op request into an OpCall, or into an error the caller can act on.
// Every check the service makes on a request lives here: dtypes, shapes, byte
// lengths, ranks, operand agreement and size limits. On success the response's
// output tensor is shaped, and the OpCall writes straight into its bytes: the
// tensor's data field, or for a large result (kSentInPlaceBytes) a buffer of its
// own that the reply sends as it is; either way no copy on its way out. Inline
// inputs are read where they are: the message's data field, or the pieces the
// service left them in (InlinePayloads).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "fusebox/v1/kernel_service.pb.h"
#include "server/exec/backend.h"
#include "server/core/inflight_bytes.h"
#include "server/core/shared_memory.h"
#include "server/core/tensor_store.h"

namespace fusebox {

struct RequestLimits {
  int64_t max_output_bytes = int64_t{1} << 30;  // larger inline outputs: RESOURCE_EXHAUSTED
  int64_t max_inflight_bytes = 0;               // InflightBytes' limit; 0 = none
  int64_t max_tenant_inflight_bytes = 0;        // a tenant's share of it; 0 = all of it
  int64_t max_sending_bytes = 0;  // its replies on their way (Sending); 0 = max_inflight_bytes
  double stall_timeout_seconds = 0;             // StallWatch's timeout; 0 = none
  int64_t max_message_bytes = int64_t{1} << 30;  // the largest message a client may send
  // Execute: requests one stream may have read and not yet answered (--stream_max_inflight);
  // at the bound the server stops reading the stream until a response has gone.
  int stream_max_inflight = 64;
};

// A request's inline tensor bytes kept out of its parsed message (the service parses large
// requests so: server/rpc/messages.h): by the Tensor message they belong to, the pieces that
// hold them. Whoever fills it keeps the pieces' memory alive until the call has ended.
class InlinePayloads {
 public:
  void Add(const v1::Tensor* tensor, HostPieces pieces) {
    found_.emplace_back(tensor, std::move(pieces));
  }
  // `tensor`'s bytes, or null when they are in its data field as usual. The last added wins
  // (a repeated field's last occurrence, as in parsing).
  const HostPieces* Find(const v1::Tensor* tensor) const {
    for (auto it = found_.rbegin(); it != found_.rend(); ++it) {
      if (it->first == tensor) return &it->second;
    }
    return nullptr;
  }

 private:
  std::vector<std::pair<const v1::Tensor*, HostPieces>> found_;  // a request has at most 3
};

// An inline result at least this large is computed into its own buffer (HostBytes, from
// Backend::AllocateHostBytes) and sent
// from there as it is; a smaller one is written into the reply message's data field.
constexpr int64_t kSentInPlaceBytes = int64_t{64} << 10;

// Who asks, and where handles resolve. Without a store, handles are UNIMPLEMENTED.
struct RequestContext {
  RequestLimits limits;
  TensorStore* store = nullptr;
  InflightBytes* inflight = nullptr;  // null: no limit
  std::string tenant = "anonymous";
  SharedMemoryRegistry* shm = nullptr;  // null: TensorRef.shared is FAILED_PRECONDITION
  const InlinePayloads* payloads = nullptr;  // null: every inline tensor's bytes are in its message
  Backend* backend = nullptr;  // where a large inline result's memory comes from; null: malloc
};

// A validated call. `trivial` means there is nothing for the backend to
// compute: the output is empty, or fully determined (zero-length sums); its
// bytes are then in the inline output already, or in `trivial_bytes` when the
// output is kept on the server.
struct PreparedCall {
  OpCall call;
  bool trivial = false;
  std::string trivial_bytes;
  int64_t bytes_in = 0;   // inline input bytes
  int64_t bytes_out = 0;  // inline output bytes
  std::vector<std::shared_ptr<StoredTensor>> held;  // resident inputs, kept alive
  std::shared_ptr<StoredTensor> kept_output;        // commit on success
  std::shared_ptr<void> inflight;                   // the InflightBytes reservation
  // An inline result of kSentInPlaceBytes or more: its bytes (call.output points here), for the
  // reply to send as they are; the reply's tensor then has only its dtype and shape.
  HostBytes inline_output;
  // Shared-memory regions the call reads or writes, kept mapped until it ends; and, when its
  // output goes into one, the reply's description of it (has_shared_output).
  std::vector<std::shared_ptr<SharedRegion>> regions;
  struct SharedInput {
    const SharedRegion* region;
    int64_t offset, bytes;
  };
  std::vector<SharedInput> shared_inputs;  // to refuse an output that overlaps one
  bool has_shared_output = false;
  v1::SharedTensor shared_output;
};

// OK, or FAILED_PRECONDITION when a region the call used was truncated under it (its SIGBUS
// guard fired): the call's result is lost. Asked once the backend is done.
absl::Status SharedRegionsIntact(const PreparedCall& p);

// Resolves a SharedTensor (Upload's source): the region, held, and a checked pointer to its
// bytes; `what` names it in messages.
struct SharedSource {
  std::shared_ptr<SharedRegion> region;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  void* data = nullptr;
};
absl::StatusOr<SharedSource> ResolveShared(const v1::SharedTensor& ref, const RequestContext& ctx,
                                           const std::string& what);

// `out` receives the inline output tensor (shaped, sized), unless the request
// keeps its output on the server; then kept_output is set instead.
absl::StatusOr<PreparedCall> PrepareGelu(const v1::GeluRequest& req, const RequestContext& ctx,
                                         v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareSoftmax(const v1::SoftmaxRequest& req,
                                            const RequestContext& ctx, v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareRowSum(const v1::RowSumRequest& req,
                                           const RequestContext& ctx, v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareMatmulRelu(const v1::MatmulReluRequest& req,
                                               const RequestContext& ctx, v1::Tensor* out);

// The largest result that needs no kernel (a row sum over a zero-length axis, a product with
// K = 0) when the request's inline tensors are smaller: past both, RESOURCE_EXHAUSTED.
constexpr int64_t kMaxNoKernelOutputBytes = int64_t{64} << 10;

// The most axes a tensor may have (as NumPy): more is INVALID_ARGUMENT. Shapes are
// held uncharged and echoed in messages and replies, so their size is bounded.
constexpr int kMaxRank = 64;

// The shape and byte size of a dtype/shape pair, checked (rank, negative dims,
// overflow) as for an inline tensor; `what` names it in messages.
absl::StatusOr<int64_t> CheckedBytes(DType dtype, const google::protobuf::RepeatedField<int64_t>& shape,
                                     const char* what);
absl::StatusOr<DType> CheckedDType(v1::DType dtype, const char* what);

}  // namespace fusebox
