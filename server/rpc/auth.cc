// Authenticator: see auth.h.
#include "server/rpc/auth.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace fusebox {
namespace {

// Equal bytes, in a time that depends on the lengths only (not on where they first differ):
// a caller timing its rejections learns nothing about a token's bytes.
bool SameBytes(absl::string_view a, absl::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(i < b.size() ? b[i] : 0);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  Authenticator a;
  a.open_ = false;
  std::set<std::string> tenants;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string token, tenant, extra;
    if (!(fields >> token)) continue;  // blank
    if (!(fields >> tenant) || (fields >> extra)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": expected `token tenant`"));
    }
    if (!a.tenant_by_token_.emplace(token, tenant).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": token listed twice"));
    }
    tenants.insert(tenant);
  }
  if (a.tenant_by_token_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " lists no tokens"));
  }
  a.tenants_ = tenants.size();
  return a;
}

absl::StatusOr<std::string> Authenticator::TenantOf(const grpc::ServerContextBase& ctx) const {
  if (open_) return std::string("anonymous");
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing `authorization: Bearer <token>` metadata");
  }
  absl::string_view value(it->second.data(), it->second.size());
  // The scheme's case does not matter (RFC 7235), the token's does.
  if (!absl::StartsWithIgnoreCase(value, "Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata must be `Bearer <token>`");
  }
  value.remove_prefix(7);
  // Every token is compared, each in full: no early exit, no ordered search.
  const std::string* tenant = nullptr;
  for (const auto& [token, name] : tenant_by_token_) {
    if (SameBytes(value, token)) tenant = &name;
  }
  if (tenant == nullptr) return absl::UnauthenticatedError("unknown token");
  return *tenant;
}

}  // namespace fusebox
