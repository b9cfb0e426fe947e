// Requests and replies of KernelService's methods, which the service registers raw (gRPC hands it
// the wire bytes) so that it parses each request itself: checked on the wire first (CheckWire), so
// parsing holds about the request's own size before any check; and a body that is not a valid
// message is INVALID_ARGUMENT with the reason, answered and counted like any other bad request
// (gRPC's own parse answers UNIMPLEMENTED, with no message, before the service sees the call).
//
// Tensor bytes do not pass through protobuf on a large op request or reply: a request's
// Tensor.data fields are left in gRPC's receive slices (ReceivedPayloads) and the backend copies
// them from there; a large inline result is sent from its own buffer as the reply's last slice.
// The wire format is the proto's: any generated client reads and writes it.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/core/request.h"

namespace fusebox {

// Parses `wire` into `msg`, then gives back its bytes (gRPC would otherwise keep them until the
// call ends). `wire` is a request buffer gRPC handed the service.
absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg);

// A request's Tensor.data bytes, left where gRPC received them: `by_tensor` says whose they are,
// `slices` keeps them alive. Hold it as long as the parsed request.
struct ReceivedPayloads {
  std::vector<grpc::Slice> slices;
  InlinePayloads by_tensor;
};

// ParseRequest for an op request (or an Execute request holding one): a request of
// kSentInPlaceBytes or more is parsed with its Tensor.data fields left out of `msg`, their bytes
// described in *payloads instead; a smaller one is parsed whole. Errors as ParseRequest's.
absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg,
                          ReceivedPayloads* payloads);

// Serializes `msg` into `wire`, what gRPC sends; returns the bytes it holds.
int64_t SerializeReply(const google::protobuf::Message& msg, grpc::ByteBuffer* wire);

// The same, with `data` (`bytes` long) as bytes field number `field` of `holder` (`msg` itself or
// a message inside it), which is empty in `msg`: sent from where it is, and freed by gRPC once
// sent. -1 (and nothing in `wire`) when `holder` is not such a message in `msg`: a bug, answered
// INTERNAL by the caller.
int64_t SerializeReply(const google::protobuf::Message& msg,
                       const google::protobuf::Message* holder, int field, HostBytes data,
                       size_t bytes, grpc::ByteBuffer* wire);
// An op's inline result: the data field of `tensor`, a Tensor inside `msg`.
inline int64_t SerializeReply(const google::protobuf::Message& msg, const v1::Tensor* tensor,
                              HostBytes data, size_t bytes, grpc::ByteBuffer* wire) {
  return SerializeReply(msg, tensor, v1::Tensor::kDataFieldNumber, std::move(data), bytes, wire);
}

}  // namespace fusebox
