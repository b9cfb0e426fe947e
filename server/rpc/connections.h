// Connections: the server's view of its client connections, which gRPC 1.51 does not give (no
// connection limit, no per-stream arrival deadline, no way to close one connection). It sees
// each accepted connection's socket through gRPC's socket mutator (called on every accepted
// descriptor) and each call's connection through a server interceptor (the call's peer
// address), and with them:
//  - refuses connections past a limit: closed at once, before gRPC spends more on them than a
//    descriptor for a moment, so the process never runs out of descriptors (gRPC's listener
//    stops for good after a failed accept). gRPC frees a refused connection's descriptor only
//    some time later, and accepts the whole listen backlog in one go: so the backlog is kept
//    small, and while too many refused connections wait to be freed it shrinks to one (new
//    connections wait in the kernel) until they are;
//  - closes a connection that carries no call in flight and receives less than the minimum
//    rate for longer than the arrival timeout: requests whose bodies never finish (gRPC holds
//    them until their connection ends, and runs no handler before the body is whole);
//  - at shutdown, closes the connections that carry no call in flight, so a request still
//    arriving fails at once (UNAVAILABLE) instead of when its body is whole (gRPC takes no
//    new call once shutdown has begun).
// Unix-socket connections count against the limit but share one peer address, so they are
// closed at shutdown only once no call is in flight on any of them, and never for being quiet.
// A call whose peer matches no connection (it should not happen) stops all closing while it
// lasts: a connection serving a call is never closed. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/support/server_interceptor.h>

namespace fusebox {

class Connections {
 public:
  struct Limits {
    int64_t max_connections = 1000;
    int64_t backlog = 0;          // the listen backlog, all listeners; 0 = gRPC's own
    int64_t max_refusing = 256;   // refused connections gRPC has yet to free, before a pause
    // A connection with no call in flight may receive less than min_bytes_per_second for this
    // long (plus the time that rate takes for what it did receive); 0 = never closed for that.
    double quiet_timeout_seconds = 0;
    int64_t min_bytes_per_second = int64_t{1} << 20;
  };

  explicit Connections(Limits limits);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Installs the socket mutator (ServerBuilder::SetOption) and the interceptor that counts calls
  // per connection (ServerBuilder::experimental().SetInterceptorCreators). Both must be given to
  // the same server, and this must outlive it.
  std::unique_ptr<grpc::ServerBuilderOption> BuilderOption();
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallCounter();

  // Whether gRPC has shown this its listening socket (the mutator is in use).
  bool watching() const;
  // Gives the listening sockets their backlog (shared: gRPC may open one per poller), about
  // the most connections gRPC accepts in one go; once the server has started. Returns how many
  // listening sockets there are.
  int SetBacklog();
  int64_t refused() const;  // connections refused for the limit, so far
  // Closes the connections quiet past their allowance at `now_ns` (steady clock); returns how
  // many. The server's sweeper calls it.
  int CloseQuiet(int64_t now_ns);
  // Closes every connection that carries no call in flight; returns how many. At shutdown.
  int CloseIdle();

  // Called by the socket mutator and the call counter.
  void Accepted(int fd);
  void Listening(int fd);
  void CallStarted(const std::string& peer);
  void CallEnded(const std::string& peer);

 private:
  struct Conn {
    uint64_t ino = 0;  // the socket's inode: its descriptor still names it while they match
    std::string key;   // its peer address, as KeyOf gives it
    int calls = 0;     // calls in flight on it
    int64_t quiet_since_ns = 0;  // when it last had no call in flight
    int64_t bytes_mark = -1;     // bytes it had received then (-1: not read yet)
    bool closed = false;         // by us; gRPC frees it soon
  };
  // Drops the connections whose descriptors no longer name their sockets. Under mu_.
  void PruneLocked();
  void EraseLocked(int fd);
  // Closes `fd` (shutdown: gRPC sees the connection end and frees it) if it still names
  // `c`'s socket and is not closed yet. Under mu_.
  bool CloseLocked(int fd, Conn& c);
  // The listeners' backlog: one while paused, else the limit's share. Under mu_.
  void ListenLocked(bool paused);
  // Resumes once few refused connections wait to be freed. Under mu_.
  void MaybeResumeLocked();

  const Limits limits_;
  mutable std::mutex mu_;
  std::unordered_map<int, Conn> by_fd_;
  std::unordered_map<std::string, int> fd_by_key_;  // TCP connections only
  std::unordered_map<int, uint64_t> refusing_;      // refused, not yet freed: fd -> inode
  bool paused_ = false;
  int unix_calls_ = 0;       // calls in flight on Unix-socket connections
  int unmatched_calls_ = 0;  // calls in flight whose peer matches no connection
  int64_t refused_ = 0;
  int64_t last_prune_ns_ = 0;
  std::vector<int> listeners_;
};

}  // namespace fusebox
