// TLS on the gRPC port. gRPC's FileWatcherCertificateProvider reads the PEM files again every
// --tls_reload_s: new connections get what the files hold then, connections already open keep
// what they were made with, and nothing restarts. gRPC does not say what it loaded, nor that a
// pair caught half-replaced no longer matches (new handshakes then fail until it does), so the
// files are checked here as well: at start-up, where a bad file stops the server before it
// listens, and on the same interval after that (TlsFileWatch), where each change is logged
// with the certificate it brings or what is wrong with it.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "server/options.h"

namespace fusebox {

struct TlsFilesInfo {
  std::string description;  // one line: the certificate, and the client CA under mTLS
  std::string warning;      // not empty when the certificate is expired or not valid yet
};

// The TLS files of `o`, parsed: a certificate chain (one certificate at least), an unencrypted
// private key (gRPC takes no passphrase) that matches the chain's first certificate, and under
// mTLS a CA bundle (one certificate at least). INVALID_ARGUMENT names the flag, the file and
// what is wrong. `o` must have TLS on (TlsEnabled).
absl::StatusOr<TlsFilesInfo> ReadTlsFiles(const ServerOptions& o);

// The gRPC port's credentials: TLS from the files, reloaded (mTLS, requiring and verifying a
// client certificate, with a client CA); insecure without TLS.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerOptions& o);

// Every tls_reload_seconds until destroyed: when any TLS file has changed, logs what the files
// now hold (ReadTlsFiles) or why new handshakes may fail.
class TlsFileWatch {
 public:
  explicit TlsFileWatch(const ServerOptions& o);
  ~TlsFileWatch();
  TlsFileWatch(const TlsFileWatch&) = delete;
  TlsFileWatch& operator=(const TlsFileWatch&) = delete;

 private:
  void Run();

  const ServerOptions options_;
  std::string last_contents_;  // the files as last seen
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fusebox
