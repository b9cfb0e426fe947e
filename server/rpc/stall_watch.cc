// StallWatch: see stall_watch.h.
#include "server/rpc/stall_watch.h"

#include "server/exec/backend.h"

namespace fusebox {

StallWatch::StallWatch(double timeout_seconds)
    : timeout_ns_(static_cast<int64_t>(timeout_seconds * 1e9)) {}

namespace {

int64_t TransitNs(int64_t bytes) {
  return static_cast<int64_t>(1e9 * static_cast<double>(bytes) /
                              StallWatch::kMinClientBytesPerSecond);
}

}  // namespace

void StallWatch::Call::Waiting(int64_t bytes) {
  if (watch_ == nullptr || watch_->timeout_ns_ <= 0) return;
  const int64_t now = SteadyNowNs();
  wait_started_ns_ = now;
  WaitUntil(now + watch_->timeout_ns_ + TransitNs(moved_ + bytes) - waited_ns_);
}

void StallWatch::Call::Finishing(int64_t bytes) {
  if (watch_ == nullptr || watch_->timeout_ns_ <= 0) return;
  const int64_t now = SteadyNowNs();
  wait_started_ns_ = now;
  WaitUntil(now + watch_->timeout_ns_ + TransitNs(bytes));
}

void StallWatch::Call::WaitUntil(int64_t until_ns) {
  std::lock_guard<std::mutex> lock(watch_->mu_);
  watch_->waiting_[this] = {ctx_, until_ns};
}

void StallWatch::Call::Working(int64_t moved) {
  if (watch_ == nullptr || watch_->timeout_ns_ <= 0) return;
  if (wait_started_ns_ >= 0) {
    waited_ns_ += SteadyNowNs() - wait_started_ns_;
    wait_started_ns_ = -1;
  }
  moved_ += moved;
  std::lock_guard<std::mutex> lock(watch_->mu_);
  watch_->waiting_.erase(this);
}

int StallWatch::CancelStalled(int64_t now_ns) {
  if (timeout_ns_ <= 0) return 0;
  int n = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now_ns > it->second.second) {
      it->second.first->TryCancel();
      it = waiting_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

}  // namespace fusebox
