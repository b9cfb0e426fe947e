// Times fusebox's memory-bound launchers (kernels/cuda/launch.h) on the benchmark shapes: GeLU
// 2^28 elements; softmax and row sum 262144x128, 65536x1024, 8192x8192, 2048x32768, 128x1048576;
// float32 and bfloat16 (float16 with --fp16). Also times the forced kernel variants of
// memory_bound_variants.h (kernels/cuda/tuning.h), a cudaMemcpy device-to-device copy as a
// ceiling and the 64 MiB read our row sum reaches.
//
// Method (the same as memory_bound_peers.py, so the numbers compare): before every timed launch
// the L2 is flushed by reading a 256 MiB buffer (clean lines, nothing left to write back); the
// launch is bracketed by CUDA events on its stream; 3 warm-up launches, then the median of
// --reps (default 30). Inputs are random (device-side hash fill), never zeros. Bytes counted:
// each input read once plus each output written once. Memory: 2 GiB + 256 MiB.
//
// usage: fusebox_gpu_bench_memory_bound [--json PATH] [--reps N] [--no-variants] [--fp16] [--filter TEXT]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/gpu/check_cuda.h"
#include "bench/gpu/memory_bound_fill.h"
#include "bench/gpu/memory_bound_variants.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tuning.h"

namespace fusebox::bench {
namespace {

struct Record {
  std::string op, dtype, impl, desc, error;
  int64_t rows = 0, cols = 0;
  double bytes = 0, ms = 0, ms_min = 0, ms_max = 0;
};

class Timer {
 public:
  Timer(cudaStream_t s, int reps) : s_(s), reps_(reps) {
    CHECK_CUDA(cudaMalloc(&flush_, kFlushBytes));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&flush_out_), kFlushBytes / cuda::kFlushRowBytes * sizeof(float)));
    CHECK_CUDA(FillUniform(DType::kFloat32, flush_, kFlushBytes / 4, -1.f, 1.f, 7, s_));
    start_.resize(reps);
    stop_.resize(reps);
    for (int i = 0; i < reps; ++i) {
      CHECK_CUDA(cudaEventCreate(&start_[i]));
      CHECK_CUDA(cudaEventCreate(&stop_[i]));
    }
  }
  // Reads 256 MiB with plain loads: evicts whatever the previous launch left in L2 without leaving
  // dirty lines (cuda::FlushL2).
  void Flush() { CHECK_CUDA(cuda::FlushL2(flush_, kFlushBytes, flush_out_, s_)); }

  // Returns false (and the error) when the launch fails.
  bool Time(const std::function<cudaError_t()>& fn, Record* r) {
    for (int i = 0; i < 3; ++i) {
      Flush();
      const cudaError_t e = fn();
      if (e != cudaSuccess) {
        r->error = cudaGetErrorString(e);
        cudaGetLastError();
        return false;
      }
    }
    for (int i = 0; i < reps_; ++i) {
      Flush();
      CHECK_CUDA(cudaEventRecord(start_[i], s_));
      CHECK_CUDA(fn());
      CHECK_CUDA(cudaEventRecord(stop_[i], s_));
    }
    CHECK_CUDA(cudaStreamSynchronize(s_));
    std::vector<double> t(reps_);
    for (int i = 0; i < reps_; ++i) {
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start_[i], stop_[i]));
      t[i] = ms;
    }
    std::sort(t.begin(), t.end());
    r->ms = reps_ % 2 ? t[reps_ / 2] : 0.5 * (t[reps_ / 2 - 1] + t[reps_ / 2]);
    r->ms_min = t.front();
    r->ms_max = t.back();
    return true;
  }

 private:
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  cudaStream_t s_;
  int reps_;
  void* flush_ = nullptr;
  float* flush_out_ = nullptr;
  std::vector<cudaEvent_t> start_, stop_;
};

double GBps(const Record& r) { return r.ms > 0 ? r.bytes / (r.ms * 1e6) : 0; }

void WriteJson(const char* path, const std::string& gpu, const std::vector<Record>& recs) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::perror(path);
    return;
  }
  std::fprintf(f, "{\"gpu\": \"%s\", \"method\": \"L2 flushed by a 256 MiB read before each launch; "
                  "CUDA events; median\", \"records\": [\n", gpu.c_str());
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    std::fprintf(f,
                 "  {\"op\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"impl\": \"%s\", "
                 "\"desc\": \"%s\", \"bytes\": %.0f, \"ms\": %.6f, \"ms_min\": %.6f, \"ms_max\": %.6f, "
                 "\"gbps\": %.1f, \"error\": \"%s\"}%s\n",
                 r.op.c_str(), r.dtype.c_str(), static_cast<long long>(r.rows), static_cast<long long>(r.cols),
                 r.impl.c_str(), r.desc.c_str(), r.bytes, r.ms, r.ms_min, r.ms_max, GBps(r), r.error.c_str(),
                 i + 1 < recs.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace
}  // namespace fusebox::bench

int main(int argc, char** argv) {
  using namespace fusebox;
  using namespace fusebox::bench;
  const char* json = nullptr;
  const char* filter = nullptr;
  int reps = 30;
  bool variants = true, fp16 = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--no-variants")) {
      variants = false;
    } else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) {
      filter = argv[++i];
    } else if (!std::strcmp(argv[i], "--fp16")) {
      fp16 = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--reps N] [--no-variants] [--fp16] [--filter TEXT]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Timer timer(s, reps);
  const size_t kBuf = size_t{1} << 30;
  void *in = nullptr, *out = nullptr;
  CHECK_CUDA(cudaMalloc(&in, kBuf));
  CHECK_CUDA(cudaMalloc(&out, kBuf));
  const size_t kWorkspace = size_t{16} << 20;  // softmax's split path: rows x 64 pairs at most
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, kWorkspace));
  std::vector<Record> recs;
  uint64_t seed = 12345;

  // --filter: only records whose "op dtype ROWSxCOLS impl" contains TEXT (for profiling one case).
  auto selected = [&](const Record& r) {
    if (filter == nullptr) return true;
    const std::string key = r.op + " " + r.dtype + " " + std::to_string(r.rows) + "x" + std::to_string(r.cols) +
                            " " + r.impl;
    return key.find(filter) != std::string::npos;
  };
  auto emit = [&](Record r) {
    std::printf("%-8s %-9s %7lldx%-8lld %-34s %9.4f ms %8.1f GB/s %s\n", r.op.c_str(), r.dtype.c_str(),
                static_cast<long long>(r.rows), static_cast<long long>(r.cols),
                (r.impl + (r.desc.empty() ? "" : " [" + r.desc + "]")).substr(0, 34).c_str(), r.ms, GBps(r),
                r.error.c_str());
    std::fflush(stdout);
    recs.push_back(std::move(r));
  };

  if (filter == nullptr) {  // Copy ceiling as the runtime sees it (1 GiB read + 1 GiB written).
    Record r;
    r.op = "ceiling_copy";
    r.dtype = "bytes";
    r.impl = "cudaMemcpyAsync";
    r.rows = 1;
    r.cols = static_cast<int64_t>(kBuf);
    r.bytes = 2.0 * kBuf;
    timer.Time([&] { return cudaMemcpyAsync(out, in, kBuf, cudaMemcpyDeviceToDevice, s); }, &r);
    emit(r);
    // What one 64 MiB read reaches (the size of bf16 262144x128): our long-row row sum over fp32
    // 2048x8192, the kernel that reads 8192^2 at the 1 GiB read ceiling.
    Record rr;
    rr.op = "ceiling_read_64MiB_rowsum";
    rr.dtype = "float32";
    rr.impl = "ours rowsum 2048x8192";
    rr.rows = 2048;
    rr.cols = 8192;
    rr.bytes = 4.0 * rr.rows * rr.cols + 4.0 * rr.rows;
    CHECK_CUDA(FillUniform(DType::kFloat32, in, rr.rows * rr.cols, -1.f, 1.f, ++seed, s));
    timer.Time([&] {
      return cuda::LaunchRowSum(DType::kFloat32, in, static_cast<float*>(out), rr.rows, rr.cols, s);
    }, &rr);
    emit(rr);
  }

  std::vector<DType> dtypes = {DType::kFloat32, DType::kBFloat16};
  if (fp16) dtypes.push_back(DType::kFloat16);
  const std::vector<Variant> all_variants = Variants();
  for (DType dt : dtypes) {
    const size_t es = ElementSize(dt);
    {  // GeLU
      const int64_t n = kGeluElements;
      CHECK_CUDA(FillUniform(dt, in, n, -4.f, 4.f, ++seed, s));
      Record r;
      r.op = "gelu";
      r.dtype = DTypeName(dt);
      r.impl = "ours";
      r.rows = 1;
      r.cols = n;
      r.bytes = 2.0 * n * es;
      if (selected(r)) {
        timer.Time([&] { return cuda::LaunchGelu(dt, in, out, n, s); }, &r);
        emit(r);
      }
      if (variants) {
        for (const Variant& v : all_variants) {
          if (v.op != "gelu" || v.dtype != dt) continue;
          Record rv = r;
          rv.impl = "ours:" + v.label;
          if (!selected(rv)) continue;
          timer.Time([&] { return cuda::LaunchGeluWith(v.choice, dt, in, out, n, s); }, &rv);
          emit(rv);
        }
        r.impl = "ours:auto-repeat";
        if (selected(r)) {
          timer.Time([&] { return cuda::LaunchGelu(dt, in, out, n, s); }, &r);
          emit(r);
        }
      }
    }
    for (const char* op : {"softmax", "rowsum"}) {
      const bool sm = !std::strcmp(op, "softmax");
      for (const Shape& sh : RowShapes()) {
        const int64_t n = sh.rows * sh.cols;
        CHECK_CUDA(FillUniform(dt, in, n, -4.f, 4.f, ++seed, s));
        auto run = [&](const cuda::KernelChoice& k, const std::string& impl) {
          Record r;
          r.op = op;
          r.dtype = DTypeName(dt);
          r.impl = impl;
          r.rows = sh.rows;
          r.cols = sh.cols;
          if (!selected(r)) return;
          char desc[128];
          if (sm) {
            r.bytes = 2.0 * n * es;
            cuda::DescribeSoftmax(dt, in, out, sh.rows, sh.cols, k, desc, sizeof desc, kWorkspace);
            r.desc = desc;
            const cuda::Workspace w{ws, kWorkspace};
            timer.Time([&] { return cuda::LaunchSoftmaxWith(k, dt, in, out, sh.rows, sh.cols, s, w); }, &r);
          } else {
            r.bytes = 1.0 * n * es + 4.0 * sh.rows;
            cuda::DescribeRowSum(dt, in, sh.rows, sh.cols, k, desc, sizeof desc);
            r.desc = desc;
            timer.Time(
                [&] { return cuda::LaunchRowSumWith(k, dt, in, static_cast<float*>(out), sh.rows, sh.cols, s); },
                &r);
          }
          emit(r);
        };
        run(cuda::KernelChoice{}, "ours");
        if (!variants) continue;
        for (const Variant& v : all_variants) {
          if (v.op == op && v.dtype == dt && v.shape.rows == sh.rows && v.shape.cols == sh.cols) {
            run(v.choice, "ours:" + v.label);
          }
        }
        run(cuda::KernelChoice{}, "ours:auto-repeat");  // the same launch again: run-to-run spread
      }
    }
  }
  if (json != nullptr) WriteJson(json, prop.name, recs);
  CHECK_CUDA(cudaFree(ws));
  CHECK_CUDA(cudaFree(in));
  CHECK_CUDA(cudaFree(out));
  return 0;
}
