// QueuedExecutor: how both backends run work. A WorkQueue of `workers` threads; each job is
// timed from the request's arrival (queue_us: arrival to start on a worker; total_us: arrival
// to the end of the work) and its OpDone runs on the worker (or on the caller's thread, for a
// job run there). A full queue is refused at once
// with RESOURCE_EXHAUSTED, a stopping one with UNAVAILABLE; neither runs the work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "server/exec/backend.h"
#include "server/exec/work_queue.h"

namespace fusebox {

class QueuedExecutor {
 public:
  // The work of one job on worker `worker`: fills its phases into *t, returns the call's status.
  using Work = std::function<absl::Status(int worker, OpTiming* t)>;

  // `backend` names the backend in refusals ("the CUDA backend's queue is full ...").
  QueuedExecutor(std::string backend, int workers, size_t capacity);

  // Queues `work`; `done` gets its status and timing (with stream = the worker) exactly once.
  // `continuation`: a transfer's later piece, queued past a full queue (Backend::SubmitWrite).
  // `here`: when a worker's slot is free and nothing is queued, run the work (and `done`) on
  // this thread now instead (WorkQueue::TryRunHere): for small calls, whose handoff to a
  // worker would cost more than the work.
  void Run(int64_t enqueued_ns, OpDone done, Work work, bool continuation = false,
           bool here = false);

  // Runs `work` (and `done`) on this thread now when a worker's slot is free and nothing is
  // queued (Run's `here`); false, with nothing run and `done` not called, otherwise.
  bool TryRunHere(int64_t enqueued_ns, const OpDone& done, const Work& work);

  // Stops taking work, runs what is queued, joins the workers. Idempotent.
  void Shutdown() { queue_.Shutdown(); }
  bool stopping() const { return queue_.stopping(); }

  // queued, busy and workers of BackendStats.
  void FillStats(BackendStats* s) const;

 private:
  const std::string backend_;
  const size_t capacity_;
  WorkQueue queue_;
};

}  // namespace fusebox
