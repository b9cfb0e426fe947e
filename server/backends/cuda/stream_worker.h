// What one worker thread of the CUDA backend owns: a stream, pinned staging
// buffers for each direction, events, and a cuBLASLt runner. Worker i of the
// backend's WorkQueue uses StreamWorker i and nothing else, so none of this
// needs a lock.
//
// Copies between pageable host memory (the request's bytes) and the device go
// through the pinned staging buffer in chunks, pipelined: the CPU copies chunk
// i+1 into one slot while the DMA engine moves chunk i out of another. With
// 64 MiB of staging a direction cut into 16 slots of 4 MiB, a large copy costs
// about its host memcpy plus one chunk's DMA (55 GB/s), instead of memcpy + DMA
// back to back. The host copy into a slot is spread over `copy_threads`
// (kernels/cpu/parallel_copy.h): on one thread it moved 7-16 GB/s, the slower
// end for a request still in its 64 KiB receive slices.
//
// Cost at start-up: 2 x staging_bytes of pinned host memory (cudaMallocHost),
// one stream, 2 x slots + 5 events, one mapped pinned word (the kernel gate),
// one 32 MiB cuBLASLt workspace, and kScratchBytes of device memory for small
// calls' operands (saves a pool allocation and free, which cost a small call
// 11-14 us of host time, and 21-32 us of a 4 KiB call's server time end to
// end; and small calls keep running when the pool has no memory left).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/matmul.h"
#include "server/exec/backend.h"
#include "kernels/cpu/parallel_copy.h"

namespace fusebox::cuda_backend {

// One host <-> device transfer of a call.
struct HostSpan {
  const void* host;  // source (in) or destination (out)
  void* device;
  size_t bytes;
  // In only: when set, the source is these pieces in order, not `host` (a request's bytes as
  // they arrived); each staging slot is filled from as many pieces as it takes.
  const HostPieces* pieces = nullptr;
};

class StreamWorker {
 public:
  // Creates everything on the current device; the cuBLASLt runner's timing scratch comes from
  // `pool` (the backend's). CopyIn's host copies use up to `copy_threads` threads
  // (CopyThreads: 0 = automatic).
  static absl::StatusOr<std::unique_ptr<StreamWorker>> Create(
      size_t staging_bytes, int copy_threads, std::shared_ptr<cuda::MatmulAlgoCache> algo_cache,
      cudaMemPool_t pool);
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  cudaStream_t stream() const { return stream_; }
  cuda::CublasLtMatmul& cublaslt() { return *lt_; }

  // Device memory this worker owns for a call whose operands, result and workspace fit in
  // kScratchBytes. Only work on stream() touches it, so stream order alone makes the next
  // call's use wait for this one's.
  static constexpr size_t kScratchBytes = size_t{1} << 20;
  void* scratch() const { return scratch_; }

  // Events bracketing the phases of one call, recorded on stream():
  // start -> (copy in) -> in -> (gate: launch) -> go -> (kernel) -> kernel ->
  // (copy out) -> out.
  cudaEvent_t ev_start() const { return ev_[0]; }
  cudaEvent_t ev_in() const { return ev_[1]; }
  cudaEvent_t ev_go() const { return ev_[4]; }
  cudaEvent_t ev_kernel() const { return ev_[2]; }
  cudaEvent_t ev_out() const { return ev_[3]; }

  // The kernel gate. On an idle stream a kernel starts 7-40 us after the
  // event before it (the host's launch work, the GPU waking), which a
  // benchmark's back-to-back launches never see. HoldKernelGate() enqueues a
  // 1-thread kernel that holds the stream until ReleaseKernelGate() stores to
  // a mapped pinned word, so that `go`, the kernel and `kernel` are all
  // enqueued before the GPU reaches them and kernel time is the kernel's
  // alone. The gate gives up after 1 ms (a lazy module load that waits for the
  // stream, a descheduled host thread): a late release costs time, never a
  // hang. Call ReleaseKernelGate() after every successful HoldKernelGate(),
  // whatever happened in between.
  cudaError_t HoldKernelGate();
  void ReleaseKernelGate();

  // Host -> device for every span, through the staging ring. Returns once the
  // last chunk is enqueued (its source bytes are already in pinned memory, so
  // the host buffers may change afterwards).
  cudaError_t CopyIn(const HostSpan* spans, int count);

  // Device -> host (span.host is the destination) through the staging ring.
  // Records `done_event` after the last device->pinned copy and returns once
  // every byte is in host memory; *tail_ns is the host time spent copying
  // pinned -> destination after that event (not covered by the event).
  cudaError_t CopyOut(const HostSpan& span, cudaEvent_t done_event, int64_t* tail_ns);

  // A small call as one CUDA graph (--cuda_graphs): copy in, the kernel and copy out, each
  // phase between the events above, replayed for every later call of the same key (op, dtype,
  // rows, cols: the same pointers, the same kernel). One graph launch replaces ~8 API calls and
  // the GPU runs the phases back to back; the kernel gate is not needed (the kernel node follows
  // `go` without a host in between). A key's graph is captured on its second call and kept
  // (at most kMaxGraphs per stream); *ran is false where no graph ran (a first call, a full
  // cache, a capture CUDA refused: then never again for that key), and the caller runs the call
  // the usual way. `in` comes from its host bytes or pieces through staging slot 0, the result
  // goes to out.host through slot 0; `launch` enqueues the kernel on stream() (in capture).
  // *tail_ns: the host copy of the result after `out`'s event.
  using GraphKey = std::tuple<int, int, int64_t, int64_t>;
  static constexpr size_t kMaxGraphs = 64;
  cudaError_t RunAsGraph(const GraphKey& key, const HostSpan& in, const HostSpan& out,
                         const std::function<cudaError_t()>& launch, bool* ran, int64_t* tail_ns);

  // How many of the backend's resident allocations stream() has been made to wait for
  // (CudaBackend::OrderAfterAllocations): a worker waits again only after a new one.
  uint64_t allocations_seen = 0;

 private:
  StreamWorker() = default;
  // Copies n bytes of span's host bytes, from byte `off` (in pieces: from *pos, which moves past
  // them), into pinned `pin`, on up to copy_threads_ threads; false when the pieces end first.
  bool Stage(uint8_t* pin, const HostSpan& span, size_t off, PiecePos* pos, size_t n);

  cudaStream_t stream_ = nullptr;
  uint8_t* pinned_in_ = nullptr;
  uint8_t* pinned_out_ = nullptr;
  size_t slot_bytes_ = 0;
  int slots_ = 0;
  int copy_threads_ = 1;
  std::vector<cudaEvent_t> in_slot_ev_, out_slot_ev_;  // per slot: its DMA has finished
  cudaEvent_t ev_[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  uint32_t* gate_ = nullptr;             // mapped pinned word (host address)
  const uint32_t* gate_dev_ = nullptr;   // its device address
  uint32_t gate_seq_ = 0;
  void* scratch_ = nullptr;  // kScratchBytes of device memory
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int calls = 0;        // calls of the key seen before its capture
    bool failed = false;  // capture refused: the key always runs the usual way
  };
  std::map<GraphKey, Graph> graphs_;
  std::unique_ptr<cuda::CublasLtMatmul> lt_;
};

}  // namespace fusebox::cuda_backend
