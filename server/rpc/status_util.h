// The one place where internal errors become gRPC statuses. absl::StatusCode
// values are gRPC's canonical codes, so the mapping is a cast; messages pass
// through unchanged so the caller sees what to fix.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace fusebox {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace fusebox
