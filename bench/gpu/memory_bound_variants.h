// The benchmark shapes of issue 3 for the memory-bound ops, and the forced kernel variants the
// benchmark times beside the automatic choice (kernels/cuda/launch.h, KernelChoice). The GPU
// tests run every variant too (on fewer rows), so a variant that is timed is also checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"
#include "kernels/dtype.h"

namespace fusebox::bench {

struct Shape {
  int64_t rows, cols;
};

inline std::vector<Shape> RowShapes() {
  return {{262144, 128}, {65536, 1024}, {8192, 8192}, {2048, 32768}, {128, 1048576}};
}
constexpr int64_t kGeluElements = int64_t{1} << 28;

inline cuda::KernelChoice Choice(int tpr, int vpt, int cluster, int threads, int smem, int long_rows,
                                 int pipeline = 0) {
  cuda::KernelChoice k;
  k.threads_per_row = tpr;
  k.vectors_per_thread = vpt;
  k.cluster = cluster;
  k.threads = threads;
  k.smem_bytes = smem;
  k.long_rows = long_rows;
  k.pipeline = pipeline;
  return k;
}

struct Variant {
  std::string op;  // "softmax" or "rowsum"
  Shape shape;
  DType dtype;
  cuda::KernelChoice choice;
  std::string label;
};

// Forced alternatives to the automatic choice, per op / shape / dtype (fp32 and bf16).
inline std::vector<Variant> Variants() {
  using D = DType;
  std::vector<Variant> v;
  auto add = [&](const char* op, Shape s, D d, cuda::KernelChoice k, const char* label) {
    v.push_back({op, s, d, k, label});
  };
  // ---- softmax (run 1, 2026-11-29: the one-shot cluster kernel was the default for long rows)
  add("softmax", {262144, 128}, D::kFloat32, Choice(16, 4, 0, 0, 0, -1), "rows tpr=16 v=4");
  add("softmax", {262144, 128}, D::kFloat32, Choice(32, 4, 0, 0, 0, -1), "rows tpr=32 v=4");
  add("softmax", {262144, 128}, D::kBFloat16, Choice(8, 4, 0, 0, 0, -1), "rows tpr=8 v=4");
  add("softmax", {65536, 1024}, D::kFloat32, Choice(0, 8, 1, 32, 0, 1), "block t=32 v=8");
  add("softmax", {65536, 1024}, D::kBFloat16, Choice(16, 8, 0, 0, 0, -1), "rows tpr=16 v=8");
  add("softmax", {8192, 8192}, D::kFloat32, Choice(0, 8, 1, 256, 0, 1, 1), "pipe t=256 v=8");
  add("softmax", {8192, 8192}, D::kBFloat16, Choice(0, 8, 1, 128, 0, 1, 1), "pipe t=128 v=8");
  add("softmax", {2048, 32768}, D::kFloat32, Choice(0, 8, 1, 512, 0, 1, -1), "one-shot t=512 v=8 +smem");
  add("softmax", {2048, 32768}, D::kFloat32, Choice(0, 8, 2, 512, 0, 1, 1), "pipe c=2 t=512 v=8");
  add("softmax", {2048, 32768}, D::kFloat32, Choice(0, 8, 1, 256, 0, 1, 1), "pipe t=256 v=8 +smem");
  add("softmax", {2048, 32768}, D::kBFloat16, Choice(0, 8, 1, 512, 0, 1, 1), "pipe t=512 v=8");
  add("softmax", {2048, 32768}, D::kBFloat16, Choice(0, 8, 1, 256, 0, 1, 1), "pipe t=256 v=8 +smem");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 4, 16, 512, 0, 1, 1), "pipe c=16 v=4");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 4, 16, 512, 0, 1, -1), "one-shot c=16 v=4");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 16, 512, 0, 1, 1), "pipe c=16 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 4, 16, 512, 0, 1, 1), "pipe c=16 v=4");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 4, 16, 512, 0, 1, -1), "one-shot c=16 v=4");
  // ---- row sum
  add("rowsum", {262144, 128}, D::kFloat32, Choice(4, 0, 0, 512, 0, -1), "rows tpr=4 t=512");
  add("rowsum", {262144, 128}, D::kFloat32, Choice(4, 0, 0, 1024, 0, -1), "rows tpr=4 t=1024");
  add("rowsum", {262144, 128}, D::kBFloat16, Choice(8, 0, 0, 0, 0, -1), "rows tpr=8");
  add("rowsum", {262144, 128}, D::kBFloat16, Choice(16, 0, 0, 0, 0, -1), "rows tpr=16");
  add("rowsum", {262144, 128}, D::kBFloat16, Choice(4, 0, 0, 1024, 0, -1), "rows tpr=4 t=1024");
  add("rowsum", {65536, 1024}, D::kFloat32, Choice(16, 0, 0, 0, 0, -1), "rows tpr=16");
  add("rowsum", {65536, 1024}, D::kBFloat16, Choice(32, 0, 0, 0, 0, -1), "rows tpr=32");
  add("rowsum", {8192, 8192}, D::kBFloat16, Choice(32, 0, 0, 0, 0, -1), "rows tpr=32");
  add("rowsum", {2048, 32768}, D::kBFloat16, Choice(0, 0, 2, 0, 0, 1), "cluster c=2");
  add("rowsum", {128, 1048576}, D::kFloat32, Choice(0, 0, 4, 0, 0, 1), "cluster c=4");
  return v;
}

}  // namespace fusebox::bench
