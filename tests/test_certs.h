// Certificates made at test time with the `openssl` command (Debian's openssl package): CAs
// and the certificates they sign, EC P-256, valid for two days; a signed certificate names
// 127.0.0.1 and localhost and serves as a server's or a client's. Nothing is committed, so
// nothing expires in the tree.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fusebox::testing {

// A fresh directory under $TMPDIR (else /tmp), removed with the object.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/fusebox-tls-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }  // empty if it could not be made

 private:
  std::string path_;
};

struct CertFiles {
  std::string cert, key;  // PEM file paths
};

inline std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// dir/name.crt and dir/name.key: a self-signed CA when `ca` is null, else a certificate that
// ca signed. false, with openssl's output in *error, when openssl fails.
inline bool MakeCert(const std::string& dir, const std::string& name, const CertFiles* ca,
                     CertFiles* out, std::string* error) {
  out->cert = dir + "/" + name + ".crt";
  out->key = dir + "/" + name + ".key";
  const std::string log = dir + "/" + name + ".log";
  std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
                    " -days 2 -subj '/CN=" + name + "' -keyout '" + out->key + "' -out '" +
                    out->cert + "'";
  if (ca != nullptr) {
    cmd += " -CA '" + ca->cert + "' -CAkey '" + ca->key + "'" +
           " -addext 'subjectAltName=IP:127.0.0.1,DNS:localhost'"
           " -addext 'basicConstraints=critical,CA:FALSE'"
           " -addext 'extendedKeyUsage=serverAuth,clientAuth'";
  }
  cmd += " > '" + log + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    *error = "openssl failed (is the openssl package installed?): " + cmd + "\n" + ReadText(log);
    return false;
  }
  return true;
}

}  // namespace fusebox::testing
