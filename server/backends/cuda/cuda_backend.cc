// The CUDA backend, built as the module libfusebox_cuda_backend.so (see
// server/backends/cuda/cuda_backend.h for why a module). Exports fusebox_create_cuda_backend
// and nothing else.
//
// A call runs on one worker of the QueuedExecutor; worker i owns StreamWorker i (a
// stream, pinned staging, events, a cuBLASLt runner). On that thread:
//   allocate device memory for the call from a memory pool (stream-ordered,
//   the pool keeps what it has: no cudaMalloc after warm-up), or for a call of
//   up to 1 MiB use the worker's own scratch -> record start
//   -> host -> pinned -> device, chunked and pipelined -> record in -> kernel
//   gate -> record go -> kernel -> record kernel -> open the gate -> device ->
//   pinned -> host, pipelined -> record out -> free to the pool
//   (stream-ordered; not the scratch) -> done(status, timing).
// The worker blocks on its own stream; gRPC threads never do (Check only
// looks at the call, Submit only queues). Calls on different workers use
// different streams and overlap.
//
// Resident memory (the tensor store's) is allocated and freed on gRPC threads,
// so neither may wait for the GPU. Allocate takes a block from the pool on the
// pool stream and records the pool's `allocated` event after it; before its
// next call or copy that touches resident memory, a worker makes its stream
// wait for that event (OrderAfterAllocations). A stream-ordered allocation is
// only valid in its stream's order (the pool may hand out a block whose free
// is still queued), and this event is that order, kept without a host wait.
// A DeviceBuffer goes back to the pool with a stream-ordered free on the pool
// stream, not waited for: the store drops a buffer only after every call that
// used it has answered, and a call answers only after its stream has
// synchronised, so no device work can still touch the block.
// Timing: copy_in/launch/kernel/copy_out from cudaEventElapsedTime between
// those events (launch = in -> go, the host's launch work behind the gate;
// copy_out adds the host's last pinned -> destination copies, which follow
// the last event), queue_us and total_us from the steady clock.
//
// Errors never abort: out of device memory is RESOURCE_EXHAUSTED (the pool is
// trimmed and the allocation retried once first); other CUDA / cuBLASLt
// errors are INTERNAL etc. with the library's message. An error that leaves
// the CUDA context unusable (illegal address, device lost, ...) marks the
// backend broken: that call fails INTERNAL, every later one UNAVAILABLE.
//
// Shared memory (RegisterHostMemory, OpenIpcMemory): a client's POSIX shared memory is pinned
// with cudaHostRegister and a client's exported device memory opened with cudaIpcOpenMemHandle;
// both ranges are remembered (DirectRanges), and a copy whose host side lies in one is a
// single cudaMemcpyAsync (DMA straight from or to the client's pages, or device to device)
// instead of the staged, chunked path that pageable memory needs.
#include <cuda.h>  // types of the driver API entry point below (no link to libcuda)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"
#include "server/backends/cuda/pinned_pool.h"
#include "server/backends/cuda/stream_worker.h"
#include "server/backends/cuda/cuda_backend.h"
#include "server/exec/batcher.h"
#include "server/exec/queued_executor.h"

#define FUSEBOX_EXPORT __attribute__((visibility("default")))

namespace fusebox::cuda_backend {
namespace {

constexpr size_t kAlign = 256;
constexpr int64_t kStatsRefreshNs = 100'000'000;

size_t RoundUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Errors after which the context is unusable: every later CUDA call fails.
bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorContextIsDestroyed:
    case cudaErrorCudartUnloading:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

// The memory pool and the stream the tensor store allocates on. Shared by the
// backend and every DeviceBuffer, so buffers may outlive the backend. Destroying
// the stream, event and pool with work still queued is safe: CUDA releases them
// once that work is done.
struct Pool {
  int device = 0;
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;
  // Recorded on `stream` after each resident allocation; `allocations` counts them, so a
  // worker waits for the event only when there is a new one. Both change under `mu`, which
  // is held for host calls only (never a wait for the device).
  cudaEvent_t allocated = nullptr;
  std::mutex mu;
  std::atomic<uint64_t> allocations{0};
  ~Pool() {
    cudaSetDevice(device);
    if (allocated) cudaEventDestroy(allocated);
    if (stream) cudaStreamDestroy(stream);
    if (pool) cudaMemPoolDestroy(pool);
    cudaGetLastError();
  }
};

// Address ranges a copy may move with one cudaMemcpyAsync: host memory pinned by
// RegisterHostMemory and device memory opened by OpenIpcMemory. Shared with their tokens and
// buffers, which remove their range before they undo the pinning or the mapping.
struct DirectRanges {
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> by_begin;  // begin -> end
  void Add(const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    by_begin[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + n;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu);
    by_begin.erase(reinterpret_cast<uintptr_t>(p));
  }
  // Whether [p, p + n) lies within one range.
  bool Contains(const void* p, size_t n) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_begin.upper_bound(a);
    if (it == by_begin.begin()) return false;
    --it;
    return a >= it->first && n <= it->second - a;
  }
};

// Device memory another process exported (cudaIpcOpenMemHandle), closed when dropped: the
// registry drops it only after every call that used it has answered.
class IpcBuffer final : public Buffer {
 public:
  IpcBuffer(void* p, size_t size, int device, std::shared_ptr<DirectRanges> ranges)
      : p_(p), size_(size), device_(device), ranges_(std::move(ranges)) {
    ranges_->Add(p_, size_);
  }
  ~IpcBuffer() override {
    ranges_->Remove(p_);
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(p_);
    cudaGetLastError();
  }
  void* data() const override { return p_; }
  size_t size() const override { return size_; }

 private:
  void* p_;
  size_t size_;
  int device_;
  std::shared_ptr<DirectRanges> ranges_;
};

// Device memory for the tensor store, from the pool.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(void* p, size_t size, std::shared_ptr<Pool> pool)
      : p_(p), size_(size), pool_(std::move(pool)) {}
  ~DeviceBuffer() override {
    // Not waited for: every call that used the buffer has answered, so its work on the
    // device is done (the top of this file says why), and later allocations are ordered
    // after this free by the pool.
    cudaSetDevice(pool_->device);
    if (p_) cudaFreeAsync(p_, pool_->stream);
    cudaGetLastError();
  }
  void* data() const override { return p_; }
  size_t size() const override { return size_; }

 private:
  void* p_;
  size_t size_;
  std::shared_ptr<Pool> pool_;
};

// Byte sizes of a call's operands, result and kernel workspace (softmax's split rows).
struct Sizes {
  size_t in[3] = {0, 0, 0};
  size_t out = 0;
  size_t workspace = 0;
};

absl::StatusOr<Sizes> SizesOf(const OpCall& c) {
  const size_t es = ElementSize(c.dtype);
  Sizes s;
  switch (c.op) {
    case Op::kGelu:
    case Op::kSoftmax:
    case Op::kRowSum:
      if (c.rows < 0 || c.cols < 0) return absl::InvalidArgumentError("negative shape");
      if (c.op != Op::kGelu && !cuda::RowLengthSupported(c.dtype, c.cols)) {
        const int64_t w = 16 / static_cast<int64_t>(ElementSize(c.dtype));
        return absl::InvalidArgumentError(absl::StrCat(
            OpName(c.op), " on the GPU: rows of ", c.cols, " elements are too long (at most ",
            cuda::kMaxRowAccesses, ", or ", cuda::kMaxRowAccesses * w, " in a multiple of ", w,
            ")"));
      }
      s.in[0] = static_cast<size_t>(c.rows) * c.cols * es;
      s.out = c.op == Op::kRowSum ? static_cast<size_t>(c.rows) * sizeof(float) : s.in[0];
      if (c.op == Op::kSoftmax) s.workspace = cuda::SoftmaxWorkspaceBytes(c.dtype, c.rows, c.cols);
      if (c.op == Op::kRowSum) s.workspace = cuda::RowSumWorkspaceBytes(c.dtype, c.rows, c.cols);
      break;
    case Op::kMatmulRelu:
      if (c.m < 0 || c.n < 0 || c.k < 0) return absl::InvalidArgumentError("negative shape");
      s.in[0] = static_cast<size_t>(c.m) * c.k * es;
      s.in[1] = static_cast<size_t>(c.k) * c.n * es;
      s.in[2] = c.inputs[2] ? static_cast<size_t>(c.n) * es : 0;
      s.out = static_cast<size_t>(c.m) * c.n * es;
      break;
  }
  if (c.output_bytes != s.out) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(c.op), ": output buffer holds ",
                                                   c.output_bytes, " bytes, the result ", s.out));
  }
  for (int i = 0; i < 3; ++i) {
    if (s.in[i] > 0 && c.inputs[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(OpName(c.op), ": input ", i, " is missing"));
    }
  }
  if (s.out > 0 && c.output == nullptr) return absl::InvalidArgumentError("output is missing");
  return s;
}

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& o);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device() const override { return device_name_; }
  absl::Status Check(const OpCall& call) const override;
  void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) override;
  BackendStats stats() const override;
  // Pinned from the pinned pool (its copies are one DMA); malloc once the pool's cap is reached.
  HostBytes AllocateHostBytes(size_t bytes) override {
    return pinned_ != nullptr && !broken_.load() ? pinned_->Get(bytes)
                                                 : MallocHostBytes(bytes);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override;
  void SubmitWrite(Buffer* dst, size_t offset, const void* src, size_t bytes, int64_t enqueued_ns,
                   OpDone done) override;
  void SubmitRead(const Buffer* src, size_t offset, void* dst, size_t bytes, int64_t enqueued_ns,
                  OpDone done) override;
  void Shutdown() override;
  absl::StatusOr<std::shared_ptr<void>> RegisterHostMemory(void* data, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> OpenIpcMemory(const std::string& handle, int device,
                                                        size_t bytes) override;

 private:
  explicit CudaBackend(const CudaBackendOptions& o) : options_(o) {}

  // Queues `work` (which fills copy/kernel times) on the executor, wrapped with the
  // broken-device check and the device selection. `continuation`: a
  // transfer's later piece, queued past a full queue (Backend::SubmitWrite).
  template <typename Work>
  void Enqueue(int64_t enqueued_ns, OpDone done, Work work, bool continuation = false,
               bool here = false);

  absl::Status RunCall(StreamWorker& w, const OpCall& call, OpTiming* t);
  absl::Status RunWrite(StreamWorker& w, void* dst, const void* src, size_t bytes, OpTiming* t);
  absl::Status RunRead(StreamWorker& w, void* dst, const void* src, size_t bytes, OpTiming* t);
  absl::Status Launch(StreamWorker& w, const OpCall& call, const void* const in[3], void* out,
                      cuda::Workspace ws);

  // Stream-ordered allocation from the pool; trims and retries once on OOM. `may_wait`:
  // before the retry, wait for the frees queued on `stream` and on the pool stream (a
  // worker may; a gRPC thread in Allocate may not).
  absl::Status PoolAlloc(size_t bytes, cudaStream_t stream, void** p, bool may_wait);
  // Makes what is enqueued next on w's stream wait for every resident allocation made
  // before this call (the top of this file says why).
  cudaError_t OrderAfterAllocations(StreamWorker& w);
  // Converts an error met while running on `w`; notices a broken context.
  absl::Status Fail(cudaError_t e, const char* what, StreamWorker* w);
  // Fail, then waits for what is already queued on w's stream: the caller may give the tensor
  // (or the staging) back as soon as it has the status, and no copy may still write to it.
  absl::Status FailAndDrain(cudaError_t e, const char* what, StreamWorker& w);
  absl::Status Broken() const;

  const CudaBackendOptions options_;
  std::string device_name_;
  std::shared_ptr<Pool> pool_;
  const std::shared_ptr<DirectRanges> direct_ = std::make_shared<DirectRanges>();
  HostBufferPool* pinned_ = nullptr;  // released (not deleted) at destruction: host_pool.h
  std::vector<std::unique_ptr<StreamWorker>> workers_;
  std::unique_ptr<Batcher> batcher_;  // before exec_: outlives the jobs that reach it
  std::unique_ptr<QueuedExecutor> exec_;

  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  std::string broken_reason_;          // guarded by mu_
  mutable int64_t mem_checked_ns_ = 0;  // guarded by mu_
  mutable int64_t mem_free_ = 0, mem_total_ = 0;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& o) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(o));
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) cudaGetLastError();
    return cuda::CudaStatus(e, what);
  };
  int count = 0;
  if (absl::Status s = check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s.ok()) return s;
  if (count == 0) return absl::UnavailableError("no CUDA device");
  if (o.device < 0 || o.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", o.device, " does not exist (", count, " found)"));
  }
  if (o.streams < 1 || o.streams > kMaxCudaStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams must be 1..", kMaxCudaStreams, ", not ", o.streams));
  }
  if (absl::Status s = check(cudaSetDevice(o.device), "cudaSetDevice"); !s.ok()) return s;
  cudaDeviceProp prop;
  if (absl::Status s = check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  b->device_name_ = absl::StrCat("cuda:", o.device, " ", prop.name);

  // Our own pool (the default pool's settings belong to everyone in the
  // process): device memory, kept when freed so that steady-state calls never
  // reach the driver's allocator.
  b->pool_ = std::make_shared<Pool>();
  b->pool_->device = o.device;
  cudaMemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = o.device;
  if (absl::Status s = check(cudaMemPoolCreate(&b->pool_->pool, &props), "cudaMemPoolCreate"); !s.ok()) {
    return s;
  }
  uint64_t keep = UINT64_MAX;
  if (absl::Status s = check(cudaMemPoolSetAttribute(b->pool_->pool, cudaMemPoolAttrReleaseThreshold, &keep),
                             "cudaMemPoolSetAttribute");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check(cudaStreamCreateWithFlags(&b->pool_->stream, cudaStreamNonBlocking),
                             "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check(cudaEventCreateWithFlags(&b->pool_->allocated, cudaEventDisableTiming),
                             "cudaEventCreate");
      !s.ok()) {
    return s;
  }
  auto cache = cuda::NewMatmulAlgoCache();
  for (int i = 0; i < o.streams; ++i) {
    auto w = StreamWorker::Create(o.staging_bytes, o.copy_threads, cache, b->pool_->pool);
    if (!w.ok()) return w.status();
    b->workers_.push_back(std::move(*w));
  }
  b->exec_ = std::make_unique<QueuedExecutor>("CUDA", o.streams, o.queue_capacity);
  // A call, or a batch of small ones packed into one (batcher.h): its pieces go in with one
  // staged CopyIn, one kernel runs over every row, and its result comes back into one pinned
  // buffer (one DMA) that the batcher splits into each call's output.
  CudaBackend* self = b.get();
  b->batcher_ = std::make_unique<Batcher>(
      o.batch,
      [self](int worker, const OpCall& call, OpTiming* t) -> absl::Status {
        if (self->broken_.load()) return self->Broken();
        if (cudaError_t e = cudaSetDevice(self->options_.device); e != cudaSuccess) {
          return self->Fail(e, "cudaSetDevice", nullptr);
        }
        return self->RunCall(*self->workers_[worker], call, t);
      },
      [self](size_t bytes) { return self->AllocateHostBytes(bytes); });
  std::shared_ptr<DirectRanges> ranges = b->direct_;
  b->pinned_ = MakePinnedPool(
      o.device, 4 * o.staging_bytes, [ranges](void* p, size_t n) { ranges->Add(p, n); },
      [ranges](void* p) { ranges->Remove(p); });
  return b;
}

CudaBackend::~CudaBackend() {
  Shutdown();
  if (pinned_ != nullptr) pinned_->Release();  // buffers still out keep it until they return
  // Workers exist only once their device was set up; a Create that failed before (a device
  // ordinal past the last) must not leave this thread a stale error from cudaSetDevice.
  if (!workers_.empty() && cudaSetDevice(options_.device) != cudaSuccess) cudaGetLastError();
  workers_.clear();  // the pool goes with the last DeviceBuffer
}

void CudaBackend::Shutdown() {
  if (exec_) exec_->Shutdown();
}

absl::Status CudaBackend::Broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::UnavailableError(absl::StrCat(
      device_name_, " is unusable after an earlier error (", broken_reason_,
      "); restart the server or use --backend=cpu"));
}

absl::Status CudaBackend::Fail(cudaError_t e, const char* what, StreamWorker* w) {
  cudaGetLastError();  // clears it unless sticky
  bool sticky = IsSticky(e);
  if (!sticky && w != nullptr) {
    // A context that is gone fails even a query of an idle stream.
    const cudaError_t probe = cudaStreamQuery(w->stream());
    sticky = probe != cudaSuccess && probe != cudaErrorNotReady && IsSticky(probe);
  }
  absl::Status s = cuda::CudaStatus(e, what);
  if (sticky) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.exchange(true)) broken_reason_ = std::string(s.message());
  }
  return s;
}

absl::Status CudaBackend::FailAndDrain(cudaError_t e, const char* what, StreamWorker& w) {
  absl::Status s = Fail(e, what, &w);
  if (!broken_.load() && cudaStreamSynchronize(w.stream()) != cudaSuccess) cudaGetLastError();
  return s;
}

absl::Status CudaBackend::PoolAlloc(size_t bytes, cudaStream_t stream, void** p, bool may_wait) {
  *p = nullptr;
  if (bytes == 0) return absl::OkStatus();
  cudaError_t e = cudaMallocFromPoolAsync(p, bytes, pool_->pool, stream);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    // Give back what the pool holds unused, then try once more. Without the wait, blocks
    // whose free is still queued on another stream stay in the pool; the pool stream's own
    // frees need no wait to be reused on it.
    if (may_wait) {
      cudaStreamSynchronize(stream);
      if (stream != pool_->stream) cudaStreamSynchronize(pool_->stream);
      cudaGetLastError();
    }
    cudaMemPoolTrimTo(pool_->pool, 0);
    e = cudaMallocFromPoolAsync(p, bytes, pool_->pool, stream);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of GPU memory on ", device_name_, ": this call needs ", bytes, " bytes, ",
        free_b >> 20, " MiB of ", total_b >> 20,
        " MiB are free; retry later, free resident tensors, or send smaller tensors"));
  }
  if (e != cudaSuccess) return Fail(e, "cudaMallocFromPoolAsync", nullptr);
  return absl::OkStatus();
}

template <typename Work>
void CudaBackend::Enqueue(int64_t enqueued_ns, OpDone done, Work work, bool continuation,
                          bool here) {
  if (broken_.load()) {
    done(Broken(), OpTiming{});
    return;
  }
  exec_->Run(enqueued_ns, std::move(done), [this, work](int worker, OpTiming* t) {
    if (broken_.load()) return Broken();
    if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
      return Fail(e, "cudaSetDevice", nullptr);
    }
    return work(*workers_[worker], t);
  }, continuation, here);
}

void CudaBackend::Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) {
  const absl::StatusOr<Sizes> sizes = SizesOf(call);  // what Check asks
  if (!sizes.ok()) {  // refused before it waits in the queue
    done(sizes.status(), OpTiming{});
    return;
  }
  // Every operand's bytes, resident ones included: they bound the work the receiving thread
  // would wait for when the call runs there (a resident 8192^3 matmul moves no host byte).
  size_t bytes = sizes->out;
  for (int i = 0; i < 3; ++i) bytes += sizes->in[i];
  if (broken_.load()) {
    done(Broken(), OpTiming{});
    return;
  }
  // The batcher asks NotAbandoned; RunOne (Create) checks for a broken device and sets it.
  batcher_->Submit(*exec_, call, enqueued_ns, std::move(done),
                   /*here=*/bytes <= options_.run_here_bytes);
}

void CudaBackend::SubmitWrite(Buffer* dst, size_t offset, const void* src, size_t bytes,
                              int64_t enqueued_ns, OpDone done) {
  if (!dst->Contains(offset, bytes)) {
    done(absl::InvalidArgumentError("write past the end of the tensor"), OpTiming{});
    return;
  }
  void* d = static_cast<uint8_t*>(dst->data()) + offset;
  Enqueue(
      enqueued_ns, std::move(done),
      [this, d, src, bytes](StreamWorker& w, OpTiming* t) { return RunWrite(w, d, src, bytes, t); },
      /*continuation=*/offset > 0);
}

void CudaBackend::SubmitRead(const Buffer* src, size_t offset, void* dst, size_t bytes,
                             int64_t enqueued_ns, OpDone done) {
  if (!src->Contains(offset, bytes)) {
    done(absl::InvalidArgumentError("read past the end of the tensor"), OpTiming{});
    return;
  }
  const void* s = static_cast<const uint8_t*>(src->data()) + offset;
  Enqueue(
      enqueued_ns, std::move(done),
      [this, dst, s, bytes](StreamWorker& w, OpTiming* t) { return RunRead(w, dst, s, bytes, t); },
      /*continuation=*/offset > 0);
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaBackend::Allocate(size_t bytes) {
  if (broken_.load()) return Broken();
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return Fail(e, "cudaSetDevice", nullptr);
  }
  // Out of memory shows here, at once: the pool reserves device memory when asked, not when
  // the stream reaches the allocation. Nothing below waits for the device.
  std::lock_guard<std::mutex> lock(pool_->mu);
  void* p = nullptr;
  if (absl::Status s = PoolAlloc(std::max<size_t>(bytes, 1), pool_->stream, &p, /*may_wait=*/false);
      !s.ok()) {
    return s;
  }
  // The buffer owns the block from here, so an error below gives it back.
  std::unique_ptr<Buffer> buffer(new DeviceBuffer(p, bytes, pool_));
  if (cudaError_t e = cudaEventRecord(pool_->allocated, pool_->stream); e != cudaSuccess) {
    return Fail(e, "cudaEventRecord", nullptr);
  }
  pool_->allocations.fetch_add(1, std::memory_order_release);
  return buffer;
}

cudaError_t CudaBackend::OrderAfterAllocations(StreamWorker& w) {
  if (pool_->allocations.load(std::memory_order_acquire) == w.allocations_seen) {
    return cudaSuccess;  // none since this stream last waited
  }
  std::lock_guard<std::mutex> lock(pool_->mu);
  // Under the lock the count and the event's latest record agree.
  const uint64_t made = pool_->allocations.load(std::memory_order_relaxed);
  const cudaError_t e = cudaStreamWaitEvent(w.stream(), pool_->allocated, 0);
  if (e == cudaSuccess) w.allocations_seen = made;
  return e;
}

absl::StatusOr<std::shared_ptr<void>> CudaBackend::RegisterHostMemory(void* data, size_t bytes) {
  if (broken_.load()) return Broken();
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return Fail(e, "cudaSetDevice", nullptr);
  }
  // Portable: every context may DMA from it. A mapping the server may only read is pinned
  // read-only.
  cudaError_t e = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    e = cudaHostRegister(data, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaHostRegister of shared memory failed: ", cudaGetErrorString(e)));
  }
  direct_->Add(data, bytes);
  std::shared_ptr<DirectRanges> ranges = direct_;
  const int device = options_.device;
  return std::shared_ptr<void>(data, [ranges, device](void* p) {
    ranges->Remove(p);
    cudaSetDevice(device);
    cudaHostUnregister(p);
    cudaGetLastError();
  });
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaBackend::OpenIpcMemory(const std::string& handle,
                                                                   int device, size_t bytes) {
  if (broken_.load()) return Broken();
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda.ipc_handle must be the ",
                                                   sizeof(cudaIpcMemHandle_t),
                                                   " bytes of a cudaIpcMemHandle_t; got ",
                                                   handle.size()));
  }
  if (device != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda.device is ", device, " but this server runs on device ", options_.device,
        "; export memory of that device"));
  }
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return Fail(e, "cudaSetDevice", nullptr);
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cudaIpcOpenMemHandle failed: ", cudaGetErrorString(e),
        " (a handle from cudaIpcGetMemHandle of a live allocation, in a process on this node)"));
  }
  std::unique_ptr<Buffer> buffer(new IpcBuffer(p, bytes, options_.device, direct_));
  // The size is the client's word: a kernel reading past the allocation would fault and break
  // the context for every caller, so it is checked against the allocation's own extent.
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return absl::InternalError("cannot check the IPC allocation's size (cuMemGetAddressRange)");
  }
  CUdeviceptr base = 0;
  size_t extent = 0;
  if (reinterpret_cast<GetRange>(fn)(&base, &extent, reinterpret_cast<CUdeviceptr>(p)) !=
      CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed on the opened IPC memory");
  }
  const uintptr_t end = static_cast<uintptr_t>(base) + extent;
  if (bytes > end - reinterpret_cast<uintptr_t>(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda.size is ", bytes, " but the exported allocation has ",
        end - reinterpret_cast<uintptr_t>(p), " bytes"));
  }
  return buffer;
}

BackendStats CudaBackend::stats() const {
  BackendStats s;
  if (exec_) exec_->FillStats(&s);
  if (batcher_) batcher_->FillStats(&s);
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = SteadyNowNs();
  if (!broken_.load() && now - mem_checked_ns_ > kStatsRefreshNs) {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(options_.device) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      mem_free_ = static_cast<int64_t>(free_b);
      mem_total_ = static_cast<int64_t>(total_b);
    } else {
      cudaGetLastError();
    }
    mem_checked_ns_ = now;
  }
  s.device_memory_total = mem_total_;
  s.device_memory_used = mem_total_ - mem_free_;
  return s;
}

float Elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? ms : 0.f;
}

// The phases of a call that has ended, from its worker's events; tail_ns is host time after
// the last event (the copy of the result out of staging).
void ReadPhases(StreamWorker& w, int64_t tail_ns, OpTiming* t) {
  t->copy_in_us = 1e3 * Elapsed(w.ev_start(), w.ev_in());
  t->launch_us = 1e3 * Elapsed(w.ev_in(), w.ev_go());
  t->kernel_us = 1e3 * Elapsed(w.ev_go(), w.ev_kernel());
  t->copy_out_us = 1e3 * Elapsed(w.ev_kernel(), w.ev_out()) + tail_ns / 1e3;
}

// GeLU, softmax or row sum of c's shape from `in` to `out` on s.
cudaError_t LaunchMemoryBound(const OpCall& c, const void* in, void* out, cuda::Workspace ws,
                              cudaStream_t s) {
  switch (c.op) {
    case Op::kGelu: return cuda::LaunchGelu(c.dtype, in, out, c.rows * c.cols, s);
    case Op::kSoftmax: return cuda::LaunchSoftmax(c.dtype, in, out, c.rows, c.cols, s, ws);
    case Op::kRowSum:
      return cuda::LaunchRowSum(c.dtype, in, static_cast<float*>(out), c.rows, c.cols, s, ws);
    case Op::kMatmulRelu: break;
  }
  return cudaErrorInvalidValue;
}

absl::Status CudaBackend::Launch(StreamWorker& w, const OpCall& c, const void* const in[3],
                                 void* out, cuda::Workspace ws) {
  cudaError_t e = cudaSuccess;
  switch (c.op) {
    case Op::kGelu:
    case Op::kSoftmax:
    case Op::kRowSum:
      e = LaunchMemoryBound(c, in[0], out, ws, w.stream());
      break;
    case Op::kMatmulRelu: {
      cuda::MatmulArgs args;
      args.dtype = c.dtype;
      args.m = c.m;
      args.n = c.n;
      args.k = c.k;
      args.a = in[0];
      args.b = in[1];
      args.bias = in[2];
      args.out = out;
      args.allow_tf32 = c.allow_tf32;
      const MatmulImpl impl =
          c.matmul_impl == MatmulImpl::kDefault ? options_.default_matmul : c.matmul_impl;
      if (impl == MatmulImpl::kTiled) {
        e = cuda::LaunchMatmulReluTiled(args, w.stream());
        break;
      }
      absl::Status s = w.cublaslt().Run(args, w.stream());
      if (!s.ok()) {
        // A failed launch may have left a CUDA error behind: cleared here (the next launch on
        // this thread would report it), and classified unless the status already says why.
        const cudaError_t pending = cudaGetLastError();
        if (pending != cudaSuccess && !absl::IsUnimplemented(s) && !absl::IsInvalidArgument(s)) {
          return Fail(pending, "cuBLASLt matmul", &w);
        }
      }
      return s;
    }
  }
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, OpName(c.op), &w);
}

// Everything SizesOf refuses depends on the call alone, so it is all asked before queueing.
absl::Status CudaBackend::Check(const OpCall& call) const { return SizesOf(call).status(); }

absl::Status CudaBackend::RunCall(StreamWorker& w, const OpCall& c, OpTiming* t) {
  absl::StatusOr<Sizes> sizes = SizesOf(c);
  if (!sizes.ok()) return sizes.status();
  const cudaStream_t st = w.stream();
  if (c.output_resident || c.input_resident[0] || c.input_resident[1] || c.input_resident[2]) {
    if (cudaError_t e = OrderAfterAllocations(w); e != cudaSuccess) {
      return Fail(e, "cudaStreamWaitEvent", &w);
    }
  }

  // One block holds every operand that is not already resident, and the workspace: the
  // worker's scratch when it fits, else a pool allocation (freed, stream-ordered, at the end).
  size_t offsets[5] = {0, 0, 0, 0, 0}, total = 0;
  for (int i = 0; i < 3; ++i) {
    if (!c.input_resident[i] && sizes->in[i] > 0) {
      offsets[i] = total;
      total += RoundUp(sizes->in[i]);
    }
  }
  if (!c.output_resident && sizes->out > 0) {
    offsets[3] = total;
    total += RoundUp(sizes->out);
  }
  offsets[4] = total;
  total += RoundUp(sizes->workspace);
  const bool pooled = total > StreamWorker::kScratchBytes;
  void* block = total == 0 ? nullptr : w.scratch();
  if (pooled) {
    if (absl::Status s = PoolAlloc(total, st, &block, /*may_wait=*/true); !s.ok()) return s;
  }
  auto at = [block](size_t off) { return static_cast<void*>(static_cast<uint8_t*>(block) + off); };

  const void* dev_in[3] = {nullptr, nullptr, nullptr};
  HostSpan spans[3];
  int nspans = 0;
  for (int i = 0; i < 3; ++i) {
    if (sizes->in[i] == 0) continue;
    if (c.input_resident[i]) {
      dev_in[i] = c.inputs[i];
    } else {
      dev_in[i] = at(offsets[i]);
      spans[nspans++] = HostSpan{c.inputs[i], at(offsets[i]), sizes->in[i], c.input_pieces[i]};
    }
  }
  // Pinned shared memory is copied by one DMA each way; pageable memory goes through staging.
  HostSpan direct_in[3];
  int ndirect = 0;
  for (int i = 0; i < nspans;) {
    if (spans[i].pieces == nullptr && direct_->Contains(spans[i].host, spans[i].bytes)) {
      direct_in[ndirect++] = spans[i];
      spans[i] = spans[--nspans];
    } else {
      ++i;
    }
  }
  const bool direct_out =
      !c.output_resident && sizes->out > 0 && direct_->Contains(c.output, sizes->out);
  void* dev_out = c.output_resident ? c.output : (sizes->out > 0 ? at(offsets[3]) : nullptr);
  const cuda::Workspace ws{sizes->workspace > 0 ? at(offsets[4]) : nullptr, sizes->workspace};

  // The end of every call: the pooled block freed, the stream drained (nothing of this call may
  // still run when the next one reuses the staging), then its phases read from the events.
  auto end_call = [&](absl::Status status, int64_t tail_ns) {
    if (!broken_.load()) {
      if (pooled) cudaFreeAsync(block, st);
      if (cudaError_t se = cudaStreamSynchronize(st); se != cudaSuccess && status.ok()) {
        status = Fail(se, "cudaStreamSynchronize", &w);
      }
    }
    if (status.ok()) ReadPhases(w, tail_ns, t);
    return status;
  };

  // A small inline GeLU, softmax or row sum of a shape seen before: one CUDA graph
  // (StreamWorker::RunAsGraph), when --cuda_graphs is on.
  if (options_.cuda_graphs && c.op != Op::kMatmulRelu && !pooled && nspans == 1 && ndirect == 0 &&
      !direct_out && !c.output_resident && sizes->out > 0) {
    bool ran = false;
    int64_t graph_tail_ns = 0;
    const StreamWorker::GraphKey key{static_cast<int>(c.op), static_cast<int>(c.dtype), c.rows, c.cols};
    const cudaError_t e = w.RunAsGraph(
        key, spans[0], HostSpan{c.output, dev_out, sizes->out},
        [&] { return LaunchMemoryBound(c, dev_in[0], dev_out, ws, st); }, &ran, &graph_tail_ns);
    if (e != cudaSuccess || ran) {
      return end_call(e == cudaSuccess ? absl::OkStatus() : Fail(e, "a small call's CUDA graph", &w),
                      graph_tail_ns);
    }
  }

  // cuBLASLt's algorithm is chosen now, on a cache miss, rather than between
  // the copy-in and the kernel where it would count as kernel time: the
  // heuristic, and where its 32 MiB and 1 MiB picks differ a one-time timing
  // of both on this stream and these buffers (before ev_start; the inputs are
  // not copied yet, which the timing does not need, and the output is
  // overwritten by the real launch). matmul.h, LtAlgoPolicy.
  if (c.op == Op::kMatmulRelu) {
    const MatmulImpl impl =
        c.matmul_impl == MatmulImpl::kDefault ? options_.default_matmul : c.matmul_impl;
    if (impl != MatmulImpl::kTiled) {
      cuda::MatmulArgs args;
      args.dtype = c.dtype;
      args.m = c.m; args.n = c.n; args.k = c.k;
      args.a = dev_in[0]; args.b = dev_in[1]; args.bias = dev_in[2]; args.out = dev_out;
      args.allow_tf32 = c.allow_tf32;
      if (absl::Status s = w.cublaslt().Prepare(args, st); !s.ok()) {
        if (pooled) cudaFreeAsync(block, st);
        // Whatever Prepare left queued ends before the caller may free the operands.
        if (!broken_.load() && cudaStreamSynchronize(st) != cudaSuccess) cudaGetLastError();
        return s;
      }
    }
  }

  absl::Status status;
  int64_t tail_ns = 0;
  cudaError_t e = cudaEventRecord(w.ev_start(), st);
  for (int i = 0; i < ndirect && e == cudaSuccess; ++i) {
    e = cudaMemcpyAsync(direct_in[i].device, direct_in[i].host, direct_in[i].bytes,
                        cudaMemcpyHostToDevice, st);
  }
  if (e == cudaSuccess) e = w.CopyIn(spans, nspans);
  if (e == cudaSuccess) e = cudaEventRecord(w.ev_in(), st);
  // `go`, the kernel and `kernel` are enqueued behind the gate, then released
  // together (stream_worker.h says why).
  // Without the gate (--kernel_gate=false) kernel_us includes the launch's latency.
  const bool gated = options_.kernel_gate && e == cudaSuccess &&
                     (e = w.HoldKernelGate()) == cudaSuccess;
  if (e == cudaSuccess) {
    e = cudaEventRecord(w.ev_go(), st);
    if (e == cudaSuccess) {
      status = Launch(w, c, dev_in, dev_out, ws);
      if (status.ok()) e = cudaEventRecord(w.ev_kernel(), st);
    }
  }
  if (gated) w.ReleaseKernelGate();
  if (e != cudaSuccess) {
    status = Fail(e, "copy to the GPU or kernel launch", &w);
  } else if (status.ok()) {
    if (c.output_resident || sizes->out == 0 || direct_out) {
      if (direct_out) e = cudaMemcpyAsync(c.output, dev_out, sizes->out, cudaMemcpyDeviceToHost, st);
      if (e == cudaSuccess) e = cudaEventRecord(w.ev_out(), st);
      if (e == cudaSuccess) e = cudaEventSynchronize(w.ev_out());
    } else {
      e = w.CopyOut(HostSpan{c.output, dev_out, sizes->out}, w.ev_out(), &tail_ns);
    }
    if (e != cudaSuccess) status = Fail(e, "kernel or copy from the GPU", &w);
  }
  return end_call(std::move(status), tail_ns);
}

absl::Status CudaBackend::RunWrite(StreamWorker& w, void* dst, const void* src, size_t bytes,
                                   OpTiming* t) {
  const HostSpan span{src, dst, bytes};
  cudaError_t e = OrderAfterAllocations(w);
  if (e == cudaSuccess) e = cudaEventRecord(w.ev_start(), w.stream());
  if (e == cudaSuccess) {  // pinned shared memory or IPC device memory: one copy, any direction
    e = direct_->Contains(src, bytes)
            ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, w.stream())
            : w.CopyIn(&span, 1);
  }
  if (e == cudaSuccess) e = cudaEventRecord(w.ev_in(), w.stream());
  if (e == cudaSuccess) e = cudaStreamSynchronize(w.stream());
  if (e != cudaSuccess) return FailAndDrain(e, "copy to a resident tensor", w);
  t->copy_in_us = 1e3 * Elapsed(w.ev_start(), w.ev_in());
  return absl::OkStatus();
}

absl::Status CudaBackend::RunRead(StreamWorker& w, void* dst, const void* src, size_t bytes,
                                  OpTiming* t) {
  int64_t tail_ns = 0;
  cudaError_t e = OrderAfterAllocations(w);
  if (e == cudaSuccess) e = cudaEventRecord(w.ev_kernel(), w.stream());
  if (e == cudaSuccess) {
    if (direct_->Contains(dst, bytes)) {  // pinned memory (a reply's, shared memory): one DMA
      e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, w.stream());
      if (e == cudaSuccess) e = cudaEventRecord(w.ev_out(), w.stream());
    } else {
      e = w.CopyOut(HostSpan{dst, const_cast<void*>(src), bytes}, w.ev_out(), &tail_ns);
    }
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(w.stream());
  if (e != cudaSuccess) return FailAndDrain(e, "copy from a resident tensor", w);
  t->copy_out_us = 1e3 * Elapsed(w.ev_kernel(), w.ev_out()) + tail_ns / 1e3;
  return absl::OkStatus();
}

}  // namespace
}  // namespace fusebox::cuda_backend

extern "C" FUSEBOX_EXPORT fusebox::Backend* fusebox_create_cuda_backend(
    const fusebox::CudaBackendOptions* options, char* error, size_t error_len, int* error_code) {
  auto report = [&](absl::StatusCode code, const std::string& msg) {
    if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", msg.c_str());
    if (error_code != nullptr) *error_code = static_cast<int>(code);
  };
  try {
    const fusebox::CudaBackendOptions defaults;
    auto backend = fusebox::cuda_backend::CudaBackend::Create(options ? *options : defaults);
    if (!backend.ok()) {
      report(backend.status().code(), std::string(backend.status().message()));
      return nullptr;
    }
    return backend->release();
  } catch (const std::exception& ex) {
    report(absl::StatusCode::kInternal, std::string("CUDA backend start-up failed: ") + ex.what());
    return nullptr;
  }
}
