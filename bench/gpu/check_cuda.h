// CHECK_CUDA(call): the benchmarks' and probes' way out of a failed CUDA call: prints the file,
// line, call and error, then exits 1 (a benchmark has nothing to recover; the server never does
// this: it turns CUDA errors into statuses).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                                       \
  do {                                                                                      \
    const cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
