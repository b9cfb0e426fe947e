// CpuBackend: runs OpCalls with kernels/cpu on a WorkQueue. Copies are zero:
// kernels read the request's bytes and write the response's bytes in place.
#include "server/cpu_backend.h"

#include <chrono>
#include <utility>

#include "kernels/cpu/ops.h"
#include "server/work_queue.h"

namespace fusebox {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status RunOnCpu(const OpCall& c) {
  switch (c.op) {
    case Op::kGelu: return cpu::Gelu(c.dtype, c.inputs[0], c.output, c.rows * c.cols);
    case Op::kSoftmax: return cpu::Softmax(c.dtype, c.inputs[0], c.output, c.rows, c.cols);
    case Op::kRowSum:
      return cpu::RowSum(c.dtype, c.inputs[0], static_cast<float*>(c.output), c.rows, c.cols);
    case Op::kMatmulRelu:
      return cpu::MatmulRelu(c.dtype, c.inputs[0], c.inputs[1], c.inputs[2], c.output, c.m, c.n,
                             c.k);
  }
  return absl::InternalError("unknown op");
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o) : queue_(o.workers, o.queue_capacity) {}
  ~CpuBackend() override { Shutdown(); }

  std::string name() const override { return "cpu"; }
  std::string device() const override { return "cpu"; }

  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override {
    // `done` is moved into the job only when the push succeeds.
    auto shared_done = std::make_shared<OpDone>(std::move(done));
    const bool queued = queue_.TryPush([call, enqueued_ns, shared_done](int worker) {
      OpTiming t;
      t.stream = worker;
      const int64_t start = NowNs();
      absl::Status s = RunOnCpu(call);
      const int64_t end = NowNs();
      t.queue_us = (start - enqueued_ns) / 1e3;
      t.kernel_us = (end - start) / 1e3;
      t.total_us = (end - enqueued_ns) / 1e3;
      (*shared_done)(std::move(s), t);
    });
    if (!queued) {
      (*shared_done)(queue_.stopping()
                         ? absl::UnavailableError("the server is shutting down")
                         : absl::ResourceExhaustedError("the CPU backend's queue is full; retry later"),
                     OpTiming{});
    }
  }

  BackendStats stats() const override {
    BackendStats s;
    s.queued = static_cast<int64_t>(queue_.queued());
    s.busy = queue_.busy();
    s.workers = queue_.workers();
    return s;
  }

  void Shutdown() override { queue_.Shutdown(); }

 private:
  WorkQueue queue_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace fusebox
