// The CPU backend: the embedded default on hosts without a usable GPU. A
// WorkQueue of `workers` threads runs calls; each call's op is itself spread
// over the kernels' shared thread pool (kernels/cpu/parallel.h).
#pragma once

#include <memory>

#include "server/exec/backend.h"

namespace fusebox {

struct CpuBackendOptions {
  int workers = 2;               // calls run at once
  size_t queue_capacity = 1024;  // queued calls beyond which Submit refuses
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace fusebox
