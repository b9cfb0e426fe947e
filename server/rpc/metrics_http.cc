// The HTTP server behind /metrics (server/rpc/metrics_http.h). It replaces
// prometheus-cpp's Exposer, whose civetweb ran its workers on small stacks: an
// error page for any path but /metrics overflowed one and killed the process,
// and a static-TLS library (cuBLASLt, ~94 KB) loaded at start-up left those
// stacks no room at all. Here one thread with the default (full-size) stack
// serves every connection from an epoll loop:
//  - sockets are non-blocking, so an idle or slow client holds a descriptor
//    and a few KiB, never the thread; a scrape is answered while hundreds wait;
//  - a connection must deliver its request head within head_timeout (then 408)
//    and take its reply within write_timeout; at max_connections the oldest
//    connection not being answered is closed to admit the new one;
//  - each reply ends its connection (Connection: close), after the client's
//    unread bytes are drained for up to linger_timeout;
//  - the request head is parsed by ParseHttpRequest, a pure function, from
//    scratch on each read: it looks at max_head_bytes (8 KiB) at most, so that
//    costs microseconds.
#include "server/rpc/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox {

// ---------------------------------------------------------------------------
// The request head.

namespace {

bool IsTchar(unsigned char c) {  // RFC 9110 token characters: methods and field names
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}
bool IsTargetChar(unsigned char c) { return c > 0x20 && c < 0x7f; }  // visible ASCII
bool IsValueChar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

template <typename Pred>
bool All(std::string_view s, Pred p) {
  return std::all_of(s.begin(), s.end(), [&](char c) { return p(static_cast<unsigned char>(c)); });
}

// "METHOD SP TARGET SP HTTP/1.x", or while !whole any beginning of one.
bool RequestLineOk(std::string_view line, bool whole, HttpRequest* r) {
  const size_t sp1 = line.find(' ');
  const std::string_view method = line.substr(0, sp1);
  if (!All(method, IsTchar)) return false;
  if (sp1 == std::string_view::npos) return !whole;
  if (method.empty()) return false;
  const size_t sp2 = line.find(' ', sp1 + 1);
  const std::string_view target =
      line.substr(sp1 + 1, sp2 == std::string_view::npos ? sp2 : sp2 - sp1 - 1);
  if (!All(target, IsTargetChar)) return false;
  if (sp2 == std::string_view::npos) return !whole;
  if (target.empty()) return false;
  const std::string_view version = line.substr(sp2 + 1);
  constexpr std::string_view kHttp1 = "HTTP/1.";
  const size_t common = std::min(version.size(), kHttp1.size());
  if (version.substr(0, common) != kHttp1.substr(0, common)) return false;
  if (version.size() > kHttp1.size() + 1) return false;
  const bool full = version.size() == kHttp1.size() + 1;
  if (full && version.back() != '0' && version.back() != '1') return false;
  if (whole && !full) return false;
  r->method = std::string(method);
  r->target = std::string(target);
  return true;
}

// "Name: value", or while !whole any beginning of one. A line that starts with
// whitespace (obsolete line folding) fails: a space is no token character.
bool FieldLineOk(std::string_view line, bool whole) {
  const size_t colon = line.find(':');
  if (!All(line.substr(0, colon), IsTchar)) return false;
  if (colon == std::string_view::npos) return !whole;
  return colon > 0 && All(line.substr(colon + 1), IsValueChar);
}

}  // namespace

HttpRequest ParseHttpRequest(std::string_view bytes, size_t max_head_bytes) {
  // Only the first max_head_bytes count: a head that has not ended by then is too large,
  // the scan costs at most that much, and a verdict once given stays as more bytes arrive.
  const std::string_view head = bytes.substr(0, max_head_bytes);
  HttpRequest r;
  for (size_t pos = 0, line_no = 0;; ++line_no) {
    const size_t eol = head.find('\n', pos);
    const bool whole = eol != std::string_view::npos;
    std::string_view line = head.substr(pos, whole ? eol - pos : std::string_view::npos);
    // A CR ends a line only right before its LF (or, the LF still to come, at the end).
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (whole && line.empty() && line_no > 0) {
      r.head_bytes = eol + 1;
      r.verdict = HttpRequest::Verdict::kComplete;
      return r;
    }
    if (!(line_no == 0 ? RequestLineOk(line, whole, &r) : FieldLineOk(line, whole))) {
      return HttpRequest{HttpRequest::Verdict::kBad, "", "", 0};
    }
    if (!whole) break;
    pos = eol + 1;
  }
  r.verdict = bytes.size() >= max_head_bytes ? HttpRequest::Verdict::kTooLarge
                                             : HttpRequest::Verdict::kIncomplete;
  return r;
}

// ---------------------------------------------------------------------------
// The server.

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kListenerId = 0, kWakeId = 1;  // epoll ids; connections count from 2
constexpr size_t kMaxDrainBytes = 1 << 20;        // a client that keeps sending is cut off
constexpr int kMaxAcceptsPerWake = 64;            // then the other connections get a turn
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr const char* kMetricsType = "text/plain; version=0.0.4; charset=utf-8";

std::string ErrnoText(int e) {
  char buf[128];
  return strerror_r(e, buf, sizeof buf);  // the GNU one: returns the text
}

// HOST:PORT, [V6]:PORT, :PORT or PORT into host (empty: 0.0.0.0) and port (0..65535).
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  size_t colon;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return false;
    }
    *host = address.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    *host = colon == std::string::npos ? "" : address.substr(0, colon);
    if (host->find(':') != std::string::npos) return false;  // IPv6 needs its brackets
  }
  *port = colon == std::string::npos ? address : address.substr(colon + 1);
  if (host->empty()) *host = "0.0.0.0";
  return !port->empty() && port->size() <= 5 &&
         port->find_first_not_of("0123456789") == std::string::npos && std::stoi(*port) <= 65535;
}

// (absl::string_view: Debian's abseil has its own, which StrCat takes.)
std::string Response(int code, const char* reason, absl::string_view body, bool head_only,
                     absl::string_view extra_headers = {},
                     absl::string_view content_type = "text/plain; charset=utf-8") {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ",
                                 content_type, "\r\nContent-Length: ", body.size(),
                                 "\r\nConnection: close\r\n", extra_headers, "\r\n");
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

}  // namespace

class MetricsHttpServer::Impl {
 public:
  Impl(std::vector<std::shared_ptr<const prometheus::Collectable>> collectables,
       const MetricsHttpOptions& options)
      : collectables_(std::move(collectables)), options_(options) {}

  ~Impl() {
    Stop();
    for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
      if (fd >= 0) close(fd);
    }
  }

  absl::Status Listen(const std::string& address) {
    std::string host, port;
    if (!SplitHostPort(address, &host, &port)) {
      return absl::InvalidArgumentError(absl::StrCat(
          address, ": not HOST:PORT ([V6]:PORT for IPv6; port 0..65535, 0 picks a free one)"));
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(absl::StrCat(address, ": ", gai_strerror(rc)));
    }
    int error = 0;
    for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            a->ai_protocol);
      if (fd < 0) {
        error = errno;
        continue;
      }
      const int one = 1;  // a restarted server may bind while the old connections linger
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        error = errno;
        close(fd);
        continue;
      }
      listen_fd_ = fd;
    }
    freeaddrinfo(found);
    if (listen_fd_ < 0) return absl::UnavailableError(absl::StrCat(address, ": ", ErrnoText(error)));

    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6
                      ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                      : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0 || !Watch(listen_fd_, kListenerId, EPOLLIN, EPOLL_CTL_ADD) ||
        !Watch(wake_fd_, kWakeId, EPOLLIN, EPOLL_CTL_ADD)) {
      return absl::UnavailableError(absl::StrCat(address, ": epoll: ", ErrnoText(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status StartThread() {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {
      return absl::UnavailableError(absl::StrCat("metrics HTTP thread: ", e.what()));
    }
    return absl::OkStatus();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) != sizeof one) {
      // Cannot fail: the counter is far from its limit. Were it to, join would hang.
      std::terminate();
    }
    thread_.join();
  }

  int port() const { return port_; }

 private:
  enum class State { kReading, kWriting, kDraining };
  struct Conn {
    int fd = -1;
    State state = State::kReading;
    std::string in;   // the request head so far
    std::string out;  // the reply, sent up to `sent`
    size_t sent = 0;
    size_t drained = 0;
    Clock::time_point deadline;
  };
  using ConnIt = std::map<uint64_t, Conn>::iterator;

  bool Watch(int fd, uint64_t id, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    return epoll_ctl(epoll_fd_, op, fd, &ev) == 0;
  }

  void Run() {
    epoll_event events[64];
    for (;;) {
      const int n = epoll_wait(epoll_fd_, events, 64, NextTimeoutMs());
      if (n < 0 && errno != EINTR) break;  // cannot happen with valid arguments
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kWakeId) {
          CloseAll();
          return;
        }
        if (id == kListenerId) {
          AcceptSome();
        } else if (auto it = conns_.find(id); it != conns_.end()) {
          OnReady(it);
        }
      }
      Expire();
    }
    CloseAll();
  }

  void CloseAll() {
    for (auto& [id, c] : conns_) close(c.fd);
    conns_.clear();
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
  }

  void Close(ConnIt it) {
    close(it->second.fd);  // also leaves the epoll set: the descriptor has no duplicates
    conns_.erase(it);
  }

  void AcceptSome() {
    for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors or memory: the listener stays readable, so stop watching it
        // for a moment instead of spinning on it.
        Watch(listen_fd_, kListenerId, 0, EPOLL_CTL_MOD);
        accept_resume_ = Clock::now() + kAcceptPause;
        accept_paused_ = true;
        return;
      }
      if (conns_.size() >= static_cast<size_t>(std::max(1, options_.max_connections))) {
        EvictOne();
      }
      const uint64_t id = next_id_++;
      Conn& c = conns_[id];
      c.fd = fd;
      c.deadline = Clock::now() + options_.head_timeout;
      if (!Watch(fd, id, EPOLLIN, EPOLL_CTL_ADD)) Close(conns_.find(id));
    }
  }

  // The oldest connection not being answered (idle, slow, or lingering after its reply)
  // makes room for a new one; one being answered goes only when all are.
  void EvictOne() {
    auto victim = conns_.begin();  // ids grow with accept order: the oldest first
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (it->second.state != State::kWriting) {
        victim = it;
        break;
      }
    }
    Close(victim);
  }

  void OnReady(ConnIt it) {
    switch (it->second.state) {
      case State::kReading: return Read(it);
      case State::kWriting: return Write(it);
      case State::kDraining: return Drain(it);
    }
  }

  void Read(ConnIt it) {
    Conn& c = it->second;
    char buf[4096];
    bool eof = false;
    while (c.in.size() <= options_.max_head_bytes) {  // past it, the parser has its verdict
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        eof = true;
        break;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else if (errno != EINTR) {
        return Close(it);
      }
    }
    const HttpRequest request = ParseHttpRequest(c.in, options_.max_head_bytes);
    if (request.verdict != HttpRequest::Verdict::kIncomplete) return Reply(it, Respond(request));
    if (eof) Close(it);  // the client gave up before the head was whole
  }

  void Reply(ConnIt it, std::string response) {
    Conn& c = it->second;
    std::string().swap(c.in);
    c.out = std::move(response);
    c.sent = 0;
    c.state = State::kWriting;
    c.deadline = Clock::now() + options_.write_timeout;
    if (!Watch(c.fd, it->first, EPOLLOUT, EPOLL_CTL_MOD)) return Close(it);
    Write(it);
  }

  void Write(ConnIt it) {
    Conn& c = it->second;
    while (c.sent < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;  // EPOLLOUT brings the rest
      } else if (!(n < 0 && errno == EINTR)) {
        return Close(it);
      }
    }
    // All sent: FIN, then read what the client still sends until it closes, so that the
    // close does not reset the connection under a reply the client has not read yet.
    std::string().swap(c.out);
    shutdown(c.fd, SHUT_WR);
    c.state = State::kDraining;
    c.deadline = Clock::now() + options_.linger_timeout;
    if (!Watch(c.fd, it->first, EPOLLIN, EPOLL_CTL_MOD)) return Close(it);
    Drain(it);
  }

  void Drain(ConnIt it) {
    Conn& c = it->second;
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.drained += static_cast<size_t>(n);
        if (c.drained > kMaxDrainBytes) return Close(it);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else if (!(n < 0 && errno == EINTR)) {
        return Close(it);  // the client closed (or failed): done
      }
    }
  }

  // Deadlines, and the listener back after a pause.
  void Expire() {
    const auto now = Clock::now();
    if (accept_paused_ && now >= accept_resume_) {
      accept_paused_ = false;
      Watch(listen_fd_, kListenerId, EPOLLIN, EPOLL_CTL_MOD);
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      const auto next = std::next(it);  // stays valid when `it` is closed
      if (now >= it->second.deadline) {
        if (it->second.state == State::kReading && !it->second.in.empty()) {
          Reply(it, Response(408, "Request Timeout", "the request head came too slowly\n", false));
        } else {
          Close(it);
        }
      }
      it = next;
    }
  }

  int NextTimeoutMs() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, c] : conns_) next = std::min(next, c.deadline);
    if (accept_paused_) next = std::min(next, accept_resume_);
    if (next == Clock::time_point::max()) return -1;
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 60000));
  }

  std::string Respond(const HttpRequest& r) const {
    if (r.verdict == HttpRequest::Verdict::kBad) {
      return Response(400, "Bad Request", "malformed HTTP/1.1 request\n", false);
    }
    if (r.verdict == HttpRequest::Verdict::kTooLarge) {
      return Response(431, "Request Header Fields Too Large",
                      absl::StrCat("the request head is over ", options_.max_head_bytes,
                                   " bytes\n"),
                      false);
    }
    const bool head = r.method == "HEAD";
    if (std::string_view(r.target).substr(0, r.target.find('?')) != "/metrics") {
      return Response(404, "Not Found", "not found: metrics are at /metrics\n", head);
    }
    if (!head && r.method != "GET") {
      return Response(405, "Method Not Allowed", "/metrics takes GET or HEAD\n", false,
                      "Allow: GET, HEAD\r\n");
    }
    std::string body;
    try {
      std::vector<prometheus::MetricFamily> families;
      for (const auto& c : collectables_) {
        std::vector<prometheus::MetricFamily> more = c->Collect();
        families.insert(families.end(), std::make_move_iterator(more.begin()),
                        std::make_move_iterator(more.end()));
      }
      body = prometheus::TextSerializer().Serialize(families);
    } catch (const std::exception& e) {  // out of memory, most likely: this scrape fails
      return Response(500, "Internal Server Error", absl::StrCat(e.what(), "\n"), head);
    }
    return Response(200, "OK", body, head, {}, kMetricsType);
  }

  const std::vector<std::shared_ptr<const prometheus::Collectable>> collectables_;
  const MetricsHttpOptions options_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
  int port_ = 0;
  std::map<uint64_t, Conn> conns_;  // by id, which grows with accept order
  uint64_t next_id_ = 2;
  bool accept_paused_ = false;
  Clock::time_point accept_resume_;
  std::thread thread_;
  std::mutex stop_mu_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address,
    std::vector<std::shared_ptr<const prometheus::Collectable>> collectables,
    const MetricsHttpOptions& options) {
  auto impl = std::make_unique<Impl>(std::move(collectables), options);
  if (absl::Status s = impl->Listen(address); !s.ok()) return s;
  if (absl::Status s = impl->StartThread(); !s.ok()) return s;
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsHttpServer::~MetricsHttpServer() { Stop(); }
void MetricsHttpServer::Stop() { impl_->Stop(); }
int MetricsHttpServer::port() const { return impl_->port(); }

}  // namespace fusebox
