// Batcher (see batcher.h).
#include "server/exec/batcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox {

namespace {
enum State { kListed, kOwned, kTaken };
}  // namespace

struct Batcher::Pending {
  OpCall call;
  int64_t enqueued_ns = 0;
  OpDone done;
  Key key;
  size_t in_bytes = 0, out_bytes = 0;
  State state = kListed;  // guarded by Batcher::mu_
};

Batcher::Batcher(BatchOptions options, RunOne run, AllocHost alloc)
    : options_(options), run_(std::move(run)), alloc_(std::move(alloc)) {}

Batcher::Key Batcher::KeyOf(const OpCall& c) {
  return Key{static_cast<int>(c.op), static_cast<int>(c.dtype), c.op == Op::kGelu ? 0 : c.cols};
}

bool Batcher::Batchable(const OpCall& c) const {
  if (!options_.enabled || options_.max_call_bytes == 0) return false;
  if (c.op != Op::kGelu && c.op != Op::kSoftmax && c.op != Op::kRowSum) return false;
  if (c.input_resident[0] || c.output_resident) return false;
  if (c.inputs[0] == nullptr || c.output == nullptr) return false;
  const int64_t limit = static_cast<int64_t>(options_.max_call_bytes);
  if (c.rows < 1 || c.cols < 1 || c.rows > limit || c.cols > limit) return false;
  const size_t in = static_cast<size_t>(c.rows) * static_cast<size_t>(c.cols) * ElementSize(c.dtype);
  const size_t out = c.op == Op::kRowSum ? static_cast<size_t>(c.rows) * sizeof(float) : in;
  if (in > options_.max_call_bytes || c.output_bytes != out) return false;
  if (c.input_pieces[0] != nullptr) {
    size_t sum = 0;
    for (const HostPiece& piece : *c.input_pieces[0]) sum += piece.bytes;
    if (sum != in) return false;
  }
  return true;
}

void Batcher::Submit(QueuedExecutor& exec, const OpCall& call, int64_t enqueued_ns, OpDone done,
                     bool here) {
  auto alone = [this, call](int worker, OpTiming* t) {
    if (absl::Status s = NotAbandoned(call); !s.ok()) return s;
    counters_.calls.fetch_add(1, std::memory_order_relaxed);
    counters_.launches.fetch_add(1, std::memory_order_relaxed);
    return run_(worker, call, t);
  };
  const bool batchable = Batchable(call);
  if (!batchable) {
    exec.Run(enqueued_ns, std::move(done), std::move(alone), /*continuation=*/false, here);
    return;
  }
  // A call that can run here now finds nothing queued to batch with (and, without a wait, would
  // wait for nothing): it runs alone, without being listed.
  if (here && options_.wait_us == 0 && exec.TryRunHere(enqueued_ns, done, alone)) return;
  auto p = std::make_shared<Pending>();
  p->call = call;
  p->enqueued_ns = enqueued_ns;
  p->done = std::move(done);
  p->key = KeyOf(call);
  p->in_bytes = static_cast<size_t>(call.rows) * call.cols * ElementSize(call.dtype);
  p->out_bytes = call.output_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_[p->key].push_back(p);
  }
  if (options_.wait_us > 0) listed_.notify_all();
  // Called by the executor: after this call's own job ran, or at once when it was refused.
  // A call another job took is answered by that job instead.
  OpDone answer = [this, p](absl::Status s, const OpTiming& t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (p->state == kTaken) return;
      if (p->state == kListed) {  // refused by the queue before its job ran
        p->state = kOwned;
        Unlist(p);
      }
    }
    p->done(std::move(s), t);
  };
  exec.Run(enqueued_ns, std::move(answer),
           [this, p](int worker, OpTiming* t) { return RunBatch(p, worker, t); },
           /*continuation=*/false, /*here=*/false);
}

void Batcher::Unlist(const std::shared_ptr<Pending>& p) {
  auto it = waiting_.find(p->key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  list.erase(std::remove(list.begin(), list.end(), p), list.end());
  if (list.empty()) waiting_.erase(it);
}

void Batcher::TakeMore(const std::shared_ptr<Pending>& p,
                       std::vector<std::shared_ptr<Pending>>* batch, size_t* bytes) {
  auto it = waiting_.find(p->key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  size_t kept = 0;
  bool full = false;
  for (size_t i = 0; i < list.size(); ++i) {
    std::shared_ptr<Pending>& q = list[i];
    if (!full && *bytes + q->in_bytes <= options_.max_batch_bytes) {
      q->state = kTaken;
      *bytes += q->in_bytes;
      batch->push_back(std::move(q));
    } else {
      if (*bytes + q->in_bytes > options_.max_batch_bytes) full = true;  // keep the order
      if (kept != i) list[kept] = std::move(q);
      ++kept;
    }
  }
  list.resize(kept);
  if (list.empty()) waiting_.erase(it);
}

absl::Status Batcher::RunBatch(const std::shared_ptr<Pending>& p, int worker, OpTiming* t) {
  std::vector<std::shared_ptr<Pending>> batch;
  size_t bytes = p->in_bytes;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (p->state == kTaken) return absl::OkStatus();  // ran in another job's batch
    p->state = kOwned;
    Unlist(p);
    batch.push_back(p);
    TakeMore(p, &batch, &bytes);
    if (options_.wait_us > 0) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::microseconds(options_.wait_us);
      while (bytes + p->in_bytes <= options_.max_batch_bytes &&
             listed_.wait_until(lock, deadline) != std::cv_status::timeout) {
        TakeMore(p, &batch, &bytes);
      }
      TakeMore(p, &batch, &bytes);
    }
  }
  // Calls whose callers have gone are answered CANCELLED and left out, the one that started the
  // batch included (asked here, outside mu_: `abandoned` is the RPC layer's code).
  const int64_t start = SteadyNowNs();
  absl::Status own = NotAbandoned(p->call);
  size_t kept = own.ok() ? 1 : 0;  // batch[0, kept): the calls that run
  for (size_t i = 1; i < batch.size(); ++i) {
    if (absl::Status s = NotAbandoned(batch[i]->call); !s.ok()) {
      OpTiming tq;
      tq.stream = worker;
      tq.queue_us = tq.total_us = (start - batch[i]->enqueued_ns) / 1e3;
      batch[i]->done(std::move(s), tq);
    } else {
      if (kept != i) batch[kept] = std::move(batch[i]);
      ++kept;
    }
  }
  batch.resize(kept);
  if (!own.ok()) {
    // The rest still run, as a batch of their own on this worker.
    if (!batch.empty()) {
      OpTiming ignored;
      RunTaken(batch, worker, start, &ignored, /*owner_included=*/false).IgnoreError();  // answered
    }
    return own;
  }
  return RunTaken(batch, worker, start, t, /*owner_included=*/true);
}

absl::Status Batcher::RunTaken(std::vector<std::shared_ptr<Pending>>& batch, int worker,
                               int64_t start, OpTiming* t, bool owner_included) {
  const std::shared_ptr<Pending> p = batch.front();
  const size_t n = batch.size();
  counters_.calls.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  counters_.launches.fetch_add(1, std::memory_order_relaxed);
  if (n == 1 && owner_included) return run_(worker, p->call, t);
  if (n > 1) counters_.batched_calls.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);

  // One call over every row: the inputs as pieces, in order (the backend copies them together
  // as it does any call's pieces), the result into one host buffer split afterwards.
  HostPieces pieces;
  pieces.reserve(n);
  int64_t rows = 0;
  size_t out_bytes = 0;
  for (const auto& q : batch) {
    if (q->call.input_pieces[0] != nullptr) {
      for (const HostPiece& piece : *q->call.input_pieces[0]) {
        if (piece.bytes > 0) pieces.push_back(piece);
      }
    } else {
      pieces.push_back(HostPiece{q->call.inputs[0], q->in_bytes});
    }
    rows += q->call.op == Op::kGelu ? q->call.rows * q->call.cols : q->call.rows;
    out_bytes += q->out_bytes;
  }
  OpCall c;
  c.op = p->call.op;
  c.dtype = p->call.dtype;
  if (c.op == Op::kGelu) {
    c.rows = 1;
    c.cols = rows;
  } else {
    c.rows = rows;
    c.cols = p->call.cols;
  }
  c.inputs[0] = pieces.front().data;
  c.input_pieces[0] = &pieces;
  HostBytes out = alloc_(out_bytes);
  OpTiming bt;
  absl::Status s;
  if (out == nullptr) {
    s = absl::ResourceExhaustedError(
        absl::StrCat("could not allocate ", out_bytes, " bytes for a batch's result"));
  } else {
    c.output = out.get();
    c.output_bytes = out_bytes;
    s = run_(worker, c, &bt);
  }
  if (s.ok()) {
    const int64_t split = SteadyNowNs();
    const char* at = out.get();
    for (const auto& q : batch) {
      std::memcpy(q->call.output, at, q->out_bytes);
      at += q->out_bytes;
    }
    bt.copy_out_us += (SteadyNowNs() - split) / 1e3;
  }
  // Each call but the owner (whose job's own `done` follows) is answered here.
  for (size_t i = owner_included ? 1 : 0; i < n; ++i) {
    const Pending& q = *batch[i];
    OpTiming tq = bt;
    tq.stream = worker;
    tq.queue_us = (start - q.enqueued_ns) / 1e3;
    tq.total_us = (SteadyNowNs() - q.enqueued_ns) / 1e3;
    q.done(s, tq);
  }
  t->copy_in_us = bt.copy_in_us;
  t->launch_us = bt.launch_us;
  t->kernel_us = bt.kernel_us;
  t->copy_out_us = bt.copy_out_us;
  return s;
}

void Batcher::FillStats(BackendStats* s) const {
  s->calls = counters_.calls.load(std::memory_order_relaxed);
  s->launches = counters_.launches.load(std::memory_order_relaxed);
  s->batched_calls = counters_.batched_calls.load(std::memory_order_relaxed);
}

}  // namespace fusebox
