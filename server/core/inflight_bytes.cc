// InflightBytes (see inflight_bytes.h): counters under one lock (three of them move together);
// a reservation is a token whose deleter gives its bytes back, so no path can forget to.
#include "server/core/inflight_bytes.h"

#include <mutex>

#include "absl/strings/str_cat.h"

namespace fusebox {

struct InflightBytes::Counter {
  std::mutex mu;
  int64_t working = 0;  // calls and transfers under way
  int64_t sending = 0;  // replies handed to gRPC, until their calls end
  int64_t replies = 0;  // how many those are
};

InflightBytes::InflightBytes(int64_t limit, int64_t sending_limit)
    : limit_(limit), sending_limit_(sending_limit), counter_(std::make_shared<Counter>()) {}

std::shared_ptr<void> InflightBytes::TryReserve(int64_t bytes) {
  Counter& c = *counter_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    // One that holds nothing always fits. A call alone fits whatever its size: it has passed
    // the message limits already.
    const bool fits = bytes <= 0 || ((c.working == 0 || bytes <= limit_ - c.working) &&
                                     (c.sending <= sending_limit_ || c.replies <= 1));
    if (!fits) return nullptr;
    c.working += bytes;
  }
  return std::shared_ptr<void>(&c, [keep = counter_, bytes](void*) {
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->working -= bytes;
  });
}

std::shared_ptr<void> InflightBytes::Sending(int64_t bytes) {
  Counter& c = *counter_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.sending += bytes;
    ++c.replies;
  }
  return std::shared_ptr<void>(&c, [keep = counter_, bytes](void*) {
    std::lock_guard<std::mutex> lock(keep->mu);
    keep->sending -= bytes;
    --keep->replies;
  });
}

std::string InflightBytes::Refusal(int64_t bytes, const char* what) const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  if (counter_->sending > sending_limit_ && counter_->replies > 1) {
    return absl::StrCat("replies their clients have not taken yet hold ", counter_->sending,
                        " bytes, past the ", sending_limit_,
                        " the server keeps for them (--inflight_mib, at least twice "
                        "--max_message_bytes); this ",
                        what, " needs ", bytes, "; retry later");
  }
  return absl::StrCat("the server holds ", counter_->working,
                      " bytes for calls in flight, and this ", what, " needs ", bytes,
                      " more (limit ", limit_, ", --inflight_mib); retry later");
}

int64_t InflightBytes::used() const {
  std::lock_guard<std::mutex> lock(counter_->mu);
  return counter_->working + counter_->sending;
}

}  // namespace fusebox
