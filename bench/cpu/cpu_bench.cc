// fusebox_cpu_bench: times the CPU kernels (kernels/cpu) on the sizes the
// project's goals name, one JSON line per case on stdout:
//   GeLU 2^24, softmax 4096x4096, matmul+ReLU 1024^3 (float32), plus row sum
//   4096x4096 and the half types with --all.
// Each case: inputs filled once, `--warmup` untimed runs, then `--runs` timed
// runs (steady_clock); reports median and min in ms and the effective GB/s
// (bytes read + written once) or GFLOP/s (2MNK). Flags:
//   --runs N (default 15)  --warmup N (3)  --threads N (0 = all cores)
//   --isa generic|avx2|avx512 (default: best supported)  --only NAME  --all
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

// OpenBLAS's name for the kernel it picked (weak: null with another BLAS).
extern "C" char* openblas_get_corename() __attribute__((weak));

namespace {

using fusebox::DType;
namespace cpu = fusebox::cpu;

struct Options {
  int runs = 15, warmup = 3, threads = 0;
  std::string isa, only;
  bool all = false;
};

std::vector<uint8_t> RandomBytes(DType dt, int64_t n, float lo, float hi) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * fusebox::ElementSize(dt));
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < n; ++i) fusebox::StoreFromFloat(dt, b.data(), i, dist(rng));
  return b;
}

void Run(const Options& o, const std::string& op, DType dt, const std::string& shape,
         double bytes, double flops, const std::function<absl::Status()>& fn) {
  if (!o.only.empty() && o.only != op) return;
  for (int i = 0; i < o.warmup; ++i) {
    if (absl::Status s = fn(); !s.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", op.c_str(), std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  std::vector<double> ms;
  for (int i = 0; i < o.runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)fn();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf(
      "{\"op\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, "
      "\"runs\": %d, \"gb_per_s\": %.2f, \"gflop_per_s\": %.2f, \"isa\": \"%s\", \"threads\": %d, "
      "\"blas_core\": \"%s\"}\n",
      op.c_str(), fusebox::DTypeName(dt), shape.c_str(), median, ms.front(), o.runs,
      bytes / median / 1e6, flops / median / 1e6, cpu::simd::Active().name, cpu::CpuThreads(),
      openblas_get_corename != nullptr ? openblas_get_corename() : "unknown");
  std::fflush(stdout);
}

void Bench(const Options& o, DType dt) {
  const double es = static_cast<double>(fusebox::ElementSize(dt));
  {
    const int64_t n = int64_t{1} << 24;
    const auto in = RandomBytes(dt, n, -5, 5);
    std::vector<uint8_t> out(in.size());
    Run(o, "gelu", dt, "16777216", 2 * es * n, 0,
        [&] { return cpu::Gelu(dt, in.data(), out.data(), n); });
  }
  {
    const int64_t rows = 4096, cols = 4096;
    const auto in = RandomBytes(dt, rows * cols, -5, 5);
    std::vector<uint8_t> out(in.size());
    Run(o, "softmax", dt, "4096x4096", 2 * es * rows * cols, 0,
        [&] { return cpu::Softmax(dt, in.data(), out.data(), rows, cols); });
    std::vector<float> sums(rows);
    if (o.all) {
      Run(o, "rowsum", dt, "4096x4096", es * rows * cols, 0,
          [&] { return cpu::RowSum(dt, in.data(), sums.data(), rows, cols); });
    }
  }
  {
    const int64_t m = 1024, n = 1024, k = 1024;
    const auto a = RandomBytes(dt, m * k, -1, 1), b = RandomBytes(dt, k * n, -1, 1);
    std::vector<uint8_t> out(static_cast<size_t>(m * n) * fusebox::ElementSize(dt));
    Run(o, "matmul_relu", dt, "1024x1024x1024", es * (m * k + k * n + m * n), 2.0 * m * n * k,
        [&] { return cpu::MatmulRelu(dt, a.data(), b.data(), nullptr, out.data(), m, n, k); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") o.runs = std::max(1, std::atoi(next().c_str()));
    else if (a == "--warmup") o.warmup = std::max(0, std::atoi(next().c_str()));
    else if (a == "--threads") o.threads = std::atoi(next().c_str());
    else if (a == "--isa") o.isa = next();
    else if (a == "--only") o.only = next();
    else if (a == "--all") o.all = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--runs N] [--warmup N] [--threads N] [--isa generic|avx2|avx512] "
                   "[--only gelu|softmax|rowsum|matmul_relu] [--all]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!o.isa.empty() && !cpu::simd::ForceIsa(o.isa)) {
    std::fprintf(stderr, "instruction set %s is not supported here\n", o.isa.c_str());
    return 2;
  }
  cpu::SetCpuThreads(o.threads);
  Bench(o, DType::kFloat32);
  if (o.all) {
    Bench(o, DType::kFloat16);
    Bench(o, DType::kBFloat16);
  }
  return 0;
}
