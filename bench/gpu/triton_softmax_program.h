// Triton's one-row softmax program (triton_peers.py's softmax_row_kernel at 8192 columns, 16
// warps) from a cubin that triton_softmax_cubin.py wrote: loading it, and launching it as Triton
// does. For load_hints_probe --triton and memory_bound_capi (memory_bound_peers.py --triton-cubin).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusebox::bench {

// Loads the program from the cubin at `path` into *k (the library stays loaded while it is used).
inline cudaError_t LoadTritonSoftmax(const char* path, cudaKernel_t* k) {
  cudaLibrary_t lib;
  cudaError_t e = cudaLibraryLoadFromFile(&lib, path, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess) return e;
  e = cudaLibraryGetKernel(k, lib, "softmax_row_kernel");
  if (e != cudaSuccess) cudaLibraryUnload(lib);
  return e;
}

// One program per row: 512 threads, 64 bytes of dynamic shared memory; arguments x, y, cols and
// the two scratch pointers Triton adds (unused: null).
inline cudaError_t LaunchTritonSoftmax(cudaKernel_t k, const void* x, void* y, int64_t rows, int cols,
                                       cudaStream_t s) {
  void* none = nullptr;
  void* args[] = {&x, &y, &cols, &none, &none};
  return cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(static_cast<unsigned>(rows)), dim3(512), args, 64,
                          s);
}

}  // namespace fusebox::bench
