// Batcher: small calls of one op, dtype and row length that wait for a worker (CPU) or a stream
// (CUDA) at the same time run as one launch, shared by both backends (issue 32).
//
// Every call still gets its own job in the QueuedExecutor. Batchable calls are also listed
// here by key while they wait. The job that starts first for a key takes every other call of
// that key still listed (oldest first, up to max_batch_bytes), marks them taken and runs them
// as one call: inputs packed consecutively (rows concatenated; GeLU's elements concatenated),
// one kernel over the total rows, the packed result split back to each call's output. A taken
// call's own job, when a worker reaches it, does nothing (its `done` has been or will be called
// by the batch). With wait_us > 0 the job first waits up to that long for more calls of its
// key (0: batch only what is already queued).
//
// Batchable: GeLU, softmax and row sum with inline (not resident) input and output, each at
// most max_call_bytes in and out, sizes consistent (output_bytes is the result's size). Any
// other call runs alone, as before. A call abandoned by the time its batch runs is left out and
// answered CANCELLED, without being computed. Rows never mix (softmax / row sum work per row, GeLU per element), so
// one call's values cannot change another's result.
//
// A batch that fails (out of memory for the packed result, a CUDA error) answers each of its
// calls with that status; calls of other batches and keys are not touched.
//
// Timing of a batched call: queue_us its own (arrival to the batch's start), copy_in_us /
// kernel_us / copy_out_us / launch_us the batch's (the whole packed launch; copy_in includes
// packing, copy_out the split), total_us its own (arrival to the end of the batch).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "server/exec/backend.h"
#include "server/exec/queued_executor.h"

namespace fusebox {

struct BatchOptions {
  bool enabled = true;                   // --batching
  size_t max_call_bytes = 64 << 10;      // --batch_max_kib: a call's input (and output) at most
  size_t max_batch_bytes = 1 << 20;      // a batch's packed input at most
  int64_t wait_us = 0;                   // --batch_wait_us
};

// Launch counts for launches per call (BackendStats).
struct BatchCounters {
  std::atomic<int64_t> calls{0};          // op calls that reached a kernel launch
  std::atomic<int64_t> launches{0};       // kernel launches (a batch is one)
  std::atomic<int64_t> batched_calls{0};  // calls that ran in a batch of two or more
};

class Batcher {
 public:
  // Runs one call (maybe a packed batch) on worker `worker`: the backend's own path, which
  // copies pieces together, launches and fills the copy / kernel phases of *t.
  using RunOne = std::function<absl::Status(int worker, const OpCall& call, OpTiming* t)>;
  // Host memory for a batch's packed result (the backend's AllocateHostBytes).
  using AllocHost = std::function<HostBytes(size_t bytes)>;

  Batcher(BatchOptions options, RunOne run, AllocHost alloc);

  // Whether `call` may be batched under these options.
  bool Batchable(const OpCall& call) const;

  // Submits `call` to `exec` (as QueuedExecutor::Run with `here`): alone when not batchable.
  // A batchable call that can run on this thread now (`here`, a free slot, nothing queued, no
  // wait) runs alone there, as before: nothing waits that it could join. Otherwise it is listed
  // for other jobs of its key to take and queued; with wait_us > 0 it is always queued (it
  // would hold this thread while waiting).
  void Submit(QueuedExecutor& exec, const OpCall& call, int64_t enqueued_ns, OpDone done,
              bool here);

  void FillStats(BackendStats* s) const;
  const BatchOptions& options() const { return options_; }

 private:
  struct Pending;
  using Key = std::tuple<int, int, int64_t>;  // op, dtype, cols (GeLU: 0)
  static Key KeyOf(const OpCall& c);

  // The job of a batchable call: takes it and others of its key, runs them.
  absl::Status RunBatch(const std::shared_ptr<Pending>& p, int worker, OpTiming* t);
  // Runs `batch` (taken, none abandoned; batch[0] its owner when owner_included) as one call
  // from `start`; answers every call but an included owner, whose status it returns.
  absl::Status RunTaken(std::vector<std::shared_ptr<Pending>>& batch, int worker, int64_t start,
                        OpTiming* t, bool owner_included);
  // Removes p from its list (mu_ held).
  void Unlist(const std::shared_ptr<Pending>& p);
  // Takes listed calls of p's key into *batch while they fit (mu_ held).
  void TakeMore(const std::shared_ptr<Pending>& p, std::vector<std::shared_ptr<Pending>>* batch,
                size_t* bytes);

  const BatchOptions options_;
  const RunOne run_;
  const AllocHost alloc_;
  std::mutex mu_;
  std::condition_variable listed_;  // a call was listed (for jobs waiting for more)
  std::map<Key, std::vector<std::shared_ptr<Pending>>> waiting_;  // oldest first
  BatchCounters counters_;
};

}  // namespace fusebox
