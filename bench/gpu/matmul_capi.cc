// A C entry point to our matmul+ReLU for matmul_torch.py (ctypes), so that our
// kernels and the torch peers are timed by the same harness (interleaved_timer.py), on the
// same tensors, interleaved in one process: no ordering or thermal bias
// between two programs. Benchmark-only; the server never loads this.
//
// impl codes (fusebox_bench_matmul's `impl`):
//   0  cuBLASLt as the server runs it: kDefaultWorkspaceBytes (32 MiB), the
//      default policy (two picks: the heuristic's 32 MiB and 1 MiB first picks,
//      timed against each other once per key where they differ)
//   1  tiled kernel, automatic choice (wgmma where it applies, else mma.sync / FFMA)
//   2  tiled kernel forced to mma.sync
//   3  cuBLASLt with the heuristic's candidates timed (kAutotune), default workspace
//   4  cuBLASLt, heuristic's first pick, 1 MiB workspace (PyTorch 2.11's cuBLASLt default)
//   5  cuBLASLt, heuristic's first pick, 32 MiB workspace
//   6  cuBLASLt, heuristic's first pick, no workspace (never faster than 4 or 5 on the
//      benchmark shapes; not in the harness's A/B rounds)
// Each cuBLASLt code has its own runner, workspace and algorithm cache, so a
// code's choice never leaks into another's. Single-threaded use only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tuning.h"

namespace {
namespace fc = fusebox::cuda;

constexpr int kNumImpls = 7;

bool IsCublasLt(int impl) { return impl == 0 || impl >= 3; }

// Workspace bytes of a cuBLASLt impl code; -1 for the tiled codes and unknown ones.
int64_t WorkspaceOf(int impl) {
  switch (impl) {
    case 0:
    case 3: return static_cast<int64_t>(fc::CublasLtMatmul::kDefaultWorkspaceBytes);
    case 4: return static_cast<int64_t>(fc::kLtTorchWorkspaceBytes);
    case 5: return static_cast<int64_t>(fc::kLtLargeWorkspaceBytes);
    case 6: return 0;
    default: return -1;
  }
}

fc::LtAlgoPolicy PolicyFor(int impl) {
  switch (impl) {
    case 0: return fc::LtAlgoPolicy::kTwoPicks;
    case 3: return fc::LtAlgoPolicy::kAutotune;
    default: return fc::LtAlgoPolicy::kFirstPick;
  }
}

fc::CublasLtMatmul* Runner(int impl) {
  static std::unique_ptr<fc::CublasLtMatmul> runners[kNumImpls];
  static bool tried[kNumImpls] = {};
  if (impl < 0 || impl >= kNumImpls || !IsCublasLt(impl)) return nullptr;
  if (!tried[impl]) {
    tried[impl] = true;
    auto r = fc::CublasLtMatmul::Create(fc::NewMatmulAlgoCache(),
                                        static_cast<size_t>(WorkspaceOf(impl)), PolicyFor(impl));
    if (r.ok()) runners[impl] = std::move(*r);
  }
  return runners[impl].get();
}

fc::MatmulArgs Args(int dtype, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                    const void* bias, void* out, int allow_tf32) {
  fc::MatmulArgs args;
  args.dtype = static_cast<fusebox::DType>(dtype);
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a;
  args.b = b;
  args.bias = bias;
  args.out = out;
  args.allow_tf32 = allow_tf32 != 0;
  return args;
}
}  // namespace

// dtype: 1 float32, 2 float16, 3 bfloat16 (fusebox::DType); impl: see above.
// Returns 0 on success, 1 if a cuBLASLt code failed, 2 if a tiled launch failed,
// 3 for an unknown impl code.
extern "C" __attribute__((visibility("default"))) int fusebox_bench_matmul(
    int dtype, int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* bias,
    void* out, int allow_tf32, int impl, void* stream) {
  const fc::MatmulArgs args = Args(dtype, m, n, k, a, b, bias, out, allow_tf32);
  auto s = static_cast<cudaStream_t>(stream);
  if (impl < 0 || impl >= kNumImpls) return 3;
  if (IsCublasLt(impl)) {
    auto* r = Runner(impl);
    return r != nullptr && r->Run(args, s).ok() ? 0 : 1;
  }
  const auto which = impl == 2 ? fc::TiledKernel::kMmaSync : fc::TiledKernel::kAuto;
  return fc::LaunchMatmulReluTiledWith(which, args, s) == cudaSuccess ? 0 : 2;
}

// The workspace bytes a cuBLASLt impl code offers (-1: not a cuBLASLt code),
// so the harness can label which code is the server's default.
extern "C" __attribute__((visibility("default"))) int64_t fusebox_bench_workspace_bytes(int impl) {
  return WorkspaceOf(impl);
}

// Writes the algorithm a cuBLASLt impl code uses for these arguments into buf
// (NUL-terminated, truncated to len), with how it was chosen ("choice ...",
// matmul_tuning.h's DescribeAlgo). On a first call of the key it is
// chosen now, as the first Run would: code 0 may time its two picks on
// `stream`, writing `out`. Returns 0 on success, 1 on failure (the message is
// written to buf).
extern "C" __attribute__((visibility("default"))) int fusebox_bench_matmul_algo(
    int dtype, int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* bias,
    void* out, int allow_tf32, int impl, void* stream, char* buf, int len) {
  if (buf == nullptr || len <= 0) return 1;
  std::string text;
  int rc = 1;
  if (auto* r = Runner(impl); r == nullptr) {
    text = "not a cuBLASLt impl code, or its runner failed to start";
  } else if (auto d = fc::DescribeAlgo(*r, Args(dtype, m, n, k, a, b, bias, out, allow_tf32),
                                         static_cast<cudaStream_t>(stream));
             d.ok()) {
    text = *d;
    rc = 0;
  } else {
    text = std::string(d.status().message());
  }
  const size_t n_copy = std::min(text.size(), static_cast<size_t>(len - 1));
  std::memcpy(buf, text.data(), n_copy);
  buf[n_copy] = '\0';
  return rc;
}
