// The TLS files' check, the gRPC port's credentials and TlsFileWatch: see tls.h.
#include "server/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <vector>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fusebox {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

// A passphrase callback that has none: OpenSSL's default would ask on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

// OpenSSL's first queued error as text (the queue is then cleared).
std::string OpenSslError(const char* otherwise) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return otherwise;
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

absl::Status Bad(const char* flag, const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": ", why));
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream text;
  if (!(f && text << f.rdbuf())) return Bad(flag, path, "cannot be read");
  return text.str();
}

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// Every CERTIFICATE block of a PEM text, in order (other blocks are skipped, as gRPC does).
absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(const char* flag, const std::string& path,
                                                      const std::string& pem) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(x);
  }
  // The loop ends at the end of the text (no further BEGIN line) or at a block it cannot parse.
  const unsigned long e = ERR_peek_last_error();
  const bool at_end = ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
  if (certs.empty() || (e != 0 && !at_end)) {
    return Bad(flag, path,
               absl::StrCat("not a PEM certificate (",
                            OpenSslError("no BEGIN CERTIFICATE line"), ")"));
  }
  ERR_clear_error();
  return certs;
}

// What was printed into a memory BIO.
std::string Drain(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

std::string Name(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253);
  return Drain(bio.get());
}

std::string Time(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  return Drain(bio.get());
}

// The TLS files' bytes, for TlsFileWatch to notice a change; *readable: whether every one could
// be read (one that cannot counts as empty).
std::string Contents(const ServerOptions& o, bool* readable) {
  std::string all;
  *readable = true;
  for (const std::string* path : {&o.tls_cert_file, &o.tls_key_file, &o.tls_client_ca_file}) {
    if (path->empty()) continue;
    auto text = ReadFile("", *path);
    *readable = *readable && text.ok();
    all += text.ok() ? *text : std::string();
    all += '\0';
  }
  return all;
}

}  // namespace

absl::StatusOr<TlsFilesInfo> ReadTlsFiles(const ServerOptions& o) {
  auto cert_pem = ReadFile("--tls_cert", o.tls_cert_file);
  if (!cert_pem.ok()) return cert_pem.status();
  auto chain = ReadCertificates("--tls_cert", o.tls_cert_file, *cert_pem);
  if (!chain.ok()) return chain.status();
  X509* leaf = (*chain)[0].get();

  auto key_pem = ReadFile("--tls_key", o.tls_key_file);
  if (!key_pem.ok()) return key_pem.status();
  ERR_clear_error();
  KeyPtr key(PEM_read_bio_PrivateKey(MemoryBio(*key_pem).get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    const bool encrypted = key_pem->find("ENCRYPTED") != std::string::npos;
    return Bad("--tls_key", o.tls_key_file,
               encrypted ? "an encrypted key (gRPC takes no passphrase: decrypt it, keep the "
                           "file private)"
                         : absl::StrCat("not a PEM private key (",
                                        OpenSslError("no BEGIN PRIVATE KEY line"), ")"));
  }
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return Bad("--tls_key", o.tls_key_file,
               absl::StrCat("does not match the certificate in ", o.tls_cert_file, " (",
                            Name(X509_get_subject_name(leaf)), ")"));
  }

  TlsFilesInfo info;
  info.description = absl::StrCat(
      "certificate ", Name(X509_get_subject_name(leaf)), " from ",
      Name(X509_get_issuer_name(leaf)), ", valid until ", Time(X509_get0_notAfter(leaf)),
      chain->size() > 1 ? absl::StrCat(" (+", chain->size() - 1, " in its chain)") : "");
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    info.warning = absl::StrCat("the certificate in ", o.tls_cert_file, " expired on ",
                                Time(X509_get0_notAfter(leaf)), ": clients will refuse it");
  } else if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    info.warning = absl::StrCat("the certificate in ", o.tls_cert_file, " is valid only from ",
                                Time(X509_get0_notBefore(leaf)), ": clients will refuse it");
  }

  if (!o.tls_client_ca_file.empty()) {
    auto ca_pem = ReadFile("--tls_client_ca", o.tls_client_ca_file);
    if (!ca_pem.ok()) return ca_pem.status();
    auto cas = ReadCertificates("--tls_client_ca", o.tls_client_ca_file, *ca_pem);
    if (!cas.ok()) return cas.status();
    absl::StrAppend(&info.description, "; mTLS: a client certificate is required, from ",
                    Name(X509_get_subject_name((*cas)[0].get())),
                    cas->size() > 1 ? absl::StrCat(" or ", cas->size() - 1, " other CAs") : "");
  } else {
    absl::StrAppend(&info.description, "; no client certificates (--tls_client_ca for mTLS)");
  }
  return info;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerOptions& o) {
  if (!TlsEnabled(o)) return grpc::InsecureServerCredentials();
  const bool mtls = !o.tls_client_ca_file.empty();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.tls_key_file, o.tls_cert_file, o.tls_client_ca_file,
      static_cast<unsigned int>(o.tls_reload_seconds));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (mtls) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

TlsFileWatch::TlsFileWatch(const ServerOptions& o) : options_(o) {
  bool readable;
  last_contents_ = Contents(o, &readable);
  thread_ = std::thread([this] { Run(); });
}

TlsFileWatch::~TlsFileWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TlsFileWatch::Run() {
  const auto period = std::chrono::seconds(options_.tls_reload_seconds);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    bool readable;
    std::string contents = Contents(options_, &readable);
    if (contents != last_contents_) {
      last_contents_ = std::move(contents);
      auto info = ReadTlsFiles(options_);
      if (info.ok()) {
        Log("tls: the TLS files changed: %s; new connections use them within %d s, open ones "
            "keep theirs",
            info->description.c_str(), options_.tls_reload_seconds);
        if (!info->warning.empty()) Log("tls: WARNING: %s", info->warning.c_str());
      } else {
        // gRPC keeps what it last read while a file cannot be read, but takes files it can
        // read whatever they hold, and then fails every new handshake until they are fixed.
        Log("tls: ERROR: the TLS files changed and are not usable: %s. %s",
            std::string(info.status().message()).c_str(),
            readable ? "New TLS handshakes fail until they are fixed (replace the files at "
                       "once: a directory swapped by a rename or symlink, as Kubernetes Secret "
                       "volumes do)"
                     : "New connections get the files last read until then");
      }
    }
    lock.lock();
  }
}

}  // namespace fusebox
