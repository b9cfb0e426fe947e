// TLS and mTLS through the C++ client against a real fusebox-server process (CPU backend,
// free port), with certificates made by openssl at test time: unary and streaming calls
// served; plaintext, another CA, no client certificate or one from another CA refused.
// Reloading, the CLI and the Python client are test_tls.py's.
#include <gtest/gtest.h>

#include "client/cpp/fusebox_client.h"
#include "tests/integration/server_process.h"
#include "tests/test_certs.h"

namespace fusebox {
namespace {

using client::Client;
using client::HostTensor;
using testing::CertFiles;
using testing::ServerProcess;

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    std::string error;
    const std::string& d = dir_.path();
    ASSERT_TRUE(testing::MakeCert(d, "fusebox-test-ca-1", nullptr, &ca1_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(d, "server-1", &ca1_, &server1_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(d, "client-1", &ca1_, &client1_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(d, "fusebox-test-ca-2", nullptr, &ca2_, &error)) << error;
    ASSERT_TRUE(testing::MakeCert(d, "client-2", &ca2_, &client2_, &error)) << error;
  }

  std::vector<std::string> ServerFlags(const CertFiles* client_ca = nullptr) const {
    std::vector<std::string> flags = {"--tls_cert=" + server1_.cert, "--tls_key=" + server1_.key};
    if (client_ca != nullptr) flags.push_back("--tls_client_ca=" + client_ca->cert);
    return flags;
  }

  // A client trusting `ca` (none: plaintext), presenting `cert` (none: no certificate).
  static std::unique_ptr<Client> Connect(const ServerProcess& server, const CertFiles* ca,
                                         const CertFiles* cert = nullptr) {
    Client::Options o;
    if (ca != nullptr) {
      const absl::Status s = client::LoadTlsFiles(ca->cert, cert ? cert->cert : "",
                                                  cert ? cert->key : "", &o.tls);
      EXPECT_TRUE(s.ok()) << s;
    }
    return Client::Create(server.address(), o);
  }

  static void ExpectServed(Client& c) {
    auto h = c.Health();
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(*h, client::HealthStatus::kServing);
    auto r = c.Gelu(HostTensor::FromFloats(DType::kFloat32, {2}, {1.0f, -1.0f}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->output.ToFloats()[0], 0.841192f, 1e-5);
    // A streaming call too, over more than one message.
    const HostTensor t = HostTensor::FromFloats(DType::kFloat32, {3, 1000},
                                                std::vector<float>(3000, 0.5f));
    auto info = c.Upload(t, 4096);
    ASSERT_TRUE(info.ok()) << info.status();
    auto back = c.Download(info->handle);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->data, t.data);
  }

  static void ExpectRefused(Client& c) {
    EXPECT_EQ(c.Health().status().code(), absl::StatusCode::kUnavailable);
  }

  testing::TempDir dir_;
  CertFiles ca1_, server1_, client1_, ca2_, client2_;
};

TEST_F(Tls, ServesAClientTrustingItsCaAndRefusesPlaintextAndOtherCas) {
  ServerProcess server;
  ASSERT_TRUE(server.Start(ServerFlags())) << server.error();
  EXPECT_NE(server.first_line().find("tls=on"), std::string::npos) << server.first_line();
  ExpectServed(*Connect(server, &ca1_));
  ExpectRefused(*Connect(server, nullptr));
  ExpectRefused(*Connect(server, &ca2_));
  // The name checked is the override's, which the certificate does not carry.
  Client::Options o;
  ASSERT_TRUE(client::LoadTlsFiles(ca1_.cert, "", "", &o.tls).ok());
  o.tls.server_name = "not-this-server";
  ExpectRefused(*Client::Create(server.address(), o));
  o.tls.server_name = "localhost";
  ExpectServed(*Client::Create(server.address(), o));
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(Tls, MtlsServesOnlyClientsWithACertificateFromTheClientCa) {
  ServerProcess server;
  ASSERT_TRUE(server.Start(ServerFlags(&ca2_))) << server.error();
  EXPECT_NE(server.first_line().find("tls=mtls"), std::string::npos) << server.first_line();
  ExpectRefused(*Connect(server, &ca1_));             // no certificate
  ExpectRefused(*Connect(server, &ca1_, &client1_));  // signed by another CA
  ExpectRefused(*Connect(server, nullptr));           // plaintext
  ExpectServed(*Connect(server, &ca1_, &client2_));
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(Tls, LoadTlsFilesWantsACertificateWithItsKeyAndNamesAMissingFile) {
  client::TlsOptions tls;
  EXPECT_EQ(client::LoadTlsFiles("", client1_.cert, "", &tls).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::LoadTlsFiles("", "", client1_.key, &tls).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status s = client::LoadTlsFiles(dir_.path() + "/none.pem", "", "", &tls);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find(dir_.path() + "/none.pem"), absl::string_view::npos) << s;
  EXPECT_FALSE(tls.on());
  ASSERT_TRUE(client::LoadTlsFiles("", "", "", &tls).ok());  // TLS with the system's roots
  EXPECT_TRUE(tls.on());
  EXPECT_TRUE(tls.root_certs.empty());
}

}  // namespace
}  // namespace fusebox
