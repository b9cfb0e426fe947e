// WorkQueue: see work_queue.h.
#include "server/exec/work_queue.h"

#include <algorithm>
#include <utility>

namespace fusebox {

WorkQueue::WorkQueue(int workers, size_t capacity) : capacity_(capacity) {
  workers = std::max(workers, 1);  // a queue without workers would never run what it accepts
  for (int i = workers - 1; i >= 0; --i) free_slots_.push_back(i);  // slot 0 is taken first
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { Run(i); });
}

WorkQueue::~WorkQueue() { Shutdown(); }

bool WorkQueue::TryPush(Job job, bool over_capacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || (jobs_.size() >= capacity_ && !over_capacity)) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

bool WorkQueue::TryRunHere(const Job& job) {
  int slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !jobs_.empty() || free_slots_.empty()) return false;
    slot = TakeSlot();
  }
  job(slot);
  GiveBack(slot);
  return true;
}

int WorkQueue::TakeSlot() {
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  ++busy_;
  return slot;
}

void WorkQueue::GiveBack(int slot) {
  bool waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --busy_;
    free_slots_.push_back(slot);
    waiting = !jobs_.empty();
  }
  if (waiting) cv_.notify_one();  // a job queued meanwhile can have the slot
}

void WorkQueue::Shutdown() {
  // Every caller returns only once the queue has drained and its workers are joined (a
  // second caller waits for the first).
  std::call_once(shutdown_once_, [this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  });
}

bool WorkQueue::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

size_t WorkQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

int WorkQueue::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void WorkQueue::Run(int) {
  for (;;) {
    Job job;
    int slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A queued job waits for a free slot too (one may be running on a caller's thread).
      cv_.wait(lock, [this] {
        return (stopping_ && jobs_.empty()) || (!jobs_.empty() && !free_slots_.empty());
      });
      if (jobs_.empty()) return;  // stopping and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
      slot = TakeSlot();
    }
    job(slot);
    GiveBack(slot);
  }
}

}  // namespace fusebox
