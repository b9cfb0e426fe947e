// TLS on the server: CheckOptions' rules for the TLS flags, ReadTlsFiles' check of the files'
// contents (what would otherwise start a server whose every handshake fails), and a server
// in-process serving TLS to the C++ client and refusing plaintext. Certificates come from
// openssl at test time (tests/test_certs.h). The real binary, mTLS and reloading are
// tests/integration/test_tls.py's.
#include <gtest/gtest.h>

#include <fstream>

#include "client/cpp/fusebox_client.h"
#include "server/options.h"
#include "server/server.h"
#include "server/tls.h"
#include "tests/test_certs.h"

namespace fusebox {
namespace {

using testing::CertFiles;
using testing::TempDir;

class TlsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    std::string error;
    ASSERT_TRUE(testing::MakeCert(dir_.path(), "fusebox-test-ca", nullptr, &ca_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(dir_.path(), "localhost", &ca_, &server_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(dir_.path(), "other", &ca_, &other_, &error)) << error;
  }
  ServerOptions Tls() const {
    ServerOptions o;
    o.tls_cert_file = server_.cert;
    o.tls_key_file = server_.key;
    return o;
  }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  static std::string Message(const absl::Status& s) { return std::string(s.message()); }

  TempDir dir_;
  CertFiles ca_, server_, other_;
};

TEST_F(TlsFiles, CertAndKeyComeTogether) {
  ServerOptions o = Tls();
  o.tls_key_file.clear();
  EXPECT_EQ(CheckOptions(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Message(CheckOptions(o)).find("--tls_cert and --tls_key come together"),
            std::string::npos);
  o = Tls();
  o.tls_cert_file.clear();
  EXPECT_EQ(CheckOptions(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckOptions(Tls()).ok()) << CheckOptions(Tls());
}

TEST_F(TlsFiles, ClientCaNeedsTls) {
  ServerOptions o;
  o.tls_client_ca_file = ca_.cert;
  const absl::Status s = CheckOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Message(s).find("--tls_client_ca (mTLS) needs --tls_cert"), std::string::npos) << s;
  o = Tls();
  o.tls_client_ca_file = ca_.cert;
  EXPECT_TRUE(CheckOptions(o).ok()) << CheckOptions(o);
}

TEST_F(TlsFiles, ReloadIntervalIsOneSecondToADay) {
  for (int s : {0, -1, 86401}) {
    ServerOptions o = Tls();
    o.tls_reload_seconds = s;
    EXPECT_NE(Message(CheckOptions(o)).find("--tls_reload_s must be in 1..86400"),
              std::string::npos)
        << s;
  }
  ServerOptions o = Tls();
  o.tls_reload_seconds = 1;
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST_F(TlsFiles, UnreadableFilesAreRefusedNamingFlagAndReason) {
  struct Case {
    std::string path, want;
  } cases[] = {{dir_.path() + "/missing.pem", "No such file or directory"},
               {Write("empty.pem", ""), "empty"},
               {dir_.path(), "Is a directory"}};
  for (const Case& c : cases) {
    ServerOptions o = Tls();
    o.tls_key_file = c.path;
    const absl::Status s = CheckOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.path;
    EXPECT_NE(Message(s).find("--tls_key=" + c.path + ": " + c.want), std::string::npos) << s;
    o = Tls();
    o.tls_client_ca_file = c.path;
    EXPECT_NE(Message(CheckOptions(o)).find("--tls_client_ca=" + c.path), std::string::npos);
  }
}

TEST_F(TlsFiles, AGoodPairIsDescribed) {
  auto info = ReadTlsFiles(Tls());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(info->description.find("certificate CN=localhost from CN=fusebox-test-ca"),
            std::string::npos)
      << info->description;
  EXPECT_NE(info->description.find("no client certificates"), std::string::npos);
  EXPECT_TRUE(info->warning.empty()) << info->warning;

  ServerOptions o = Tls();
  o.tls_client_ca_file = ca_.cert;
  info = ReadTlsFiles(o);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(info->description.find("mTLS: a client certificate is required, from "
                                   "CN=fusebox-test-ca"),
            std::string::npos)
      << info->description;
}

TEST_F(TlsFiles, AKeyOfAnotherCertificateIsRefused) {
  ServerOptions o = Tls();
  o.tls_key_file = other_.key;
  auto info = ReadTlsFiles(o);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Message(info.status()).find("--tls_key=" + other_.key + ": does not match the "
                                        "certificate in " + server_.cert + " (CN=localhost)"),
            std::string::npos)
      << info.status();
}

TEST_F(TlsFiles, WhatIsNotPemIsRefused) {
  const std::string junk = Write("junk.pem", "not a certificate\n");
  ServerOptions o = Tls();
  o.tls_cert_file = junk;
  EXPECT_NE(
      Message(ReadTlsFiles(o).status()).find("--tls_cert=" + junk + ": not a PEM certificate"),
      std::string::npos)
      << ReadTlsFiles(o).status();
  o = Tls();
  o.tls_key_file = junk;
  EXPECT_NE(
      Message(ReadTlsFiles(o).status()).find("--tls_key=" + junk + ": not a PEM private key"),
      std::string::npos)
      << ReadTlsFiles(o).status();
  o = Tls();
  o.tls_client_ca_file = junk;
  EXPECT_NE(Message(ReadTlsFiles(o).status())
                .find("--tls_client_ca=" + junk + ": not a PEM certificate"),
            std::string::npos)
      << ReadTlsFiles(o).status();
  // A key where the certificate belongs has no CERTIFICATE block.
  o = Tls();
  o.tls_cert_file = server_.key;
  EXPECT_EQ(ReadTlsFiles(o).status().code(), absl::StatusCode::kInvalidArgument);
  // A certificate cut short.
  const std::string cert = testing::ReadText(server_.cert);
  o = Tls();
  o.tls_cert_file = Write("cut.pem", cert.substr(0, cert.size() / 2));
  EXPECT_EQ(ReadTlsFiles(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TlsFiles, AnEncryptedKeyIsRefusedWithoutAPrompt) {
  const std::string encrypted = dir_.path() + "/encrypted.key";
  const std::string cmd = "openssl pkey -in '" + server_.key +
                          "' -aes256 -passout pass:secret -out '" + encrypted + "' 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ServerOptions o = Tls();
  o.tls_key_file = encrypted;
  const absl::Status s = ReadTlsFiles(o).status();
  EXPECT_NE(Message(s).find("an encrypted key (gRPC takes no passphrase"), std::string::npos) << s;
}

TEST_F(TlsFiles, AServerInProcessSpeaksTlsAndRefusesPlaintext) {
  ServerOptions o = Tls();
  o.address = "127.0.0.1:0";
  o.backend.kind = "cpu";
  auto server = FuseboxServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());

  client::Client::Options tls;
  ASSERT_TRUE(client::LoadTlsFiles(ca_.cert, "", "", &tls.tls).ok());
  auto c = client::Client::Create(target, tls);
  auto h = c->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, client::HealthStatus::kServing);
  auto r = c->Gelu(client::HostTensor::FromFloats(DType::kFloat32, {2}, {1.0f, -1.0f}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->output.ToFloats()[0], 0.841192f, 1e-5);

  auto plain = client::Client::Create(target);
  EXPECT_EQ(plain->Health().status().code(), absl::StatusCode::kUnavailable);
  (*server)->Shutdown(0);
}

TEST_F(TlsFiles, AServerWithABadPairDoesNotStart) {
  ServerOptions o = Tls();
  o.address = "127.0.0.1:0";
  o.backend.kind = "cpu";
  o.tls_key_file = other_.key;
  EXPECT_EQ(FuseboxServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusebox
