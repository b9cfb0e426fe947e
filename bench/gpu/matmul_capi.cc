// A C entry point to our matmul+ReLU for matmul_torch.py (ctypes), so that our
// kernels and the torch peers are timed by the same harness (do_bench), on the
// same tensors, interleaved in one process: no ordering or thermal bias
// between two programs. Benchmark-only; the server never loads this.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/matmul.h"

namespace {
fusebox::cuda::CublasLtMatmul* Runner(bool autotune) {
  auto make = [](bool tune) {
    auto r = fusebox::cuda::CublasLtMatmul::Create(
        fusebox::cuda::NewMatmulAlgoCache(), fusebox::cuda::CublasLtMatmul::kDefaultWorkspaceBytes,
        tune);
    return r.ok() ? std::move(*r) : nullptr;
  };
  static std::unique_ptr<fusebox::cuda::CublasLtMatmul> tuned = make(true), plain = make(false);
  return autotune ? tuned.get() : plain.get();
}
}  // namespace

// dtype: 1 float32, 2 float16, 3 bfloat16 (fusebox::DType). impl: 0 cuBLASLt
// as the server runs it (heuristic's first pick), 1 tiled (automatic choice),
// 2 tiled forced to mma.sync, 3 cuBLASLt with candidates timed (autotune).
// Returns 0 on success.
extern "C" __attribute__((visibility("default"))) int fusebox_bench_matmul(
    int dtype, int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* bias,
    void* out, int allow_tf32, int impl, void* stream) {
  fusebox::cuda::MatmulArgs args;
  args.dtype = static_cast<fusebox::DType>(dtype);
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a;
  args.b = b;
  args.bias = bias;
  args.out = out;
  args.allow_tf32 = allow_tf32 != 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (impl == 0 || impl == 3) {
    auto* r = Runner(impl == 3);
    return r != nullptr && r->Run(args, s).ok() ? 0 : 1;
  }
  const auto which = impl == 2 ? fusebox::cuda::TiledKernel::kMmaSync : fusebox::cuda::TiledKernel::kAuto;
  return fusebox::cuda::LaunchMatmulReluTiled(args, s, which) == cudaSuccess ? 0 : 2;
}
