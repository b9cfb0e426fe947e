// StallWatch: cancels a call that has waited on its client for longer than it should (an
// Upload's next message, a Download's next chunk, a reply the client does not take), so a
// stalled, vanished or trickling client cannot hold tensor memory or in-flight bytes until its
// connection ends. A call's waits on its client may last, all together, the timeout plus one
// second per MiB it has moved and might move in the message it waits for: a client must keep
// to 1 MiB/s on average after the timeout's grace, and tiny messages buy no more time than
// their bytes (a time allowance per message would let one byte every few seconds hold a
// reservation for ever). The last wait, for the reply or the status, has an allowance of its
// own. A reactor holds a StallWatch::Call and marks when it starts and stops waiting; the
// server's sweeper calls CancelStalled. Thread-safe.
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
    // From now on the call waits on its client, to move a message of `bytes` at most: within
    // what is left of the call's allowance.
    void Waiting(int64_t bytes);
    // From now on the call waits on its client to take its last message (the reply, `bytes`,
    // or the status alone): within the timeout and the time `bytes` take, whatever came before.
    void Finishing(int64_t bytes = 0);
    // It no longer waits; `moved` bytes came or went meanwhile.
    void Working(int64_t moved = 0);

   private:
    void WaitUntil(int64_t until_ns);

    StallWatch* const watch_;
    grpc::ServerContextBase* const ctx_;
    int64_t wait_started_ns_ = -1;  // -1: not waiting
    int64_t waited_ns_ = 0;         // all the call's waits that have ended
    int64_t moved_ = 0;             // bytes they moved
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
