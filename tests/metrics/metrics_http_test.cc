// Unit tests of the /metrics HTTP server (server/rpc/metrics_http.h): the
// request-head parser as a pure function (cases, every prefix, random bytes),
// then MetricsHttpServer in-process over real loopback sockets: routes and
// status codes, deadlines, the connection cap, Stop, addresses.
#include "server/rpc/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fusebox {
namespace {

using Verdict = HttpRequest::Verdict;
using Clock = std::chrono::steady_clock;
constexpr size_t kMax = 8192;

const char kGet[] = "GET /metrics HTTP/1.1\r\nHost: localhost:9464\r\nAccept: */*\r\n\r\n";

TEST(ParseHttpRequest, ReadsAWholeHead) {
  const HttpRequest r = ParseHttpRequest(kGet, kMax);
  EXPECT_EQ(r.verdict, Verdict::kComplete);
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/metrics");
  EXPECT_EQ(r.head_bytes, sizeof kGet - 1);
}

TEST(ParseHttpRequest, TakesBareLineFeedsAndLeavesTheBody) {
  const std::string req = "POST /metrics?a=1&b HTTP/1.0\nContent-Length: 4\nX-Empty:\n\nbody";
  const HttpRequest r = ParseHttpRequest(req, kMax);
  EXPECT_EQ(r.verdict, Verdict::kComplete);
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/metrics?a=1&b");
  EXPECT_EQ(r.head_bytes, req.size() - 4);
}

TEST(ParseHttpRequest, EveryPrefixOfAValidHeadIsIncomplete) {
  const std::string req = kGet;
  for (size_t n = 0; n < req.size(); ++n) {
    EXPECT_EQ(ParseHttpRequest(std::string_view(req).substr(0, n), kMax).verdict,
              Verdict::kIncomplete)
        << n << ": " << req.substr(0, n);
  }
}

TEST(ParseHttpRequest, RejectsGarbageBeforeItsLineEnds) {
  for (const std::string& bytes : {std::string("\x16\x03\x01\x02\x00", 5),  // a TLS hello
                                  std::string("GE(T"), std::string("GET /a b"),
                                  std::string("GET /metrics HTTP/2"), std::string("GET / http"),
                                  std::string("GET  /"), std::string(" GET"),
                                  std::string("GET /\x7f"), std::string("GET /metrics HTTP/1.12")}) {
    EXPECT_EQ(ParseHttpRequest(bytes, kMax).verdict, Verdict::kBad) << bytes;
  }
}

TEST(ParseHttpRequest, RejectsMalformedHeads) {
  for (const char* bytes : {
           "\r\n\r\n",                                  // no request line
           "GET\r\n\r\n",                               // no target
           "GET /metrics\r\n\r\n",                      // HTTP/0.9
           "GET /metrics HTTP/1.1 \r\n\r\n",            // trailing space
           "GET /metrics HTTP/1.2\r\n\r\n",             // no such version
           "GET /metrics HTTP/1.1\rX\r\n\r\n",          // a CR inside the line
           "GET /metrics HTTP/1.1\r\nNoColon\r\n\r\n",  // not a field
           "GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n",
           "GET /metrics HTTP/1.1\r\nName : v\r\n\r\n",
           "GET /metrics HTTP/1.1\r\n: v\r\n\r\n",
           "GET /metrics HTTP/1.1\r\nX: a\x01z\r\n\r\n",
       }) {
    EXPECT_EQ(ParseHttpRequest(bytes, kMax).verdict, Verdict::kBad) << bytes;
  }
  const std::string nul("GET /met\0rics HTTP/1.1\r\n\r\n", 26);
  EXPECT_EQ(ParseHttpRequest(nul, kMax).verdict, Verdict::kBad);
}

TEST(ParseHttpRequest, BoundsTheHead) {
  const std::string start = "GET /metrics HTTP/1.1\r\nX: ";
  // A head of exactly the limit is whole; one byte more is too large, whatever follows.
  std::string exact = start + std::string(kMax - start.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(exact.size(), kMax);
  EXPECT_EQ(ParseHttpRequest(exact, kMax).verdict, Verdict::kComplete);
  std::string over = start + std::string(kMax - start.size() - 3, 'a') + "\r\n\r\n";
  EXPECT_EQ(ParseHttpRequest(over, kMax).verdict, Verdict::kTooLarge);
  const std::string endless = start + std::string(64 << 10, 'a');
  EXPECT_EQ(ParseHttpRequest(endless.substr(0, kMax - 1), kMax).verdict, Verdict::kIncomplete);
  EXPECT_EQ(ParseHttpRequest(endless.substr(0, kMax), kMax).verdict, Verdict::kTooLarge);
  EXPECT_EQ(ParseHttpRequest(endless, kMax).verdict, Verdict::kTooLarge);
  EXPECT_EQ(ParseHttpRequest(endless + "\x01\r\n\r\n", kMax).verdict, Verdict::kTooLarge);
}

// Random bytes, drawn mostly from what a request is made of: no crash, a whole head ends in
// its LF, and a verdict other than kIncomplete never changes as more bytes arrive.
TEST(ParseHttpRequest, RandomBytesGetAFinalVerdict) {
  std::mt19937 rng(20221);
  const std::string pieces[] = {"GET", "HEAD", " ", "/metrics", "HTTP/1.1", "HTTP/1.0", "\r\n",
                                "\n", "\r", ":", "Host", "x", "\t", "\x80", "\x00", "\x7f"};
  int complete = 0, bad = 0;
  for (int round = 0; round < 3000; ++round) {
    // Half the rounds start with a good request line, so that some heads are whole.
    std::string bytes = round % 2 ? "GET /metrics HTTP/1.1\r\n" : "";
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < n; ++i) {
      if (rng() % 8 == 0) {
        bytes += static_cast<char>(rng());
      } else {
        const std::string& p = pieces[rng() % (sizeof pieces / sizeof pieces[0])];
        bytes += p.empty() ? std::string(1, '\0') : p;
      }
    }
    const size_t max = 16 + rng() % 200;
    HttpRequest first;
    size_t decided_at = 0;
    for (size_t len = 0; len <= bytes.size(); ++len) {
      const HttpRequest r = ParseHttpRequest(std::string_view(bytes).substr(0, len), max);
      if (first.verdict == Verdict::kIncomplete) {
        first = r;
        decided_at = len;
        continue;
      }
      ASSERT_EQ(r.verdict, first.verdict) << "decided at " << decided_at << ", changed at " << len;
      ASSERT_EQ(r.head_bytes, first.head_bytes);
    }
    if (first.verdict == Verdict::kComplete) {
      ++complete;
      ASSERT_LE(first.head_bytes, std::min(bytes.size(), max));
      ASSERT_EQ(bytes[first.head_bytes - 1], '\n');
    }
    bad += first.verdict == Verdict::kBad;
  }
  EXPECT_GT(complete, 0);
  EXPECT_GT(bad, 0);
}

// --- The server, over loopback sockets ---------------------------------------------------

class UpGauge final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily f;
    f.name = "test_up";
    f.help = "Always 1.";
    f.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric m;
    m.gauge.value = 1;
    f.metric.push_back(m);
    return {f};
  }
};

std::unique_ptr<MetricsHttpServer> StartServer(const std::string& address = "127.0.0.1:0",
                                               MetricsHttpOptions options = {}) {
  auto s = MetricsHttpServer::Start(address, {std::make_shared<UpGauge>()}, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// A connected socket (5 s receive timeout), or -1.
int Connect(int port, int family = AF_INET) {
  const int fd = socket(family, SOCK_STREAM, 0);
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    len = sizeof *a;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes (or 5 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string Exchange(int port, const std::string& request, int family = AF_INET) {
  const int fd = Connect(port, family);
  if (fd < 0) return "";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer and stop reading early
    sent += static_cast<size_t>(n);
  }
  std::string reply = ReadAll(fd);
  close(fd);
  return reply;
}

int StatusOf(const std::string& reply) {
  return reply.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(reply.c_str() + 9) : 0;
}
std::string BodyOf(const std::string& reply) {
  const size_t end = reply.find("\r\n\r\n");
  return end == std::string::npos ? "" : reply.substr(end + 4);
}

// True when the server has closed `fd` (EOF) within `ms`.
bool ClosedWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(MetricsHttpServer, ServesMetricsToGetAndHead) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  ASSERT_GT(server->port(), 0);
  const std::string get = Exchange(server->port(), kGet);
  EXPECT_EQ(StatusOf(get), 200) << get;
  EXPECT_NE(get.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos);
  const std::string body = BodyOf(get);
  EXPECT_NE(body.find("\ntest_up 1\n"), std::string::npos) << body;
  const std::string length = "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  EXPECT_NE(get.find(length), std::string::npos);
  EXPECT_NE(get.find("\r\nConnection: close\r\n"), std::string::npos);

  const std::string head = Exchange(server->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusOf(head), 200) << head;
  EXPECT_NE(head.find(length), std::string::npos);
  EXPECT_EQ(BodyOf(head), "");
  EXPECT_EQ(StatusOf(Exchange(server->port(), "GET /metrics?x=1 HTTP/1.1\r\n\r\n")), 200);
}

TEST(MetricsHttpServer, AnswersEveryOtherRequestWithAnError) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const struct {
    std::string request;
    int status;
  } cases[] = {
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET /metricsx HTTP/1.1\r\n\r\n", 404},
      {"HEAD /x HTTP/1.1\r\n\r\n", 404},
      {"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 405},
      {"DELETE /metrics HTTP/1.1\r\n\r\n", 405},
      {"get /metrics HTTP/1.1\r\n\r\n", 405},  // methods are case-sensitive
      {"garbage\r\n\r\n", 400},
      {std::string("\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 11), 400},
      {"GET /metrics HTTP/1.1\r\nX: " + std::string(64 << 10, 'a') + "\r\n\r\n", 431},
  };
  for (const auto& c : cases) {
    const std::string reply = Exchange(server->port(), c.request);
    EXPECT_EQ(StatusOf(reply), c.status) << c.request.substr(0, 40) << "\n" << reply;
    if (c.status == 405) {
      EXPECT_NE(reply.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << reply;
    }
    if (c.request.rfind("HEAD", 0) == 0) {
      EXPECT_EQ(BodyOf(reply), "");
    }
  }
  EXPECT_EQ(StatusOf(Exchange(server->port(), kGet)), 200);
}

TEST(MetricsHttpServer, ServesARequestSentOneByteAtATime) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (const char* p = kGet; *p != '\0'; ++p) {
    ASSERT_EQ(send(fd, p, 1, MSG_NOSIGNAL), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::string reply = ReadAll(fd);
  close(fd);
  EXPECT_EQ(StatusOf(reply), 200) << reply;
}

TEST(MetricsHttpServer, SlowHeadsGet408AndSilentConnectionsAreClosed) {
  MetricsHttpOptions o;
  o.head_timeout = std::chrono::milliseconds(300);
  auto server = StartServer("127.0.0.1:0", o);
  ASSERT_TRUE(server);
  const int slow = Connect(server->port()), silent = Connect(server->port());
  ASSERT_GE(slow, 0);
  ASSERT_GE(silent, 0);
  ASSERT_EQ(send(slow, "GET /metr", 9, MSG_NOSIGNAL), 9);
  const auto t0 = Clock::now();
  EXPECT_EQ(StatusOf(ReadAll(slow)), 408);
  EXPECT_EQ(ReadAll(silent), "");
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(200));
  EXPECT_LT(took, std::chrono::seconds(3));
  close(slow);
  close(silent);
}

TEST(MetricsHttpServer, AtTheCapTheOldestIdleConnectionMakesRoom) {
  MetricsHttpOptions o;
  o.max_connections = 4;
  auto server = StartServer("127.0.0.1:0", o);
  ASSERT_TRUE(server);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(Connect(server->port()));
    ASSERT_GE(idle.back(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // accepted in this order
  }
  EXPECT_EQ(StatusOf(Exchange(server->port(), kGet)), 200);
  EXPECT_TRUE(ClosedWithin(idle[0], 1000));
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(ClosedWithin(idle[i], 50)) << i;
  for (int fd : idle) close(fd);
}

TEST(MetricsHttpServer, HundredsOfIdleConnectionsDoNotDelayAScrape) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = Connect(server->port());
    ASSERT_GE(fd, 0) << i;
    if (i % 3 == 0) {  // and some half-sent
      ASSERT_EQ(send(fd, "GET /metr", 9, MSG_NOSIGNAL), 9);
    }
    idle.push_back(fd);
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(StatusOf(Exchange(server->port(), kGet)), 200);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  for (int fd : idle) close(fd);
}

TEST(MetricsHttpServer, StopClosesEveryConnectionAndTheListener) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(Connect(port));
  const int half = Connect(port);
  ASSERT_EQ(send(half, "GET /", 5, MSG_NOSIGNAL), 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = Clock::now();
  server->Stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
  for (int fd : idle) EXPECT_TRUE(ClosedWithin(fd, 1000));
  EXPECT_TRUE(ClosedWithin(half, 1000));
  EXPECT_EQ(Connect(port), -1);  // refused: nobody listens
  server->Stop();                // again: nothing to do
  EXPECT_EQ(server->port(), port);
  server.reset();
  for (int fd : idle) close(fd);
  close(half);
}

TEST(MetricsHttpServer, ListensOnIPv6AndTheWildcard) {
  auto any = StartServer("0.0.0.0:0");
  ASSERT_TRUE(any);
  EXPECT_EQ(StatusOf(Exchange(any->port(), kGet)), 200);
  auto bare = StartServer("0");  // a bare port, as civetweb took it: 0.0.0.0
  ASSERT_TRUE(bare);
  EXPECT_EQ(StatusOf(Exchange(bare->port(), kGet)), 200);

  auto v6 = MetricsHttpServer::Start("[::1]:0", {std::make_shared<UpGauge>()});
  if (!v6.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << v6.status();
  EXPECT_GT((*v6)->port(), 0);
  EXPECT_EQ(StatusOf(Exchange((*v6)->port(), kGet, AF_INET6)), 200);
}

TEST(MetricsHttpServer, BadAddressesAndABusyPortAreErrors) {
  for (const char* address : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:x",
                              "::1:9464", "[::1]9464", "[::1", ""}) {
    auto s = MetricsHttpServer::Start(address, {});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
  auto first = StartServer();
  ASSERT_TRUE(first);
  auto second = MetricsHttpServer::Start("127.0.0.1:" + std::to_string(first->port()), {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_EQ(StatusOf(Exchange(first->port(), kGet)), 200);
}

// Random bytes at the socket: every connection ends (an answer or a close) and the server
// still serves.
TEST(MetricsHttpServer, SurvivesRandomBytes) {
  MetricsHttpOptions o;
  o.head_timeout = std::chrono::milliseconds(100);
  o.linger_timeout = std::chrono::milliseconds(100);
  auto server = StartServer("127.0.0.1:0", o);
  ASSERT_TRUE(server);
  std::mt19937 rng(7);
  for (int i = 0; i < 60; ++i) {
    std::string bytes(std::uniform_int_distribution<size_t>(1, 20000)(rng), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (i % 2) bytes.replace(0, 4, "GET ");
    const std::string reply = Exchange(server->port(), bytes);
    const int status = StatusOf(reply);
    EXPECT_TRUE(reply.empty() || status == 400 || status == 408 || status == 431) << reply;
  }
  EXPECT_EQ(StatusOf(Exchange(server->port(), kGet)), 200);
}

}  // namespace
}  // namespace fusebox
