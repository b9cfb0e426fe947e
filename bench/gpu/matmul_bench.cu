// matmul_bench: times our matmul+ReLU (cuBLASLt path, with and without bias,
// and the tiled kernel) on the benchmark shapes for fp32 (exact and TF32), fp16
// and bf16. Each config: random inputs in [-1, 1) (never zeros), 3 warm-up
// launches, then repetitions each preceded by a 256 MiB read that evicts L2
// (as interleaved_timer.py does for the torch peers), timed with CUDA
// events around the launch alone; the median is reported. Correctness: the
// tiled output is compared with the cuBLASLt output (relative L2 error) and
// both are checked for NaN. One JSON object per line to --json (and stdout).
// Cost: about 15 s on an H200 (the exact-fp32 runs dominate).
//
// usage: matmul_bench [--json FILE] [--quick]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/gpu/check_cuda.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tuning.h"

namespace {

using fusebox::DType;
namespace fc = fusebox::cuda;

__device__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x >> 16);
}

// Uniform [-1, 1) that is never exactly zero.
__global__ void FillRandom(void* p, int64_t n, DType dt, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = (Hash(i, seed) & 0xFFFFFF) / 8388608.0f - 1.0f;
    if (v == 0.f) v = 0.5f;
    switch (dt) {
      case DType::kFloat32: static_cast<float*>(p)[i] = v; break;
      case DType::kFloat16: static_cast<__half*>(p)[i] = __float2half(v); break;
      default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); break;
    }
  }
}

__device__ float Load(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// acc[0] += sum (x - y)^2, acc[1] += sum y^2, acc[2] += NaN count in x and y.
__global__ void Diff(const void* x, const void* y, int64_t n, DType dt, double* acc) {
  double d = 0, r = 0, nan = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = Load(x, i, dt), b = Load(y, i, dt);
    if (isnan(a) || isnan(b)) {
      nan += 1;
      continue;
    }
    d += double(a - b) * (a - b);
    r += double(b) * b;
  }
  for (int o = 16; o > 0; o >>= 1) {
    d += __shfl_down_sync(0xffffffff, d, o);
    r += __shfl_down_sync(0xffffffff, r, o);
    nan += __shfl_down_sync(0xffffffff, nan, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&acc[0], d);
    atomicAdd(&acc[1], r);
    atomicAdd(&acc[2], nan);
  }
}

struct Mode {
  const char* name;
  DType dt;
  bool tf32;
};

struct Shape {
  int64_t m, n, k;
};

class Timer {
 public:
  Timer() {
    CHECK_CUDA(cudaMalloc(&flush_, kFlushBytes + kSumsBytes));
    CHECK_CUDA(cudaMemset(flush_, 0, kFlushBytes + kSumsBytes));
    CHECK_CUDA(cudaEventCreate(&a_));
    CHECK_CUDA(cudaEventCreate(&b_));
  }
  ~Timer() {
    cudaFree(flush_);
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  // Median milliseconds of `fn` over reps, L2 flushed before each.
  template <typename Fn>
  double Median(Fn fn, int warmup, double budget_ms, double* min_ms, int* reps_out) {
    for (int i = 0; i < warmup; ++i) fn();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> t;
    double spent = 0;
    while ((spent < budget_ms && t.size() < 100) || t.size() < 5) {
      Flush();
      CHECK_CUDA(cudaEventRecord(a_, nullptr));
      fn();
      CHECK_CUDA(cudaEventRecord(b_, nullptr));
      CHECK_CUDA(cudaEventSynchronize(b_));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, a_, b_));
      t.push_back(ms);
      spent += ms;
    }
    std::sort(t.begin(), t.end());
    *min_ms = t.front();
    *reps_out = static_cast<int>(t.size());
    return t[t.size() / 2];
  }

 private:
  // Reads 256 MiB (fc::FlushL2, into a tail of the same buffer): evicts the operands from L2
  // without leaving dirty lines for the timed launch to write back, as a memset did.
  void Flush() {
    float* sums = reinterpret_cast<float*>(static_cast<char*>(flush_) + kFlushBytes);
    CHECK_CUDA(fc::FlushL2(flush_, kFlushBytes, sums, nullptr));
  }
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  static constexpr size_t kSumsBytes = kFlushBytes / fc::kFlushRowBytes * sizeof(float);
  void* flush_ = nullptr;
  cudaEvent_t a_, b_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  std::vector<Shape> shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}, {4000, 4000, 4000},
                               {16384, 16384, 256}, {64, 4096, 4096}};
  if (quick) shapes = {{8192, 8192, 8192}};
  const Mode modes[] = {{"fp32", DType::kFloat32, false},
                        {"tf32", DType::kFloat32, true},
                        {"fp16", DType::kFloat16, false},
                        {"bf16", DType::kBFloat16, false}};
  auto lt_or = fc::CublasLtMatmul::Create(fc::NewMatmulAlgoCache());
  if (!lt_or.ok()) {
    std::fprintf(stderr, "cuBLASLt: %s\n", std::string(lt_or.status().message()).c_str());
    return 1;
  }
  fc::CublasLtMatmul& lt = **lt_or;
  Timer timer;
  double* acc = nullptr;
  CHECK_CUDA(cudaMalloc(&acc, 3 * sizeof(double)));
  int failures = 0;

  for (const Shape& s : shapes) {
    for (const Mode& mode : modes) {
      const size_t es = fusebox::ElementSize(mode.dt);
      void *a, *b, *bias, *c_lt, *c_tiled;
      CHECK_CUDA(cudaMalloc(&a, s.m * s.k * es));
      CHECK_CUDA(cudaMalloc(&b, s.k * s.n * es));
      CHECK_CUDA(cudaMalloc(&bias, s.n * es));
      CHECK_CUDA(cudaMalloc(&c_lt, s.m * s.n * es));
      CHECK_CUDA(cudaMalloc(&c_tiled, s.m * s.n * es));
      FillRandom<<<1024, 256>>>(a, s.m * s.k, mode.dt, 1);
      FillRandom<<<1024, 256>>>(b, s.k * s.n, mode.dt, 2);
      FillRandom<<<64, 256>>>(bias, s.n, mode.dt, 3);
      CHECK_CUDA(cudaGetLastError());
      const double flops = 2.0 * s.m * s.n * s.k;

      struct Variant {
        const char* impl;
        bool bias;
      };
      std::vector<Variant> variants = {{"cublaslt", false}, {"cublaslt", true}};
      if (!mode.tf32) variants.push_back({"tiled", true});  // the tiled kernel never uses TF32
      if (mode.dt != DType::kFloat32) variants.push_back({"tiled_mma", true});  // mma.sync forced
      for (const Variant& v : variants) {
        fc::MatmulArgs args;
        args.dtype = mode.dt;
        args.m = s.m;
        args.n = s.n;
        args.k = s.k;
        args.a = a;
        args.b = b;
        args.bias = v.bias ? bias : nullptr;
        args.allow_tf32 = mode.tf32;
        const bool tiled = !std::strncmp(v.impl, "tiled", 5);
        const fc::TiledKernel which =
            !std::strcmp(v.impl, "tiled_mma") ? fc::TiledKernel::kMmaSync : fc::TiledKernel::kAuto;
        args.out = tiled ? c_tiled : c_lt;
        bool failed = false;
        auto run = [&] {
          if (tiled) {
            if (fc::LaunchMatmulReluTiledWith(which, args, nullptr) != cudaSuccess) failed = true;
          } else if (!lt.Run(args, nullptr).ok()) {
            failed = true;
          }
        };
        double min_ms = 0;
        int reps = 0;
        const double med = timer.Median(run, 3, quick ? 60 : 80, &min_ms, &reps);
        CHECK_CUDA(cudaDeviceSynchronize());
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"impl\": \"%s\", \"mode\": \"%s\", \"bias\": %s, \"m\": %lld, \"n\": %lld, "
                      "\"k\": %lld, \"median_ms\": %.5f, \"min_ms\": %.5f, \"reps\": %d, "
                      "\"tflops\": %.2f, \"ok\": %s",
                      v.impl, mode.name, v.bias ? "true" : "false", (long long)s.m, (long long)s.n,
                      (long long)s.k, med, min_ms, reps, failed ? 0.0 : flops / (med * 1e9),
                      failed ? "false" : "true");
        std::string out = line;
        if (tiled) {
          // The tiled result against cuBLASLt's (same inputs, bias, ReLU).
          fc::MatmulArgs ref = args;
          ref.out = c_lt;
          ref.allow_tf32 = false;
          if (!lt.Run(ref, nullptr).ok()) failed = true;
          CHECK_CUDA(cudaMemset(acc, 0, 3 * sizeof(double)));
          Diff<<<1024, 256>>>(c_tiled, c_lt, s.m * s.n, mode.dt, acc);
          double h[3];
          CHECK_CUDA(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
          const double rel = std::sqrt(h[0] / std::max(h[1], 1e-300));
          const double tol = mode.dt == DType::kFloat32 ? 1e-5 : 1e-2;
          const bool good = !failed && h[2] == 0 && rel <= tol;
          if (!good) ++failures;
          char extra[160];
          std::snprintf(extra, sizeof extra, ", \"rel_err_vs_cublaslt\": %.3g, \"nans\": %.0f, \"check\": \"%s\"",
                        rel, h[2], good ? "pass" : "FAIL");
          out += extra;
        } else if (failed) {
          ++failures;
        }
        out += "}";
        std::printf("%s\n", out.c_str());
        std::fflush(stdout);
        if (json) std::fprintf(json, "%s\n", out.c_str());
      }
      cudaFree(a);
      cudaFree(b);
      cudaFree(bias);
      cudaFree(c_lt);
      cudaFree(c_tiled);
    }
  }
  if (json) std::fclose(json);
  std::fprintf(stderr, "matmul_bench: %d failures\n", failures);
  return failures == 0 ? 0 : 2;
}
