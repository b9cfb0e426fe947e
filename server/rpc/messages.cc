// ParseRequest and SerializeReply (see messages.h).
#include "server/rpc/messages.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "server/core/wire_check.h"

namespace fusebox {

absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg) {
  // The handler's request buffer is gRPC's, made for this call alone: emptying it early is ours
  // to do, and frees the request's bytes while the call computes.
  auto* bytes = const_cast<grpc::ByteBuffer*>(wire);
  absl::Status s;
  {
    grpc::ByteBuffer view(*bytes);  // shares the slices
    grpc::ProtoBufferReader reader(&view);
    s = reader.status().ok() ? CheckWire(&reader, msg->GetDescriptor())
                             : absl::InvalidArgumentError("the request body cannot be read");
  }
  if (s.ok()) {
    grpc::ByteBuffer view(*bytes);
    grpc::ProtoBufferReader reader(&view);
    if (!msg->ParseFromZeroCopyStream(&reader)) {
      s = absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                  msg->GetDescriptor()->full_name()));
    }
  }
  bytes->Clear();
  if (!s.ok()) msg->Clear();
  return s;
}

int64_t SerializeReply(const google::protobuf::Message& msg, grpc::ByteBuffer* wire) {
  wire->Clear();  // gRPC's serializer writes only into an empty buffer
  bool own = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(msg, wire, &own);
  return static_cast<int64_t>(wire->Length());
}

}  // namespace fusebox
