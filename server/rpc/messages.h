// Requests and replies of KernelService's methods, which the service registers raw (gRPC hands it
// the wire bytes) so that it parses each request itself: checked on the wire first (CheckWire), so
// parsing holds about the request's own size before any check; and a body that is not a valid
// message is INVALID_ARGUMENT with the reason, answered and counted like any other bad request
// (gRPC's own parse answers UNIMPLEMENTED, with no message, before the service sees the call).
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>

#include "absl/status/status.h"

namespace fusebox {

// Parses `wire` into `msg`, then gives back its bytes (gRPC would otherwise keep them until the
// call ends). `wire` is a request buffer gRPC handed the service.
absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg);

// Serializes `msg` into `wire`, what gRPC sends; returns the bytes it holds.
int64_t SerializeReply(const google::protobuf::Message& msg, grpc::ByteBuffer* wire);

}  // namespace fusebox
