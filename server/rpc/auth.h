// Who is calling: a bearer token (`authorization: Bearer <token>` metadata)
// looked up in a token file of `token tenant` lines ('#' starts a comment).
// Without a token file the server is open and every caller is tenant
// "anonymous". Unknown or missing tokens: UNAUTHENTICATED.
#pragma once

#include <map>
#include <string>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"

namespace fusebox {

class Authenticator {
 public:
  Authenticator() = default;  // open
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);

  bool open() const { return open_; }
  size_t tenants() const { return tenants_; }
  absl::StatusOr<std::string> TenantOf(const grpc::ServerContextBase& ctx) const;

 private:
  bool open_ = true;
  size_t tenants_ = 0;
  std::map<std::string, std::string> tenant_by_token_;
};

}  // namespace fusebox
