// Chooses and creates the backend for --backend=auto|cpu|cuda. The CUDA
// backend is a module (libfusebox_cuda_backend.so) opened with dlopen, so the
// server has no load-time dependency on CUDA or cuBLASLt (see cuda_backend.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backend.h"

namespace fusebox {

struct BackendChoice {
  std::string kind = "auto";  // auto | cpu | cuda
  std::string cuda_module;    // path; empty = next to the executable
  CpuBackendOptions cpu;
  CudaBackendOptions cuda;
};

// auto: CUDA when the module loads and finds a usable GPU, else CPU (and says
// why on stderr); options the GPU path cannot honour (--streams out of range, a
// device ordinal past the last) are INVALID_ARGUMENT, not a fall back to the CPU.
// cuda: CUDA or an error. cpu: CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice);

}  // namespace fusebox
