// StallWatch: see stall_watch.h.
#include "server/rpc/stall_watch.h"

#include "server/exec/backend.h"

namespace fusebox {

StallWatch::StallWatch(double timeout_seconds)
    : timeout_ns_(static_cast<int64_t>(timeout_seconds * 1e9)) {}

void StallWatch::Call::Waiting(int64_t bytes) {
  if (watch_ == nullptr || watch_->timeout_ns_ <= 0) return;
  const double transit_ns = 1e9 * static_cast<double>(bytes) / kMinClientBytesPerSecond;
  const int64_t until = SteadyNowNs() + watch_->timeout_ns_ + static_cast<int64_t>(transit_ns);
  std::lock_guard<std::mutex> lock(watch_->mu_);
  watch_->waiting_[this] = {ctx_, until};
}

void StallWatch::Call::Working() {
  if (watch_ == nullptr || watch_->timeout_ns_ <= 0) return;
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
