// A bounded queue of jobs served by a fixed set of worker threads. A job runs with a slot
// index, so a backend can give slot i its own CUDA stream and staging buffers; no two jobs hold
// one slot at once. TryPush never blocks: a full queue is the caller's RESOURCE_EXHAUSTED.
// TryRunHere runs a job on the calling thread instead, when a slot is free and nothing waits:
// no handoff to a worker (a condvar wake costs a small call 10-50 us).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fusebox {

class WorkQueue {
 public:
  using Job = std::function<void(int worker)>;

  // At least one worker (0 or fewer is taken as 1).
  WorkQueue(int workers, size_t capacity);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // False when the queue holds `capacity` jobs or Shutdown has begun. `over_capacity`: a job
  // that continues work already admitted (a transfer's next piece) is taken even when the
  // queue is full; false only once Shutdown has begun.
  bool TryPush(Job job, bool over_capacity = false);
  // Runs `job` now, on this thread, with a free slot, when no job is queued (none is overtaken)
  // and the queue is not stopping; false (nothing run) otherwise.
  bool TryRunHere(const Job& job);
  // Stops accepting, runs what is queued, joins the workers. Idempotent: every
  // caller returns once that is done. Not from a worker (a job) itself.
  void Shutdown();

  bool stopping() const;
  size_t queued() const;  // waiting, not yet running
  int busy() const;       // running now
  int workers() const { return static_cast<int>(threads_.size()); }

 private:
  void Run(int worker);
  // A free slot for a job about to run (mu_ held, one is free); and back once it has run.
  int TakeSlot();
  void GiveBack(int slot);  // mu_ not held

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<int> free_slots_;  // slots no job holds
  int busy_ = 0;
  bool stopping_ = false;
  std::once_flag shutdown_once_;
  std::vector<std::thread> threads_;
};

}  // namespace fusebox
