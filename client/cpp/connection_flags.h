// The command-line options that say how to reach a server (--server, --token, --tls and the
// --tls_* files), their $FUSEBOX_* defaults, and how they become Client::Options: one
// definition for every command-line tool (the `fusebox` CLI, fusebox-perf), so that the tools
// take the same flags and mean the same by them.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/fusebox_client.h"

namespace fusebox::client {

struct ConnectionFlags {
  std::string server, token, tls_ca, tls_cert, tls_key, tls_server_name;
  bool tls = false;

  // Defaults from $FUSEBOX_SERVER (else localhost:50051), $FUSEBOX_TOKEN, $FUSEBOX_TLS_CA,
  // $FUSEBOX_TLS_CERT and $FUSEBOX_TLS_KEY.
  static ConnectionFlags FromEnvironment() {
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr ? v : "");
    };
    ConnectionFlags f;
    f.server = env("FUSEBOX_SERVER").empty() ? "localhost:50051" : env("FUSEBOX_SERVER");
    f.token = env("FUSEBOX_TOKEN");
    f.tls_ca = env("FUSEBOX_TLS_CA");
    f.tls_cert = env("FUSEBOX_TLS_CERT");
    f.tls_key = env("FUSEBOX_TLS_KEY");
    return f;
  }

  // Adds the options to app; server_help describes --server (tools differ in what it takes).
  void AddTo(CLI::App* app, const std::string& server_help) {
    app->add_option("--server", server, server_help);
    app->add_option("--token", token, "bearer token for a server with a token file (default: $FUSEBOX_TOKEN)");
    app->add_flag("--tls", tls, "speak TLS, trusting the system's CA certificates (implied by the next three)");
    app->add_option("--tls_ca", tls_ca, "PEM CA certificate(s) to trust for the server's certificate (default: $FUSEBOX_TLS_CA)");
    app->add_option("--tls_cert", tls_cert, "mTLS: PEM client certificate, with --tls_key (default: $FUSEBOX_TLS_CERT)");
    app->add_option("--tls_key", tls_key, "mTLS: its PEM private key (default: $FUSEBOX_TLS_KEY)");
    app->add_option("--tls_server_name", tls_server_name,
                    "the name the server's certificate must carry, when it is not the host in --server");
  }

  // A command-line mistake, for the tool's usage message; empty when there is none.
  std::string Mistake() const {
    if (tls_cert.empty() != tls_key.empty()) {
      return "--tls_cert and --tls_key come together (mTLS), or neither";
    }
    return "";
  }

  // The token, and TLS with the files read when any TLS option is given (LoadTlsFiles' errors).
  absl::Status ApplyTo(Client::Options* options) const {
    options->auth_token = token;
    if (tls || !tls_ca.empty() || !tls_cert.empty() || !tls_server_name.empty()) {
      absl::Status st = LoadTlsFiles(tls_ca, tls_cert, tls_key, &options->tls);
      if (!st.ok()) return st;
      options->tls.server_name = tls_server_name;
    }
    return absl::OkStatus();
  }
};

// CLI11 takes `--opt=` (an empty value) as `--opt` followed by the next word; this rewrites it
// to `--opt ""`, so that an option given empty overrides its variable. Returns the words after
// argv[0] in the order CLI11's parse(std::vector<std::string>&) wants them (last first).
inline std::vector<std::string> WordsForCli11(int argc, char** argv) {
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (w.size() > 3 && w.rfind("--", 0) == 0 && w.find('=') == w.size() - 1) {
      words.push_back(w.substr(0, w.size() - 1));
      words.emplace_back();
    } else {
      words.push_back(std::move(w));
    }
  }
  std::reverse(words.begin(), words.end());
  return words;
}

}  // namespace fusebox::client
