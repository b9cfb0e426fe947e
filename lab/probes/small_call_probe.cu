// small_call_probe: what a 4 KiB inline call costs the CUDA backend's worker thread, and how
// much of it two changes would save (bench/e2e/NOTES.md, session 20). Replays RunCall's
// sequence for one float32 GeLU of 1024 elements on one stream (pool allocation, start event,
// staged copy in, `in`, the kernel gate, `go`, kernel, `kernel`, release, staged copy out,
// `out`, wait, copy to the caller, free, stream synchronize, four elapsed times) four ways,
// interleaved call by call, with a pause between calls like an RPC's round trip:
//   server      as RunCall does it
//   free-early  cudaFreeAsync enqueued right after the copy out, before `out`, so the final
//               cudaStreamSynchronize finds nothing new on the stream
//   scratch     no pool allocation or free: a buffer the worker owns
//   no-gate     scratch without the kernel gate (a reference: the gate keeps kernel time honest)
// Prints, per way, the median and p90 of the host time of one call and of its pieces.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/gpu/check_cuda.h"
#include "kernels/cuda/launch.h"
#include "server/backends/cuda/stream_gate.h"

namespace {
namespace fc = fusebox::cuda;
using Clock = std::chrono::steady_clock;

constexpr int kWays = 4;
const char* const kWayNames[kWays] = {"server", "free-early", "scratch", "no-gate"};
constexpr int kPieces = 4;  // before `start`, enqueue to release, wait for `out`, after `out`
const char* const kPieceNames[kPieces] = {"alloc", "enqueue", "wait out", "free+sync+times"};

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 3000;
  const int pause_us = argc > 2 ? std::atoi(argv[2]) : 200;
  constexpr int64_t n = 1024;
  constexpr size_t bytes = n * sizeof(float);

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  uint8_t *pin_in, *pin_out;
  CHECK_CUDA(cudaMallocHost(&pin_in, bytes));
  CHECK_CUDA(cudaMallocHost(&pin_out, bytes));
  void* scratch;
  CHECK_CUDA(cudaMalloc(&scratch, 2 * bytes));
  uint32_t* gate;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&gate), sizeof(uint32_t), cudaHostAllocMapped));
  *gate = 0;
  void* gate_dev;
  CHECK_CUDA(cudaHostGetDevicePointer(&gate_dev, gate, 0));
  uint32_t seq = 0;
  cudaEvent_t ev[5], in_slot, out_slot;  // start, in, go, kernel, out
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  CHECK_CUDA(cudaEventCreateWithFlags(&in_slot, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&out_slot, cudaEventDisableTiming));

  std::vector<float> host_in(n), host_out(n);
  for (int64_t i = 0; i < n; ++i) host_in[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;

  std::vector<double> total[kWays], piece[kWays][kPieces];
  for (int call = -50; call < calls; ++call) {  // 50 warm-up calls per way
    for (int w = 0; w < kWays; ++w) {
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      const bool pool_block = w < 2, gated = w < 3;
      const auto t0 = Clock::now();
      void* block = scratch;
      if (pool_block) CHECK_CUDA(cudaMallocFromPoolAsync(&block, 2 * bytes, pool, s));
      auto* dev_in = static_cast<float*>(block);
      auto* dev_out = dev_in + n;
      const auto t1 = Clock::now();
      CHECK_CUDA(cudaEventRecord(ev[0], s));
      CHECK_CUDA(cudaEventSynchronize(in_slot));
      std::memcpy(pin_in, host_in.data(), bytes);
      CHECK_CUDA(cudaMemcpyAsync(dev_in, pin_in, bytes, cudaMemcpyHostToDevice, s));
      CHECK_CUDA(cudaEventRecord(in_slot, s));
      CHECK_CUDA(cudaEventRecord(ev[1], s));
      if (gated) {
        CHECK_CUDA(fusebox::cuda_backend::LaunchStreamGate(static_cast<const uint32_t*>(gate_dev),
                                                           ++seq, 1000000, s));
      }
      CHECK_CUDA(cudaEventRecord(ev[2], s));
      CHECK_CUDA(fc::LaunchGelu(fusebox::DType::kFloat32, dev_in, dev_out, n, s));
      CHECK_CUDA(cudaEventRecord(ev[3], s));
      if (gated) __atomic_store_n(gate, seq, __ATOMIC_RELEASE);
      CHECK_CUDA(cudaMemcpyAsync(pin_out, dev_out, bytes, cudaMemcpyDeviceToHost, s));
      CHECK_CUDA(cudaEventRecord(out_slot, s));
      if (w == 1) CHECK_CUDA(cudaFreeAsync(block, s));
      CHECK_CUDA(cudaEventRecord(ev[4], s));
      const auto t2 = Clock::now();
      CHECK_CUDA(cudaEventSynchronize(out_slot));
      (void)cudaEventQuery(ev[4]);
      const auto t3 = Clock::now();
      std::memcpy(host_out.data(), pin_out, bytes);
      if (w == 0) CHECK_CUDA(cudaFreeAsync(block, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
      float ms[4];
      for (int k = 0; k < 4; ++k) CHECK_CUDA(cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]));
      const auto t4 = Clock::now();
      if (call < 0) continue;
      total[w].push_back(Us(t0, t4));
      const double p[kPieces] = {Us(t0, t1), Us(t1, t2), Us(t2, t3), Us(t3, t4)};
      for (int k = 0; k < kPieces; ++k) piece[w][k].push_back(p[k]);
    }
  }
  // The result must be GeLU's (a check that the four ways ran the kernel, not a full test).
  const float x = host_in[3];
  const float want = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
  if (std::fabs(host_out[3] - want) > 1e-5f) {
    std::printf("wrong result: %g, want %g\n", host_out[3], want);
    return 1;
  }
  std::printf("small_call_probe: %d calls per way, %d us pause; host us, median (p90)\n", calls,
              pause_us);
  std::printf("| way | call |");
  for (const char* p : kPieceNames) std::printf(" %s |", p);
  std::printf("\n|---|---|---|---|---|---|\n");
  for (int w = 0; w < kWays; ++w) {
    std::printf("| %s | %.1f (%.1f) |", kWayNames[w], Pct(total[w], 0.5), Pct(total[w], 0.9));
    for (int k = 0; k < kPieces; ++k) {
      std::printf(" %.1f (%.1f) |", Pct(piece[w][k], 0.5), Pct(piece[w][k], 0.9));
    }
    std::printf("\n");
  }
  return 0;
}
