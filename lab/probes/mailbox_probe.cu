// mailbox_probe: how little a 4 KiB GeLU can cost the host that asks for it, three ways, called
// one at a time from one thread with a pause between calls like an RPC's round trip
// (notes/rpc-path.md, "A small call without launches"):
//   staged   what the CUDA backend does without its gate: memcpy into a pinned slot, H2D, event,
//            kernel, event, D2H, synchronize, memcpy out, elapsed time (device buffers of its own)
//   mapped   the kernel reads and writes mapped pinned memory: memcpy in, event, kernel, event,
//            synchronize, memcpy out, elapsed time (no copy commands)
//   mailbox  a persistent one-block kernel polls a word in mapped memory; the host writes the
//            input and the word, spins on the answer word, copies the output out; the kernel
//            stamps %globaltimer around its work (no CUDA call per request at all)
// Prints per way the median and p90 of the host time per call and of the kernel time it reports.
// Standalone (its own kernels, static cudart): nvcc -O3 -std=c++17 -arch=sm_90 -o mailbox_probe
// mailbox_probe.cu; run: ./mailbox_probe [calls=5000] [pause_us=100] [elements=1024].
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace {
using Clock = std::chrono::steady_clock;

__device__ __forceinline__ float Gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

__global__ void GeluKernel(const float* in, float* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = Gelu(in[i]);
  }
}

// The mailbox: written by the host (seq, n) and by the kernel (done, the stamps).
struct Box {
  uint32_t seq;   // host: request number; UINT32_MAX stops the kernel
  uint32_t n;     // elements of this request
  uint32_t done;  // kernel: the last request answered
  uint32_t pad;
  uint64_t t_start, t_end;  // %globaltimer around the work, ns
};

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void MailboxKernel(Box* box, const float* in, float* out) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> seq(box->seq), done(box->done);
  __shared__ uint32_t cur;
  __shared__ uint32_t n;
  __shared__ uint64_t t0;
  uint32_t last = 0;
  for (;;) {
    if (threadIdx.x == 0) {
      uint32_t s;
      while ((s = seq.load(cuda::memory_order_acquire)) == last) {
      }
      cur = s;
      n = box->n;
      t0 = GlobalTimer();
    }
    __syncthreads();
    const uint32_t s = cur;
    if (s == UINT32_MAX) return;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = Gelu(in[i]);
    __syncthreads();
    if (threadIdx.x == 0) {
      box->t_start = t0;
      box->t_end = GlobalTimer();
      done.store(s, cuda::memory_order_release);  // orders the outputs and stamps before it
    }
    last = s;
  }
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void* DevicePtr(void* host) {
  void* d = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&d, host, 0));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  // With lazy module loading (CUDA 12+'s default) the first launch of a kernel may wait for the
  // context to go idle, which it never does while the mailbox kernel runs: the first run of
  // this probe hung there for 10 minutes. Everything is loaded up front instead.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  const int calls = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int pause_us = argc > 2 ? std::atoi(argv[2]) : 100;
  const int n = argc > 3 ? std::atoi(argv[3]) : 1024;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  constexpr int kWays = 3;
  const char* const names[kWays] = {"staged", "mapped", "mailbox"};

  cudaStream_t s, ms;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&ms, cudaStreamNonBlocking));
  float *pin_in, *pin_out, *dev_in, *dev_out, *map_in, *map_out, *box_in, *box_out;
  CHECK_CUDA(cudaMallocHost(&pin_in, bytes));
  CHECK_CUDA(cudaMallocHost(&pin_out, bytes));
  CHECK_CUDA(cudaMalloc(&dev_in, bytes));
  CHECK_CUDA(cudaMalloc(&dev_out, bytes));
  CHECK_CUDA(cudaHostAlloc(&map_in, bytes, cudaHostAllocMapped | cudaHostAllocWriteCombined));
  CHECK_CUDA(cudaHostAlloc(&map_out, bytes, cudaHostAllocMapped));
  CHECK_CUDA(cudaHostAlloc(&box_in, bytes, cudaHostAllocMapped | cudaHostAllocWriteCombined));
  CHECK_CUDA(cudaHostAlloc(&box_out, bytes, cudaHostAllocMapped));
  Box* box;
  CHECK_CUDA(cudaHostAlloc(&box, sizeof(Box), cudaHostAllocMapped));
  std::memset(box, 0, sizeof(Box));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  GeluKernel<<<1, 32, 0, s>>>(static_cast<const float*>(nullptr), nullptr, 0);  // loaded before
  CHECK_CUDA(cudaStreamSynchronize(s));
  MailboxKernel<<<1, 256, 0, ms>>>(static_cast<Box*>(DevicePtr(box)),
                                   static_cast<const float*>(DevicePtr(box_in)),
                                   static_cast<float*>(DevicePtr(box_out)));
  CHECK_CUDA(cudaGetLastError());
  const auto* dmap_in = static_cast<const float*>(DevicePtr(map_in));
  auto* dmap_out = static_cast<float*>(DevicePtr(map_out));
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> seq(box->seq), done(box->done);

  std::vector<float> host_in(n), host_out(n), want(n);
  for (int i = 0; i < n; ++i) {
    host_in[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;
    const double x = host_in[i];
    want[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x))));
  }
  const int blocks = std::max(1, std::min(132, (n + 255) / 256));
  std::vector<double> total[kWays], kernel[kWays];
  int wrong = 0;
  uint32_t next = 0;
  for (int call = -100; call < calls; ++call) {  // 100 warm-up calls per way
    for (int w = 0; w < kWays; ++w) {
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      std::fill(host_out.begin(), host_out.end(), NAN);
      const auto t0 = Clock::now();
      double kus = 0;
      if (w == 0) {
        std::memcpy(pin_in, host_in.data(), bytes);
        CHECK_CUDA(cudaMemcpyAsync(dev_in, pin_in, bytes, cudaMemcpyHostToDevice, s));
        CHECK_CUDA(cudaEventRecord(e0, s));
        GeluKernel<<<blocks, 256, 0, s>>>(dev_in, dev_out, n);
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaMemcpyAsync(pin_out, dev_out, bytes, cudaMemcpyDeviceToHost, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        std::memcpy(host_out.data(), pin_out, bytes);
        float ms_ = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
        kus = 1e3 * ms_;
      } else if (w == 1) {
        std::memcpy(map_in, host_in.data(), bytes);
        __builtin_ia32_sfence();  // write-combined stores before the launch reads them
        CHECK_CUDA(cudaEventRecord(e0, s));
        GeluKernel<<<blocks, 256, 0, s>>>(dmap_in, dmap_out, n);
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        std::memcpy(host_out.data(), map_out, bytes);
        float ms_ = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
        kus = 1e3 * ms_;
      } else {
        std::memcpy(box_in, host_in.data(), bytes);
        box->n = static_cast<uint32_t>(n);
        __builtin_ia32_sfence();
        seq.store(++next, cuda::memory_order_release);
        while (done.load(cuda::memory_order_acquire) != next) __builtin_ia32_pause();
        std::memcpy(host_out.data(), box_out, bytes);
        kus = (box->t_end - box->t_start) / 1e3;
      }
      const auto t1 = Clock::now();
      for (int i = 0; i < n; ++i) wrong += !(std::fabs(host_out[i] - want[i]) <= 1e-5f);
      if (call < 0) continue;
      total[w].push_back(Us(t0, t1));
      kernel[w].push_back(kus);
    }
  }
  seq.store(UINT32_MAX, cuda::memory_order_release);
  CHECK_CUDA(cudaStreamSynchronize(ms));
  std::printf("mailbox_probe: %d calls per way, %d elements (float32 GeLU), %d us pause; "
              "wrong elements %d\n", calls, n, pause_us, wrong);
  std::printf("| way | host us per call, median (p90) | kernel us, median (p90) |\n|---|---|---|\n");
  for (int w = 0; w < kWays; ++w) {
    std::printf("| %s | %.1f (%.1f) | %.1f (%.1f) |\n", names[w], Pct(total[w], 0.5),
                Pct(total[w], 0.9), Pct(kernel[w], 0.5), Pct(kernel[w], 0.9));
  }
  return wrong == 0 ? 0 : 1;
}
