// QueuedExecutor (see queued_executor.h).
#include "server/exec/queued_executor.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox {

QueuedExecutor::QueuedExecutor(std::string backend, int workers, size_t capacity)
    : backend_(std::move(backend)), capacity_(capacity), queue_(workers, capacity) {}

namespace {

// One job on `worker`, timed from the request's arrival; `done` gets its status and timing.
void Timed(int64_t enqueued_ns, int worker, const QueuedExecutor::Work& work, const OpDone& done) {
  OpTiming t;
  t.stream = worker;
  t.queue_us = (SteadyNowNs() - enqueued_ns) / 1e3;
  absl::Status s = work(worker, &t);
  t.total_us = (SteadyNowNs() - enqueued_ns) / 1e3;
  done(std::move(s), t);
}

}  // namespace

void QueuedExecutor::Run(int64_t enqueued_ns, OpDone done, Work work, bool continuation,
                         bool here) {
  if (here && queue_.TryRunHere([&](int worker) { Timed(enqueued_ns, worker, work, done); })) {
    return;
  }
  // `done` is shared so that it is still ours to call when the push fails.
  auto shared_done = std::make_shared<OpDone>(std::move(done));
  const bool queued = queue_.TryPush(
      [enqueued_ns, shared_done, work = std::move(work)](int worker) {
        Timed(enqueued_ns, worker, work, *shared_done);
      },
      continuation);
  if (!queued) {
    (*shared_done)(queue_.stopping()
                       ? absl::UnavailableError("the server is shutting down")
                       : absl::ResourceExhaustedError(absl::StrCat(
                             "the ", backend_, " backend's queue is full (", capacity_,
                             " calls); retry later")),
                   OpTiming{});
  }
}

bool QueuedExecutor::TryRunHere(int64_t enqueued_ns, const OpDone& done, const Work& work) {
  return queue_.TryRunHere([&](int worker) { Timed(enqueued_ns, worker, work, done); });
}

void QueuedExecutor::FillStats(BackendStats* s) const {
  s->queued = static_cast<int64_t>(queue_.queued());
  s->busy = queue_.busy();
  s->workers = queue_.workers();
}

}  // namespace fusebox
