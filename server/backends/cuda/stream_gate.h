// Enqueues the kernel gate on stream `s` (stream_gate.cu): the stream runs
// nothing after it until the host stores `seq` into the mapped word whose
// device address is `device_word`, or `timeout_ns` passes (so a host that
// never stores, or a module load that waits for the stream, delays the stream
// by the timeout at most: it can never hang).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusebox::cuda_backend {

cudaError_t LaunchStreamGate(const uint32_t* device_word, uint32_t seq, uint64_t timeout_ns,
                             cudaStream_t s);

}  // namespace fusebox::cuda_backend
