// How the server creates the CUDA backend, which lives in a module
// (libfusebox_cuda_backend.so) loaded with dlopen: libcublasLt carries ~94 KB
// of static TLS, which as a load-time dependency of the server breaks the
// threads of prometheus-cpp's HTTP server (loaded with dlopen it gets dynamic
// TLS), and one server binary must run on hosts with and without CUDA.
#pragma once

#include <cstddef>

#include "server/exec/backend.h"
#include "server/exec/batcher.h"

namespace fusebox {

// The most streams one CUDA backend runs (--streams).
constexpr int kMaxCudaStreams = 64;

struct CudaBackendOptions {
  int device = 0;                 // CUDA device ordinal
  int streams = 4;                // streams in the pool = worker threads
  size_t queue_capacity = 4096;   // queued calls beyond which Submit refuses
  size_t staging_bytes = 64u << 20;  // pinned staging per stream, each way
  MatmulImpl default_matmul = MatmulImpl::kCublasLt;
  // A call whose operands and result (inline or resident) come to at most this many bytes runs
  // on the thread that submits it when a stream is free and none waits; 0 = never.
  size_t run_here_bytes = 64 << 10;
  // Hold each kernel behind the stream gate (stream_worker.h) so kernel_us is the kernel's own
  // time; off: one launch fewer per call, and kernel_us includes the launch's latency.
  bool kernel_gate = true;
  // Small inline GeLU / softmax / row-sum calls of a shape seen before run as one CUDA graph
  // each (copy in, kernel, copy out: StreamWorker::RunAsGraph).
  bool cuda_graphs = false;
  // Threads that copy a call's host bytes into pinned staging (kernels/cpu/parallel_copy.h):
  // 0 = automatic (min(4, cores / 2)), 1 = the stream's own thread alone.
  int copy_threads = 0;
  BatchOptions batch;  // small calls of one key waiting together run as one (batcher.h)
};

}  // namespace fusebox

// The module's one exported symbol. Returns null when the backend cannot start, with a
// reason in `error` and its absl::StatusCode in `*error_code` (when not null):
// INVALID_ARGUMENT for options this host cannot honour (a device ordinal past the last),
// UNAVAILABLE when there is no GPU, other codes when CUDA fails to start.
extern "C" fusebox::Backend* fusebox_create_cuda_backend(const fusebox::CudaBackendOptions* options,
                                                         char* error, size_t error_len,
                                                         int* error_code);
