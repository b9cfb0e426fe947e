// CpuBackend: runs OpCalls with kernels/cpu on a QueuedExecutor. Kernels read the request's
// bytes where they arrived and write the reply's bytes in place; an operand that arrived in
// several pieces (gRPC's receive slices), or whose start is not aligned to its element, is
// first copied together into one buffer on the worker (one pass, the only copy; a large one is
// spread over CpuBackendOptions::copy_threads, kernels/cpu/parallel_copy.h).
// Resident buffers are host memory, so a resident operand is used in place too.
#include "server/backends/cpu/cpu_backend.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_copy.h"
#include "server/exec/batcher.h"
#include "server/exec/host_pool.h"
#include "server/exec/queued_executor.h"

namespace fusebox {
namespace {

// The bytes of each input of `c` (0 where absent).
void InputBytes(const OpCall& c, size_t in[3]) {
  const size_t es = ElementSize(c.dtype);
  in[0] = in[1] = in[2] = 0;
  if (c.op == Op::kMatmulRelu) {
    in[0] = static_cast<size_t>(c.m) * c.k * es;
    in[1] = static_cast<size_t>(c.k) * c.n * es;
    in[2] = c.inputs[2] ? static_cast<size_t>(c.n) * es : 0;
  } else {
    in[0] = static_cast<size_t>(c.rows) * c.cols * es;
  }
}

// `bytes` of host memory: from `pool` when there is one and the buffer is large (small ones are
// quick to malloc, and a pool would only add its lock), else malloc'ed.
HostBytes PooledOrMalloced(HostBufferPool* pool, size_t bytes) {
  if (pool != nullptr && bytes >= kPooledBytes) return pool->Get(bytes);
  return MallocHostBytes(bytes);
}

// Points c's inputs where the kernels can read them: in place when contiguous and aligned to
// their element, else gathered into held[i] (from `pool` when there is one) by up to
// `copy_threads` threads.
absl::Status MakeContiguous(OpCall* c, HostBytes held[3], int copy_threads, HostBufferPool* pool) {
  size_t bytes[3];
  InputBytes(*c, bytes);
  for (int i = 0; i < 3; ++i) {
    if (c->inputs[i] == nullptr || bytes[i] == 0) continue;
    const bool aligned = reinterpret_cast<uintptr_t>(c->inputs[i]) % ElementSize(c->dtype) == 0;
    if (c->input_pieces[i] == nullptr && aligned) continue;
    held[i] = PooledOrMalloced(pool, bytes[i]);
    if (!held[i]) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the CPU backend could not allocate ", bytes[i], " bytes for an input"));
    }
    if (c->input_pieces[i] == nullptr) {
      ParallelCopy(held[i].get(), c->inputs[i], bytes[i], copy_threads);
    } else if (!GatherPieces(*c->input_pieces[i], size_t{0}, held[i].get(), bytes[i],
                             copy_threads)) {
      // The service checks that an operand's pieces hold its shape's bytes; never read past them.
      return absl::InternalError(
          absl::StrCat("input ", i, " arrived with fewer bytes than its shape's ", bytes[i]));
    }
    c->inputs[i] = held[i].get();
    c->input_pieces[i] = nullptr;
  }
  return absl::OkStatus();
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

// One call (or a batch packed into one, batcher.h) on the worker: pieces and unaligned inputs
// copied together first (copy_in_us), then the kernel (kernel_us); a GeLU reads its pieces
// where they are (kernel_us only).
absl::Status RunCall(const OpCall& call, OpTiming* t, int copy_threads, HostBufferPool* pool) {
  if (call.op == Op::kGelu && call.input_pieces[0] != nullptr) {
    // Elementwise: computed from the pieces as they arrived, without gathering them first.
    const int64_t start = SteadyNowNs();
    absl::Status s = cpu::GeluPieces(call.dtype, *call.input_pieces[0], call.output, call.rows * call.cols);
    t->kernel_us = (SteadyNowNs() - start) / 1e3;
    return s;
  }
  OpCall c = call;
  HostBytes held[3];
  const int64_t gather = SteadyNowNs();
  if (absl::Status s = MakeContiguous(&c, held, copy_threads, pool); !s.ok()) return s;
  const int64_t start = SteadyNowNs();
  if (held[0] || held[1] || held[2]) t->copy_in_us = (start - gather) / 1e3;
  absl::Status s = RunOnCpu(c);
  t->kernel_us = (SteadyNowNs() - start) / 1e3;
  return s;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : run_here_bytes_(o.run_here_bytes),
        copy_threads_(CopyThreads(o.copy_threads)),
        batcher_(o.batch,
                 [this](int, const OpCall& call, OpTiming* t) {
                   return RunCall(call, t, copy_threads_, buffers_);
                 },
                 [this](size_t bytes) { return AllocateHostBytes(bytes); }),
        exec_("CPU", o.workers, o.queue_capacity) {
    if (o.host_pool_bytes > 0) buffers_ = HostBufferPool::Create(o.host_pool_bytes, HostBufferPool::Malloc());
  }
  ~CpuBackend() override {
    Shutdown();
    if (buffers_ != nullptr) buffers_->Release();  // buffers still out keep it until they return
  }

  std::string name() const override { return "cpu"; }
  std::string device() const override { return "cpu"; }

  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override {
    size_t in[3];
    InputBytes(call, in);
    const size_t host = in[0] + in[1] + in[2] + call.output_bytes;
    const bool here = host <= run_here_bytes_;
    batcher_.Submit(exec_, call, enqueued_ns, std::move(done), here);
  }

  HostBytes AllocateHostBytes(size_t bytes) override {
    return PooledOrMalloced(buffers_, bytes);
  }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    std::unique_ptr<uint8_t[]> mem(new (std::nothrow) uint8_t[bytes == 0 ? 1 : bytes]);
    if (!mem) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the CPU backend could not allocate ", bytes, " bytes"));
    }
    return std::unique_ptr<Buffer>(new HostBuffer(std::move(mem), bytes));
  }

  void SubmitWrite(Buffer* dst, size_t offset, const void* src, size_t bytes, int64_t enqueued_ns,
                   OpDone done) override {
    if (!dst->Contains(offset, bytes)) {
      done(absl::InvalidArgumentError("write past the end of the tensor"), OpTiming{});
      return;
    }
    exec_.Run(enqueued_ns, std::move(done), [=](int, OpTiming* t) {
      const int64_t start = SteadyNowNs();
      std::memcpy(static_cast<uint8_t*>(dst->data()) + offset, src, bytes);
      t->copy_in_us = (SteadyNowNs() - start) / 1e3;
      return absl::OkStatus();
    }, /*continuation=*/offset > 0);
  }

  void SubmitRead(const Buffer* src, size_t offset, void* dst, size_t bytes, int64_t enqueued_ns,
                  OpDone done) override {
    if (!src->Contains(offset, bytes)) {
      done(absl::InvalidArgumentError("read past the end of the tensor"), OpTiming{});
      return;
    }
    exec_.Run(enqueued_ns, std::move(done), [=](int, OpTiming* t) {
      const int64_t start = SteadyNowNs();
      std::memcpy(dst, static_cast<const uint8_t*>(src->data()) + offset,
                  bytes);
      t->copy_out_us = (SteadyNowNs() - start) / 1e3;
      return absl::OkStatus();
    }, /*continuation=*/offset > 0);
  }

  BackendStats stats() const override {
    BackendStats s;
    exec_.FillStats(&s);
    batcher_.FillStats(&s);
    return s;
  }

  void Shutdown() override { exec_.Shutdown(); }

 private:
  class HostBuffer final : public Buffer {
   public:
    HostBuffer(std::unique_ptr<uint8_t[]> mem, size_t size) : mem_(std::move(mem)), size_(size) {}
    void* data() const override { return mem_.get(); }
    size_t size() const override { return size_; }

   private:
    std::unique_ptr<uint8_t[]> mem_;
    size_t size_;
  };

  const size_t run_here_bytes_;
  const int copy_threads_;
  HostBufferPool* buffers_ = nullptr;  // released (not deleted) at destruction: host_pool.h
  Batcher batcher_;  // before exec_: outlives the jobs that reach it
  QueuedExecutor exec_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace fusebox
