// HeldCpuBackend: the CPU backend with every op held at Submit until the test releases it (all,
// or the one whose first input starts with a given value), for tests of what a call does while
// it waits: cancellation, abandonment, per-stream bounds, the drain.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"

namespace fusebox {

class HeldCpuBackend final : public Backend {
 public:
  HeldCpuBackend() : cpu_(MakeCpuBackend({})) {}
  std::string name() const override { return cpu_->name(); }
  std::string device() const override { return cpu_->device(); }
  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (open_) {
      lock.unlock();
      cpu_->Submit(call, enqueued_ns, std::move(done));
      return;
    }
    held_.push_back({call, enqueued_ns, std::move(done)});
    ++submitted_;
    cv_.notify_all();
  }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return cpu_->Allocate(bytes);
  }
  BackendStats stats() const override { return cpu_->stats(); }
  void Shutdown() override { cpu_->Shutdown(); }

  // Waits until `n` ops have been held in all (false after 10 s).
  bool WaitUntilSubmitted(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return submitted_ >= n; });
  }
  // Waits until `n` ops are held now (false after 10 s).
  bool WaitUntilHolding(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_.size() >= n; });
  }
  int submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  size_t holding() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Whether held op i's caller has gone (OpCall::abandoned).
  bool HeldAbandoned(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return i < held_.size() && held_[i].call.abandoned && held_[i].call.abandoned();
  }
  bool AllAbandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Held& h : held_) {
      if (!h.call.abandoned || !h.call.abandoned()) return false;
    }
    return true;
  }
  // Runs the held op whose first input starts with the float `first` (requests are read on
  // gRPC's threads, so ops of one stream may reach Submit in any order: tell them by content).
  bool ReleaseStartingWith(float first) {
    Held h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& x) {
        float v;
        std::memcpy(&v, x.call.inputs[0], sizeof v);
        return v == first;
      });
      if (it == held_.end()) return false;
      h = std::move(*it);
      held_.erase(it);
    }
    Run(std::move(h));
    return true;
  }
  // Runs every held op; with `open`, later ones at once.
  void ReleaseAll(bool open = false) {
    std::vector<Held> run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      run.swap(held_);
      open_ = open_ || open;
    }
    for (Held& h : run) Run(std::move(h));
  }
  // What the CPU backend answered each released op, in the order they ended (CANCELLED: not
  // computed, its caller had gone).
  std::vector<absl::StatusCode> BackendCodes() {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_;
  }

 private:
  struct Held {
    OpCall call;
    int64_t enqueued_ns = 0;
    OpDone done;
  };
  void Run(Held h) {
    cpu_->Submit(h.call, h.enqueued_ns,
                 [this, done = std::move(h.done)](absl::Status s, const OpTiming& t) {
                   {
                     std::lock_guard<std::mutex> lock(mu_);
                     codes_.push_back(s.code());
                   }
                   done(std::move(s), t);
                 });
  }
  const std::unique_ptr<Backend> cpu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held> held_;
  std::vector<absl::StatusCode> codes_;
  int submitted_ = 0;
  bool open_ = false;
};

}  // namespace fusebox
