// StallWatch: cancels a call that has waited on its client for longer than it should (an
// Upload's next message, a Download's next chunk, a reply the client does not take), so a
// stalled or vanished client cannot hold tensor memory or in-flight bytes until its
// connection ends. A wait may last the timeout plus one second per MiB of the message in
// transit (a client slower than 1 MiB/s on a message counts as stalled). A reactor holds a
// StallWatch::Call and marks when it starts and stops waiting; the server's sweeper calls
// CancelStalled. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <grpcpp/server_context.h>

namespace fusebox {

class StallWatch {
 public:
  static constexpr int64_t kMinClientBytesPerSecond = int64_t{1} << 20;

  explicit StallWatch(double timeout_seconds);  // 0 = never cancels
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // One call's watch. `watch` may be null (not watched). Destroy it before the call's
  // OnDone returns: until then the context is valid for CancelStalled's TryCancel.
  class Call {
   public:
    Call(StallWatch* watch, grpc::ServerContextBase* ctx) : watch_(watch), ctx_(ctx) {}
    ~Call() { Working(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // From now on the call waits on its client, to move a message of `bytes`.
    void Waiting(int64_t bytes = 0);
    void Working();  // it no longer does

   private:
    StallWatch* const watch_;
    grpc::ServerContextBase* const ctx_;
  };

  // Cancels every call whose wait has run past its allowance at `now_ns` (steady clock);
  // returns how many.
  int CancelStalled(int64_t now_ns);

 private:
  const int64_t timeout_ns_;
  std::mutex mu_;
  // Waiting calls and when their allowance ends. TryCancel runs under mu_: a call leaves the
  // map (its Working, from its reactor's destructor) only once no cancel is touching its
  // context. gRPC runs no reaction inline from TryCancel, so none can wait on mu_ under it.
  std::unordered_map<const Call*, std::pair<grpc::ServerContextBase*, int64_t>> waiting_;
};

}  // namespace fusebox
