// A small process-wide thread pool for the CPU kernels, and ParallelFor over it.
// Cost: one futex wake per pool thread per ParallelFor call that uses the pool
// (a few microseconds); ranges at or below `grain` run inline on the caller.
//
// Concurrency: the pool runs one ParallelFor at a time. A call that finds it busy
// (another server thread's op, or a ParallelFor nested inside a chunk) runs its
// whole range inline on the calling thread, so there is no waiting on the pool
// and no deadlock; the cores are busy with the other call anyway.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace fusebox::cpu {

// Threads the CPU kernels use (pool workers + the calling thread). n <= 0 means
// std::thread::hardware_concurrency(). Also sets OpenBLAS's thread count when the
// BLAS is OpenBLAS. Safe to call at any time, also while ops run.
void SetCpuThreads(int n);
int CpuThreads();

// Calls fn(begin, end) over disjoint subranges covering [0, n), each of at least
// `grain` elements (except possibly the last), on the pool and the calling
// thread; returns when all are done. fn must not throw.
void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace fusebox::cpu
