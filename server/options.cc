// CheckOptions (see options.h): every flag's range, in one place.
#include "server/options.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/parallel_copy.h"

namespace fusebox {
namespace {

// gRPC listens on a host without a port at 443, and takes a port past 65535 modulo 2^16: a
// typo would listen somewhere else. TCP addresses need HOST:PORT ([V6]:PORT for IPv6; after
// a dns:///, ipv4: or ipv6: prefix too); socket addresses pass as they are.
absl::Status CheckListenAddress(const std::string& address) {
  if (IsSocketAddress(address)) return absl::OkStatus();
  std::string hostport = address;
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (hostport.rfind(scheme, 0) == 0) hostport = hostport.substr(std::strlen(scheme));
  }
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("--address=", address, ": ", why));
  };
  size_t colon;
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos || close + 1 >= hostport.size() || hostport[close + 1] != ':') {
      return bad("an IPv6 address takes the form [V6]:PORT");
    }
    colon = close + 1;
  } else {
    colon = hostport.find(':');
    if (colon == std::string::npos) return bad("HOST:PORT needs the port (0 picks a free one)");
    if (hostport.find(':', colon + 1) != std::string::npos) {
      return bad("an IPv6 address takes the form [V6]:PORT");
    }
  }
  const std::string port = hostport.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    return bad("the port must be a number in 0..65535");
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxMib = std::numeric_limits<int64_t>::max() >> 20;
constexpr int64_t kMaxConnections = int64_t{1} << 20;  // a descriptor each
constexpr int64_t kMaxStreams = 100000;
constexpr int64_t kMaxStreamInflight = 65536;  // a stream's unanswered requests

// The TLS files: given in pairs that make sense, and readable now (their contents are
// server/tls.cc's to check). A file that cannot be read would otherwise show only as
// handshakes failing, with gRPC's log the only sign.
absl::Status CheckTlsFiles(const ServerOptions& o) {
  const bool cert = !o.tls_cert_file.empty(), key = !o.tls_key_file.empty();
  if (cert != key) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key come together: both (TLS) or neither (plaintext)");
  }
  if (!o.tls_client_ca_file.empty() && !cert) {
    return absl::InvalidArgumentError(
        "--tls_client_ca (mTLS) needs --tls_cert and --tls_key: client certificates are "
        "asked for only inside TLS");
  }
  if (o.tls_reload_seconds < 1 || o.tls_reload_seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_s must be in 1..86400, not ", o.tls_reload_seconds));
  }
  const std::pair<const char*, const std::string*> files[] = {
      {"--tls_cert", &o.tls_cert_file},
      {"--tls_key", &o.tls_key_file},
      {"--tls_client_ca", &o.tls_client_ca_file}};
  for (const auto& [flag, path] : files) {
    if (path->empty()) continue;
    errno = 0;
    std::ifstream f(*path, std::ios::binary);
    char c;
    if (f && f.get(c)) continue;
    const int err = errno;  // open's, or read's (a directory: EISDIR)
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", *path, ": ", err != 0 ? std::strerror(err) : "empty", " (a PEM file)"));
  }
  return absl::OkStatus();
}

// A replica id travels in handles (before their '.'), in a metadata header and in pod and DNS
// names: a DNS label's characters, and '_'.
bool ValidReplicaId(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

}  // namespace

int64_t FairShareDivisor(size_t tenants) {
  return std::clamp<int64_t>(static_cast<int64_t>(tenants), 1, 4);
}

bool IsSocketAddress(const std::string& address) {
  for (const char* scheme : {"unix:", "unix-abstract:", "vsock:"}) {
    if (address.rfind(scheme, 0) == 0) return true;
  }
  return false;
}

absl::Status CheckOptions(const ServerOptions& o) {
  auto bad = [](const std::string& why) { return absl::InvalidArgumentError(why); };
  const BackendChoice& b = o.backend;
  if (b.kind != "auto" && b.kind != "cpu" && b.kind != "cuda") {
    return bad(absl::StrCat("--backend=", b.kind, " is unknown: use auto, cpu or cuda"));
  }
  if (b.cpu.workers < 1) return bad("--workers must be >= 1");
  if (b.cpu.copy_threads < 0 || b.cpu.copy_threads > kMaxCopyThreads ||
      b.cuda.copy_threads < 0 || b.cuda.copy_threads > kMaxCopyThreads) {
    return bad(absl::StrCat("--copy_threads must be in 0..", kMaxCopyThreads, " (0 = automatic)"));
  }
  if (b.cpu.queue_capacity < 1 || b.cuda.queue_capacity < 1) {
    return bad("--queue_capacity must be >= 1");
  }
  if (b.cpu.batch.wait_us < 0 || b.cpu.batch.wait_us > 1000000 || b.cuda.batch.wait_us < 0 ||
      b.cuda.batch.wait_us > 1000000) {
    return bad("--batch_wait_us must be in 0..1000000");
  }
  // GPU options only where the CUDA backend is tried.
  if (b.kind != "cpu") {
    if (b.cuda.streams < 1 || b.cuda.streams > kMaxCudaStreams) {
      return bad(absl::StrCat("--streams must be in 1..", kMaxCudaStreams, ", not ", b.cuda.streams));
    }
    if (b.cuda.device < 0) {  // no host has it (one past the last is the module's to say)
      return bad(absl::StrCat("--cuda_device must be >= 0, not ", b.cuda.device));
    }
    if (b.cuda.staging_bytes > (size_t{1} << 40)) return bad("--staging_mib must be in 0..1048576");
  }
  if (o.cpu_threads < 0) return bad("--cpu_threads must be >= 0");
  // At least 64 KiB: inline results get the limit less 4 KiB, downloads a chunk of it.
  if (o.max_message_bytes < kMinMessageBytes || o.max_message_bytes > INT_MAX) {
    return bad(absl::StrCat("--max_message_bytes must be in ", kMinMessageBytes, "..", INT_MAX,
                            " (gRPC's limit)"));
  }
  if (absl::Status s = CheckListenAddress(o.address); !s.ok()) return s;
  // Seconds: finite and at most a day (a double past int64 nanoseconds stopped at once).
  auto seconds_ok = [](double s) { return std::isfinite(s) && s >= 0 && s <= 86400; };
  if (!seconds_ok(o.drain_seconds) || !seconds_ok(o.shutdown_notice_seconds) ||
      !seconds_ok(o.stall_timeout_seconds)) {
    return bad("--drain_seconds, --shutdown_notice_s and --stall_timeout_s must be in 0..86400");
  }
  if (o.store_budget_bytes < 0 || o.tenant_quota_bytes < 0 || o.max_tensor_bytes < 0) {
    return bad(absl::StrCat(
        "--store_budget_mib, --tenant_quota_mib and --max_tensor_mib must be in 0..", kMaxMib));
  }
  if (o.max_tensors < 1) return bad("--max_tensors must be >= 1");
  if (o.max_tensors_per_tenant < 0) return bad("--max_tensors_per_tenant must be >= 0");
  if (o.inflight_bytes < 0) return bad(absl::StrCat("--inflight_mib must be in 0..", kMaxMib));
  if (!(o.tenant_inflight_share >= 0 && o.tenant_inflight_share <= 1)) {  // NaN too
    return bad("--tenant_inflight_share must be in 0..1 (0 = automatic)");
  }
  if (o.max_connections < 1 || o.max_connections > kMaxConnections) {
    return bad(absl::StrCat("--max_connections must be in 1..", kMaxConnections));
  }
  if (!(o.handshake_timeout_seconds > 0 && o.handshake_timeout_seconds <= 3600)) {
    return bad("--handshake_timeout_s must be in (0, 3600]");
  }
  if (!seconds_ok(o.arrival_timeout_seconds)) {
    return bad("--arrival_timeout_s must be in 0..86400");
  }
  if (o.max_streams_per_connection < 1 || o.max_streams_per_connection > kMaxStreams) {
    return bad(absl::StrCat("--max_streams_per_connection must be in 1..", kMaxStreams));
  }
  if (o.stream_max_inflight < 1 || o.stream_max_inflight > kMaxStreamInflight) {
    return bad(absl::StrCat("--stream_max_inflight must be in 1..", kMaxStreamInflight));
  }
  if (!(o.idle_expiry_seconds >= 0 && o.idle_expiry_seconds <= 315360000)) {  // NaN too
    return bad("--idle_expiry_s must be in 0..315360000 (ten years; 0 = never)");
  }
  if (o.max_shm_regions_per_tenant < 1 || o.max_shm_regions_per_tenant > 4096) {
    return bad("--max_shm_regions_per_tenant must be in 1..4096");
  }
  if (o.shm_tenant_quota_bytes < 0) {
    return bad(absl::StrCat("--shm_tenant_quota_mib must be in 0..", kMaxMib));
  }
  if (!(o.shm_idle_expiry_seconds >= 0 && o.shm_idle_expiry_seconds <= 315360000)) {
    return bad("--shm_idle_expiry_s must be in 0..315360000 (ten years; 0 = never)");
  }
  if (o.malloc_retain_bytes < 0) {
    return bad(absl::StrCat("--malloc_retain_mib must be in 0..", kMaxMib));
  }
  if (o.malloc_arenas < 0 || o.malloc_arenas > 1024) {
    return bad("--malloc_arenas must be in 0..1024 (0 = glibc's default)");
  }
  if (!ValidReplicaId(o.replica_id) && !o.replica_id.empty()) {
    return bad("--replica_id must be 1-63 letters, digits, '-' or '_' (or empty)");
  }
  return CheckTlsFiles(o);
}

std::string ReplicaIdFromHostname(const std::string& hostname) {
  const std::string label = hostname.substr(0, hostname.find('.'));
  return ValidReplicaId(label) ? label : std::string();
}

}  // namespace fusebox
