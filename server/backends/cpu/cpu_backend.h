// The CPU backend: the embedded default on hosts without a usable GPU. A
// WorkQueue of `workers` threads runs calls; each call's op is itself spread
// over the kernels' shared thread pool (kernels/cpu/parallel.h).
#pragma once

#include <memory>

#include "server/exec/backend.h"
#include "server/exec/batcher.h"

namespace fusebox {

struct CpuBackendOptions {
  int workers = 2;               // calls run at once
  size_t queue_capacity = 4096;  // queued calls beyond which Submit refuses
  // A call whose inline operands and result come to at most this many bytes runs on the thread
  // that submits it when a worker is free and none waits (QueuedExecutor's `here`); 0 = never.
  size_t run_here_bytes = 64 << 10;
  // Threads that gather an operand that arrived in pieces into one buffer
  // (kernels/cpu/parallel_copy.h): 0 = automatic (min(4, cores / 2)), 1 = the worker alone.
  int copy_threads = 0;
  BatchOptions batch;  // small calls of one key waiting together run as one (batcher.h)
  // Inline results and gathered operands go in buffers kept for the next call
  // (server/exec/host_pool.h), up to this many bytes at once; 0 = malloc each (glibc maps and
  // faults in a fresh one of ~64 MiB and up every time). The server sets a quarter of
  // --malloc_retain_mib.
  size_t host_pool_bytes = size_t{256} << 20;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace fusebox
