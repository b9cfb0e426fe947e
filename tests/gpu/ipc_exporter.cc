// Helper process for shared_memory_gpu_test: exports device memory with a CUDA IPC handle, as a
// client process on the server's node would. Allocates `bytes` on `device` (argv), fills its
// first half with float32 values x[i] = (i % 1000) * 0.01 - 5 and the rest with zeros, prints
// "HANDLE <128 hex digits>" and then answers lines on stdin: "dump OFFSET BYTES" prints those
// device bytes in hex, "quit" (or end of input) frees the memory and exits. A separate process
// because cudaIpcOpenMemHandle refuses handles from its own process.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s BYTES DEVICE\n", argv[0]);
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const int device = std::atoi(argv[2]);
  void* p = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
    return 1;
  }
  std::vector<float> host(bytes / sizeof(float), 0.0f);
  for (size_t i = 0; i < host.size() / 2; ++i) host[i] = static_cast<float>(i % 1000) * 0.01f - 5;
  cudaIpcMemHandle_t h;
  if (cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess || cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
    std::fprintf(stderr, "filling or exporting the memory failed\n");
    return 1;
  }
  std::printf("HANDLE ");
  const auto* hb = reinterpret_cast<const unsigned char*>(&h);
  for (size_t i = 0; i < sizeof h; ++i) std::printf("%02x", hb[i]);
  std::printf("\n");
  std::fflush(stdout);
  std::string cmd;
  while (std::cin >> cmd && cmd != "quit") {
    size_t off = 0, n = 0;
    if (cmd != "dump" || !(std::cin >> off >> n) || off > bytes || n > bytes - off) {
      std::printf("ERROR\n");
      std::fflush(stdout);
      continue;
    }
    std::vector<unsigned char> out(n);
    if (cudaMemcpy(out.data(), static_cast<char*>(p) + off, n, cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      std::printf("ERROR\n");
    } else {
      for (unsigned char c : out) std::printf("%02x", c);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  cudaFree(p);
  return 0;
}
