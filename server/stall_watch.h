// StallWatch: cancels a call that has waited on its client for longer than a timeout (an
// Upload's next message, a Download's next chunk, a reply the client does not take), so a
// stalled or vanished client cannot hold tensor memory or in-flight bytes until its
// connection ends. A reactor holds a StallWatch::Call and marks when it starts and stops
// waiting; the server's sweeper calls CancelStalled. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <grpcpp/server_context.h>

namespace fusebox {

class StallWatch {
 public:
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
    void Waiting();  // from now on the call waits on its client
    void Working();  // it no longer does

   private:
    StallWatch* const watch_;
    grpc::ServerContextBase* const ctx_;
  };

  // Cancels every call that has waited longer than the timeout at `now_ns` (steady clock);
  // returns how many.
  int CancelStalled(int64_t now_ns);
  double timeout_seconds() const { return timeout_ns_ / 1e9; }

 private:
  const int64_t timeout_ns_;
  std::mutex mu_;
  // Waiting calls and since when. TryCancel runs under mu_: a call leaves the map (its
  // Working, from its reactor's destructor) only once no cancel is touching its context.
  // gRPC runs no reaction inline from TryCancel, so none can wait on mu_ under it.
  std::unordered_map<const Call*, std::pair<grpc::ServerContextBase*, int64_t>> waiting_;
};

}  // namespace fusebox
