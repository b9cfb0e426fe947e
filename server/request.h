// Turns an op request into an OpCall, or into an error the caller can act on.
// Every check the service makes on a request lives here: dtypes, shapes, byte
// lengths, ranks, operand agreement and size limits. On success the response's
// output tensor is shaped and sized, and the OpCall writes straight into it
// (no extra copy of the result on its way out).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "fusebox/v1/kernel_service.pb.h"
#include "server/backend.h"

namespace fusebox {

struct RequestLimits {
  int64_t max_output_bytes = int64_t{1} << 30;  // larger outputs: RESOURCE_EXHAUSTED
};

// A validated call. `trivial` means there is nothing to compute (the output is
// empty, or it is fully determined without the backend) and it is already
// written; the backend is not involved.
struct PreparedCall {
  OpCall call;
  bool trivial = false;
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
};

absl::StatusOr<PreparedCall> PrepareGelu(const v1::GeluRequest& req, const RequestLimits& limits,
                                         v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareSoftmax(const v1::SoftmaxRequest& req,
                                            const RequestLimits& limits, v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareRowSum(const v1::RowSumRequest& req,
                                           const RequestLimits& limits, v1::Tensor* out);
absl::StatusOr<PreparedCall> PrepareMatmulRelu(const v1::MatmulReluRequest& req,
                                               const RequestLimits& limits, v1::Tensor* out);

}  // namespace fusebox
