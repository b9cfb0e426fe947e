// StreamWorker: see stream_worker.h.
#include "server/backends/cuda/stream_worker.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/exec/backend.h"
#include "kernels/cpu/parallel_copy.h"
#include "server/backends/cuda/stream_gate.h"

namespace fusebox::cuda_backend {
namespace {

constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr int kMaxSlots = 16;
constexpr uint64_t kGateTimeoutNs = 1000000;  // 1 ms

}  // namespace

absl::StatusOr<std::unique_ptr<StreamWorker>> StreamWorker::Create(
    size_t staging_bytes, int copy_threads, std::shared_ptr<cuda::MatmulAlgoCache> algo_cache,
    cudaMemPool_t pool) {
  std::unique_ptr<StreamWorker> w(new StreamWorker());
  w->copy_threads_ = CopyThreads(copy_threads);
  staging_bytes = std::max(staging_bytes, size_t{64} << 10);
  w->slots_ = static_cast<int>(std::clamp<size_t>(staging_bytes / kChunkBytes, 2, kMaxSlots));
  w->slot_bytes_ = (staging_bytes / w->slots_) & ~size_t{255};
  const size_t total = w->slot_bytes_ * w->slots_;

  auto fail = [](cudaError_t e, const char* what) {
    cudaGetLastError();
    return cuda::CudaStatus(e, what);
  };
  cudaError_t e = cudaStreamCreateWithFlags(&w->stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) return fail(e, "cudaStreamCreate");
  if ((e = cudaMallocHost(&w->pinned_in_, total)) != cudaSuccess) return fail(e, "cudaMallocHost");
  if ((e = cudaMallocHost(&w->pinned_out_, total)) != cudaSuccess) return fail(e, "cudaMallocHost");
  if ((e = cudaMalloc(&w->scratch_, kScratchBytes)) != cudaSuccess) {
    return fail(e, "cudaMalloc (scratch)");
  }
  for (auto& ev : w->ev_) {
    if ((e = cudaEventCreate(&ev)) != cudaSuccess) return fail(e, "cudaEventCreate");
  }
  if ((e = cudaHostAlloc(reinterpret_cast<void**>(&w->gate_), sizeof(uint32_t), cudaHostAllocMapped)) !=
      cudaSuccess) {
    return fail(e, "cudaHostAlloc (gate)");
  }
  *w->gate_ = 0;
  void* gate_dev = nullptr;
  if ((e = cudaHostGetDevicePointer(&gate_dev, w->gate_, 0)) != cudaSuccess) {
    return fail(e, "cudaHostGetDevicePointer (gate)");
  }
  w->gate_dev_ = static_cast<const uint32_t*>(gate_dev);
  // One pass through the gate now loads its kernel (lazy module loading would
  // otherwise do it on the first call, inside the launch phase).
  if ((e = w->HoldKernelGate()) != cudaSuccess) return fail(e, "kernel gate");
  w->ReleaseKernelGate();
  if ((e = cudaStreamSynchronize(w->stream_)) != cudaSuccess) return fail(e, "kernel gate");
  w->in_slot_ev_.assign(w->slots_, nullptr);
  w->out_slot_ev_.assign(w->slots_, nullptr);
  for (int i = 0; i < w->slots_; ++i) {
    if ((e = cudaEventCreateWithFlags(&w->in_slot_ev_[i], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&w->out_slot_ev_[i], cudaEventDisableTiming)) != cudaSuccess) {
      return fail(e, "cudaEventCreate");
    }
  }
  auto lt = cuda::CublasLtMatmul::Create(std::move(algo_cache),
                                         cuda::CublasLtMatmul::kDefaultWorkspaceBytes,
                                         cuda::LtAlgoPolicy::kTwoPicks, pool);
  if (!lt.ok()) return lt.status();
  w->lt_ = std::move(*lt);
  return w;
}

StreamWorker::~StreamWorker() {
  lt_.reset();
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [key, g] : graphs_) if (g.exec) cudaGraphExecDestroy(g.exec);
  for (cudaEvent_t ev : in_slot_ev_) if (ev) cudaEventDestroy(ev);
  for (cudaEvent_t ev : out_slot_ev_) if (ev) cudaEventDestroy(ev);
  for (cudaEvent_t ev : ev_) if (ev) cudaEventDestroy(ev);
  if (gate_) cudaFreeHost(gate_);
  if (scratch_) cudaFree(scratch_);
  if (pinned_in_) cudaFreeHost(pinned_in_);
  if (pinned_out_) cudaFreeHost(pinned_out_);
  if (stream_) cudaStreamDestroy(stream_);
}

cudaError_t StreamWorker::HoldKernelGate() {
  return LaunchStreamGate(gate_dev_, ++gate_seq_, kGateTimeoutNs, stream_);
}

void StreamWorker::ReleaseKernelGate() { __atomic_store_n(gate_, gate_seq_, __ATOMIC_RELEASE); }

bool StreamWorker::Stage(uint8_t* pin, const HostSpan& span, size_t off, PiecePos* pos, size_t n) {
  if (span.pieces == nullptr) {
    ParallelCopy(pin, static_cast<const uint8_t*>(span.host) + off, n, copy_threads_);
    return true;
  }
  return GatherPieces(*span.pieces, pos, pin, n, copy_threads_);
}

cudaError_t StreamWorker::CopyIn(const HostSpan* spans, int count) {
  int slot = 0;
  for (int s = 0; s < count; ++s) {
    auto* dst = static_cast<uint8_t*>(spans[s].device);
    PiecePos pos;  // the next source byte, when the source is in pieces
    for (size_t off = 0; off < spans[s].bytes; off += slot_bytes_) {
      const size_t n = std::min(slot_bytes_, spans[s].bytes - off);
      // The slot's previous DMA must be done before the CPU overwrites it
      // (a never-recorded event counts as done).
      cudaError_t e = cudaEventSynchronize(in_slot_ev_[slot]);
      if (e != cudaSuccess) return e;
      uint8_t* pin = pinned_in_ + slot * slot_bytes_;
      if (!Stage(pin, spans[s], off, &pos, n)) return cudaErrorInvalidValue;  // fewer bytes than said
      if ((e = cudaMemcpyAsync(dst + off, pin, n, cudaMemcpyHostToDevice, stream_)) != cudaSuccess ||
          (e = cudaEventRecord(in_slot_ev_[slot], stream_)) != cudaSuccess) {
        return e;
      }
      slot = (slot + 1) % slots_;
    }
  }
  return cudaSuccess;
}

cudaError_t StreamWorker::CopyOut(const HostSpan& span, cudaEvent_t done_event, int64_t* tail_ns) {
  *tail_ns = 0;
  const auto* src = static_cast<const uint8_t*>(span.device);
  auto* dst = static_cast<uint8_t*>(const_cast<void*>(span.host));
  const size_t chunks = (span.bytes + slot_bytes_ - 1) / slot_bytes_;
  size_t issued = 0, drained = 0;
  cudaError_t e = cudaSuccess;
  auto issue = [&]() -> cudaError_t {
    // Fill every free slot with the next chunks' device -> pinned copies.
    while (issued < chunks && issued - drained < static_cast<size_t>(slots_)) {
      const size_t off = issued * slot_bytes_, n = std::min(slot_bytes_, span.bytes - off);
      const int slot = static_cast<int>(issued % slots_);
      cudaError_t err = cudaMemcpyAsync(pinned_out_ + slot * slot_bytes_, src + off, n,
                                        cudaMemcpyDeviceToHost, stream_);
      if (err == cudaSuccess) err = cudaEventRecord(out_slot_ev_[slot], stream_);
      if (err != cudaSuccess) return err;
      if (++issued == chunks) return cudaEventRecord(done_event, stream_);
    }
    return cudaSuccess;
  };
  if (chunks == 0) return cudaEventRecord(done_event, stream_);
  if ((e = issue()) != cudaSuccess) return e;
  int64_t tail_start = -1;
  while (drained < chunks) {
    const int slot = static_cast<int>(drained % slots_);
    if ((e = cudaEventSynchronize(out_slot_ev_[slot])) != cudaSuccess) return e;
    // Once the last DMA has finished, the remaining host copies lie outside
    // the events' span: time them on the host clock (first seen here, so up
    // to one chunk's memcpy may go uncounted).
    if (tail_start < 0 && issued == chunks && cudaEventQuery(done_event) == cudaSuccess) {
      tail_start = SteadyNowNs();
    }
    const size_t off = drained * slot_bytes_, n = std::min(slot_bytes_, span.bytes - off);
    std::memcpy(dst + off, pinned_out_ + slot * slot_bytes_, n);
    ++drained;
    if ((e = issue()) != cudaSuccess) return e;
  }
  if (tail_start < 0) {  // cannot happen: the last drain waited for the last DMA
    tail_start = SteadyNowNs();
  }
  *tail_ns = SteadyNowNs() - tail_start;
  return cudaSuccess;
}

cudaError_t StreamWorker::RunAsGraph(const GraphKey& key, const HostSpan& in, const HostSpan& out,
                                     const std::function<cudaError_t()>& launch, bool* ran,
                                     int64_t* tail_ns) {
  *ran = false;
  *tail_ns = 0;
  if (in.bytes > slot_bytes_ || out.bytes > slot_bytes_ || in.bytes == 0 || out.bytes == 0) {
    return cudaSuccess;
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) return cudaSuccess;
    it = graphs_.emplace(key, Graph{}).first;
  }
  Graph& g = it->second;
  if (g.failed) return cudaSuccess;
  if (g.exec == nullptr) {
    if (++g.calls < 2) return cudaSuccess;  // a shape seen once may never come again
    // Captured, not run: the nodes' pointers (staging slot 0, the call's device block, the
    // workspace) are the same for every call of the key, since the block is the scratch.
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      auto mark = [this](cudaEvent_t ev) {
        return cudaEventRecordWithFlags(ev, stream_, cudaEventRecordExternal);
      };
      e = mark(ev_start());
      if (e == cudaSuccess) e = cudaMemcpyAsync(in.device, pinned_in_, in.bytes, cudaMemcpyHostToDevice, stream_);
      if (e == cudaSuccess) e = mark(ev_in());
      if (e == cudaSuccess) e = mark(ev_go());
      if (e == cudaSuccess) e = launch();
      if (e == cudaSuccess) e = mark(ev_kernel());
      if (e == cudaSuccess) e = cudaMemcpyAsync(pinned_out_, out.device, out.bytes, cudaMemcpyDeviceToHost, stream_);
      if (e == cudaSuccess) e = mark(ev_out());
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      if (e == cudaSuccess) e = end;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess || g.exec == nullptr) {
      cudaGetLastError();  // a refused capture leaves a (non-sticky) error behind
      g.exec = nullptr;
      g.failed = true;
      return cudaSuccess;
    }
  }
  // The previous call ended with its stream synchronized, so slot 0 is free both ways.
  if (PiecePos pos; !Stage(pinned_in_, in, 0, &pos, in.bytes)) return cudaErrorInvalidValue;
  cudaError_t e = cudaGraphLaunch(g.exec, stream_);
  if (e != cudaSuccess) return e;
  *ran = true;
  if ((e = cudaEventSynchronize(ev_out())) != cudaSuccess) return e;
  const int64_t tail_start = SteadyNowNs();
  std::memcpy(const_cast<void*>(out.host), pinned_out_, out.bytes);
  *tail_ns = SteadyNowNs() - tail_start;
  return cudaSuccess;
}

}  // namespace fusebox::cuda_backend
