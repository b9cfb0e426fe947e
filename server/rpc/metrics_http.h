// MetricsHttpServer: the small HTTP/1.1 server that serves Prometheus' /metrics
// (GET and HEAD) from prometheus-cpp Collectables, written with the core
// library's TextSerializer. One thread runs an epoll loop over non-blocking
// sockets, so idle or slow clients cost a file descriptor each and never hold
// up a scrape; every connection has a deadline and their number a cap. Every
// reply closes its connection. ParseHttpRequest, the request-head parser, is a
// pure function of the bytes received so far (unit-tested and fuzz-friendly).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
}

namespace fusebox {

// What the bytes received so far on a connection amount to.
struct HttpRequest {
  enum class Verdict {
    kIncomplete,  // a valid beginning of a request head: wait for more bytes
    kComplete,    // request line and header fields are whole (method, target, head_bytes set)
    kBad,         // not HTTP/1.0 or 1.1: answer 400
    kTooLarge,    // the head is longer than allowed: answer 431
  };
  Verdict verdict = Verdict::kIncomplete;
  std::string method;  // e.g. "GET"; methods are case-sensitive
  std::string target;  // as sent, query included, e.g. "/metrics?x=1"
  size_t head_bytes = 0;  // request line + fields + the empty line, when kComplete
};

// Parses an HTTP/1.x request head (RFC 9112): request line, header fields, an
// empty line; lines end in CRLF or a bare LF. Each line is checked as its bytes
// arrive, so garbage is rejected before its line ends; only the first
// max_head_bytes are looked at. A verdict other than kIncomplete is final: more
// bytes never change it. A body, if any, is not parsed. `bytes` may hold anything.
HttpRequest ParseHttpRequest(std::string_view bytes, size_t max_head_bytes);

struct MetricsHttpOptions {
  size_t max_head_bytes = 8192;  // request line + header fields; past it: 431
  int max_connections = 256;     // past it the oldest connection not being answered is closed
  // From accept to the end of the request head (then 408, or a silent close when nothing came).
  std::chrono::milliseconds head_timeout{5000};
  std::chrono::milliseconds write_timeout{10000};  // to send a reply
  // After a reply, unread request bytes are drained this long before the close, so that
  // the kernel does not answer them with a reset that could destroy the reply in flight.
  std::chrono::milliseconds linger_timeout{2000};
};

class MetricsHttpServer {
 public:
  // Listens on `address`: HOST:PORT ([V6]:PORT for IPv6; an empty HOST or a bare PORT is
  // 0.0.0.0; PORT 0 picks a free one). The collectables are collected on each scrape, from
  // the server's thread, in order; the server keeps them alive.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<const prometheus::Collectable>> collectables,
      const MetricsHttpOptions& options = MetricsHttpOptions());
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Closes the listener and every connection, joins the thread. Idempotent.
  void Stop();
  int port() const;  // the bound port (the chosen one when the address said 0)

 private:
  class Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
