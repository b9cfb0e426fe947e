// The kernel gate of a StreamWorker (stream_worker.h says why): one thread
// that waits until a word of mapped pinned host memory holds `seq`, polling
// it over PCIe every ~0.2 us, or until `timeout_ns` has passed.
// Cost: one 1-thread block for the host's launch time (a few us), then exits.
#include "server/backends/cuda/stream_gate.h"

namespace fusebox::cuda_backend {
namespace {

__global__ void StreamGateKernel(const volatile uint32_t* word, uint32_t seq, uint64_t timeout_ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*word != seq) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > timeout_ns) return;
    __nanosleep(200);
  }
}

}  // namespace

cudaError_t LaunchStreamGate(const uint32_t* device_word, uint32_t seq, uint64_t timeout_ns,
                             cudaStream_t s) {
  StreamGateKernel<<<1, 1, 0, s>>>(device_word, seq, timeout_ns);
  return cudaGetLastError();
}

}  // namespace fusebox::cuda_backend
