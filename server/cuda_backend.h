// How the server creates the CUDA backend, which lives in a module
// (libfusebox_cuda_backend.so) loaded with dlopen: cuBLASLt's static TLS must
// not become a load-time dependency of the server (PLATFORM.md's trap), and
// one server binary must run on hosts with and without CUDA.
#pragma once

#include <cstddef>

#include "server/backend.h"

namespace fusebox {

struct CudaBackendOptions {
  int device = 0;                 // CUDA device ordinal
  int streams = 4;                // streams in the pool = worker threads
  size_t queue_capacity = 1024;   // queued calls beyond which Submit refuses
  size_t staging_bytes = 64u << 20;  // pinned staging per stream, each way
  MatmulImpl default_matmul = MatmulImpl::kCublasLt;
};

}  // namespace fusebox

// The module's one exported symbol. Returns null and writes a reason into
// `error` when no usable GPU is found or CUDA fails to start.
extern "C" fusebox::Backend* fusebox_create_cuda_backend(const fusebox::CudaBackendOptions* options,
                                                         char* error, size_t error_len);
