// launch_gap_probe: why does the server's kernel time read 9-25 us over the kernel benchmark?
// (bench/e2e/NOTES.md). Times the same launchers on the same shapes, in one process, six ways:
//   bench      L2 flush kernel, then events around the launch, back to back (the benchmark)
//   idle       stream idle: record `in`, launch, record `kernel`, sync; then a pause
//              (300 us: an RPC round trip), like a server call on a resident tensor
//   idle-long  the same with a 20 ms pause (clocks may drop while idle)
//   spin-gate  like idle, but the server's kernel gate (server/backends/cuda/stream_gate.cu: a 1-thread
//              kernel polling a word of mapped host memory, here with a 2 ms timeout) before
//              `in`; the host writes the word once the launch and `kernel` are enqueued
//   wait-gate  the same gate through cuStreamWaitValue32 (driver entry point, no libcuda link)
//   spin-long  spin-gate with the 20 ms pause
// If idle >> bench and spin-gate ~ bench: host launch gap. If idle-long >> idle and the gate
// does not help there: clocks. Prints one table: median us per shape and way.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench/gpu/check_cuda.h"
#include "bench/gpu/memory_bound_fill.h"
#include "kernels/cuda/launch.h"
#include "server/backends/cuda/stream_gate.h"

namespace {
using fusebox::DType;
namespace fc = fusebox::cuda;

using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct Case { const char* name; int op; DType dt; int64_t rows, cols; };

}  // namespace

int main() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Case cases[] = {
      {"rowsum bf16 262144x128", 2, DType::kBFloat16, 262144, 128},
      {"rowsum f32 8192x8192", 2, DType::kFloat32, 8192, 8192},
      {"softmax f32 262144x128", 1, DType::kFloat32, 262144, 128},
      {"softmax bf16 8192x8192", 1, DType::kBFloat16, 8192, 8192},
      {"gelu f32 2^28", 0, DType::kFloat32, 1, int64_t{1} << 28},
  };
  const size_t max_bytes = size_t{1} << 30;
  void *in, *out, *flush;
  float* flush_out;
  CHECK_CUDA(cudaMalloc(&in, max_bytes));
  CHECK_CUDA(cudaMalloc(&out, max_bytes));
  CHECK_CUDA(cudaMalloc(&flush, size_t{256} << 20));
  CHECK_CUDA(cudaMalloc(&flush_out, 1024 * sizeof(float)));
  CHECK_CUDA(fusebox::bench::FillUniform(DType::kFloat32, flush, (size_t{256} << 20) / 4, -1, 1, 7, s));
  CHECK_CUDA(fusebox::bench::FillUniform(DType::kFloat32, in, max_bytes / 4, -1, 1, 9, s));
  CHECK_CUDA(cudaStreamSynchronize(s));

  uint32_t* word = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof(uint32_t), cudaHostAllocMapped));
  *word = 0;
  uint32_t* dword = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dword), word, 0));
  WaitValueFn wait_value = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait_value),
                                       12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    wait_value = nullptr;
  }
  int dev = 0, memops = 0;
  cudaDeviceGetAttribute(&memops, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1), dev);
  std::printf("cuStreamWaitValue32 entry point: %s; CAN_USE_STREAM_MEM_OPS: %d\n",
              wait_value ? "yes" : "no", memops);
  cudaGetLastError();

  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  uint32_t seq = 0;
  auto launch = [&](const Case& c) {
    switch (c.op) {
      case 0: return fc::LaunchGelu(c.dt, in, out, c.rows * c.cols, s);
      case 1: return fc::LaunchSoftmax(c.dt, in, out, c.rows, c.cols, s);
      default: return fc::LaunchRowSum(c.dt, in, static_cast<float*>(out), c.rows, c.cols, s);
    }
  };
  const char* ways[] = {"bench", "idle", "idle-long", "spin-gate", "wait-gate", "spin-long"};
  std::printf("%-24s", "median us");
  for (const char* w : ways) std::printf(" %10s", w);
  std::printf("\n");
  for (const Case& c : cases) {
    std::printf("%-24s", c.name);
    for (int way = 0; way < 6; ++way) {
      if (way == 4 && wait_value == nullptr) { std::printf(" %10s", "n/a"); continue; }
      std::vector<float> t;
      const int reps = way == 2 || way == 5 ? 15 : 30;
      for (int r = 0; r < reps + 3; ++r) {
        if (way == 0) {
          CHECK_CUDA(fc::LaunchRowSum(DType::kFloat32, flush, flush_out, 1024, 65536, s));
        } else {
          CHECK_CUDA(cudaStreamSynchronize(s));
          std::this_thread::sleep_for(std::chrono::microseconds(way == 2 || way == 5 ? 20000 : 300));
        }
        const bool gate = way >= 3;
        ++seq;
        if (gate && way != 4) CHECK_CUDA(fusebox::cuda_backend::LaunchStreamGate(dword, seq, 2000000, s));
        if (way == 4) {
          if (wait_value(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(dword), seq,
                         CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
            std::printf("(wait failed)");
          }
        }
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_CUDA(launch(c));
        CHECK_CUDA(cudaEventRecord(e1, s));
        if (gate) __atomic_store_n(word, seq, __ATOMIC_SEQ_CST);
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) t.push_back(ms * 1000);
      }
      std::sort(t.begin(), t.end());
      std::printf(" %10.1f", t[t.size() / 2]);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  return 0;
}
