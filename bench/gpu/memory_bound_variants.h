// The benchmark shapes for the memory-bound ops, and the forced kernel variants the benchmark
// times beside the automatic choice (kernels/cuda/tuning.h, KernelChoice): mostly the choices the
// automatic one was measured against, so that a change in the hardware or the compiler that
// reverses a decision shows up. The GPU tests run every variant too (on fewer rows), so a variant
// that is timed is also checked.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/tuning.h"
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
                                 int pipeline = 0, int streaming = 0, int exp_once = 0, int split = 0) {
  cuda::KernelChoice k;
  k.threads_per_row = tpr;
  k.vectors_per_thread = vpt;
  k.cluster = cluster;
  k.threads = threads;
  k.smem_bytes = smem;
  k.long_rows = long_rows;
  k.pipeline = pipeline;
  k.streaming = streaming;
  k.exp_once = exp_once;
  k.split = split;
  return k;
}

struct Variant {
  std::string op;  // "gelu", "softmax" or "rowsum"
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
  const Shape g{1, kGeluElements};
  const int kPlain = -1;
  for (D d : {D::kFloat32, D::kBFloat16}) {
    add("gelu", g, d, Choice(0, 4, 0, 256, 0, 0, 0, 1), "u=4 t=256 cs");
    add("gelu", g, d, Choice(0, 2, 0, 128, 0, 0, 0, kPlain), "u=2 t=128 plain");
    add("gelu", g, d, Choice(0, 2, 0, 128, 0, 0, 0, 1), "u=2 t=128 cs");
    add("gelu", g, d, Choice(0, 8, 0, 256, 0, 0, 0, kPlain), "u=8 t=256 plain");
  }
  // ---- softmax (the pipelined kernel is slower than the one-shot one on every shape)
  add("softmax", {262144, 128}, D::kFloat32, Choice(8, 4, 0, 0, 0, -1), "rows tpr=8 v=4");
  add("softmax", {262144, 128}, D::kFloat32, Choice(16, 4, 0, 0, 0, -1, 0, kPlain), "rows tpr=16 plain");
  add("softmax", {262144, 128}, D::kBFloat16, Choice(4, 4, 0, 0, 0, -1, 0, kPlain), "rows tpr=4 plain");
  add("softmax", {262144, 128}, D::kBFloat16, Choice(16, 4, 0, 0, 0, -1), "rows tpr=16 v=4");
  add("softmax", {65536, 1024}, D::kFloat32, Choice(0, 2, 1, 128, 0, 1), "block t=128 v=2");
  add("softmax", {65536, 1024}, D::kFloat32, Choice(0, 8, 0, 0, 0, -1, 0, kPlain), "rows tpr=32 plain");
  add("softmax", {65536, 1024}, D::kBFloat16, Choice(0, 1, 1, 128, 0, 1), "block t=128 v=1");
  add("softmax", {65536, 1024}, D::kBFloat16, Choice(0, 2, 1, 64, 0, 1), "block t=64 v=2");
  add("softmax", {65536, 1024}, D::kBFloat16, Choice(0, 4, 0, 0, 0, -1, 0, kPlain), "rows tpr=32 plain");
  // Short rows: e^(x - max) recomputed rather than kept in registers, block sizes (automatic: one
  // warp per block when a warp holds a row, else 256).
  for (D d : {D::kFloat32, D::kBFloat16}) {
    for (Shape sh : {Shape{262144, 128}, Shape{65536, 1024}}) {
      add("softmax", sh, d, Choice(0, 0, 0, 0, 0, 0, 0, 0, -1), "rows recompute exp");
      add("softmax", sh, d, Choice(0, 0, 0, 0, 0, -1, -1), "rows bounds-checked");  // not Exact
      add("softmax", sh, d, Choice(0, 0, 0, 64, 0, -1), "rows t=64");
      add("softmax", sh, d, Choice(0, 0, 0, 128, 0, -1), "rows t=128");
      add("softmax", sh, d, Choice(0, 0, 0, 256, 0, -1), "rows t=256");
    }
  }
  // The row-block kernel at 128 x 8 (against bf16's exact kernel at 512 x 2) and the exact kernel
  // for fp32 (against its recomputing one).
  add("softmax", {8192, 8192}, D::kBFloat16, Choice(0, 0, 0, 0, 0, 0, 0, 0, -1), "rowblock recompute");
  add("softmax", {8192, 8192}, D::kFloat32, Choice(0, 0, 0, 0, 0, 0, 0, 0, 1), "rowblock exact");
  add("softmax", {8192, 8192}, D::kFloat32, Choice(0, 4, 1, 512, 0, 1), "block t=512 v=4");
  add("softmax", {8192, 8192}, D::kFloat32, Choice(0, 8, 1, 256, 0, 1, 0, kPlain), "block t=256 plain");
  add("softmax", {8192, 8192}, D::kBFloat16, Choice(0, 2, 1, 512, 0, 1), "block t=512 v=2");
  add("softmax", {8192, 8192}, D::kBFloat16, Choice(0, 4, 1, 256, 0, 1), "block t=256 v=4");
  add("softmax", {8192, 8192}, D::kBFloat16, Choice(0, 2, 1, 512, 0, 1, 0, kPlain), "block t=512 v=2 plain");
  add("softmax", {2048, 32768}, D::kFloat32, Choice(0, 8, 1, 512, 0, 1, 0, kPlain), "block +smem plain");
  add("softmax", {2048, 32768}, D::kFloat32, Choice(0, 4, 1, 512, 0, 1), "block t=512 v=4 +smem");
  add("softmax", {2048, 32768}, D::kBFloat16, Choice(0, 8, 1, 512, 0, 1, 0, kPlain), "block t=512 plain");
  add("softmax", {2048, 32768}, D::kBFloat16, Choice(0, 4, 1, 512, 0, 1), "block t=512 v=4 +smem");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 4, 16, 512, 0, 1), "c=16 v=4");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 8, 8, 512, 0, 1), "c=8 +smem +L2");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 8, 16, 512, 0, 1, 0, kPlain), "c=16 v=8 plain");
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 4, 16, 512, 98304, 1), "c=16 96K smem +L2");
  // Clusters of 15 (fp32: 15 x 288 KiB hold a 4 MiB row; if 8 clusters of 15 fit where 7 of 16
  // do, 128 rows take 16 waves instead of 19) and other non-power-of-two sizes.
  add("softmax", {128, 1048576}, D::kFloat32, Choice(0, 8, 15, 512, 0, 1), "c=15 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 15, 512, 0, 1), "c=15 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 12, 512, 0, 1), "c=12 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 10, 512, 0, 1), "c=10 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 4, 16, 512, 0, 1), "c=16 v=4");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 8, 512, 0, 1), "c=8 v=8");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 16, 512, 0, 1, 0, kPlain), "c=16 v=8 plain");
  add("softmax", {128, 1048576}, D::kBFloat16, Choice(0, 8, 16, 512, 0, 1, 1), "pipe c=16 v=8");
  // e^(x - max) as (x - max) x log2(e), the two-step form (automatic: one FFMA where |max| <= 32).
  for (D d : {D::kFloat32, D::kBFloat16}) {
    for (const Shape& sh : RowShapes()) {
      cuda::KernelChoice k;
      k.exp_fma = -1;
      add("softmax", sh, d, k, "exp two-step");
    }
  }
  // 8192-column rows: the chunk kernel (cluster of 1) instead of the row-block one, and the lean
  // row-block kernel with other geometries.
  for (D d : {D::kFloat32, D::kBFloat16}) {
    add("softmax", {8192, 8192}, d, Choice(0, 0, 1, 0, 0, 1), "chunk kernel c=1");
    add("softmax", {8192, 8192}, d, Choice(0, 4, 0, 256, 0, 1), "t=256 v=4");
  }
  // Rows split over plain blocks meeting in the workspace (the automatic choice for
  // 128x1048576 is 32 x (256 threads, 8 accesses) with the 1/4 L2 prefetch). Alternatives
  // that came close, and the prefetch at other distances (half: the L2 thrashes).
  auto split = [&](D d, int blocks, int threads, int vpt, int prefetch) {
    cuda::KernelChoice k = Choice(0, vpt, 0, threads, 0, 1, 0, 0, 0, blocks);
    k.prefetch = prefetch;
    std::string label =
        "split=" + std::to_string(blocks) + " t=" + std::to_string(threads) + " v=" + std::to_string(vpt);
    if (prefetch) label += " prefetch=" + std::to_string(std::max(0, prefetch));
    add("softmax", {128, 1048576}, d, k, label.c_str());
  };
  split(D::kFloat32, 32, 512, 4, 0);
  split(D::kFloat32, 32, 256, 8, -1);
  split(D::kFloat32, 32, 256, 8, 2);
  split(D::kFloat32, 64, 256, 8, 0);
  split(D::kBFloat16, 16, 512, 4, 0);
  split(D::kBFloat16, 32, 256, 4, 0);
  split(D::kBFloat16, 32, 256, 8, -1);  // the automatic choice without the prefetch
  // The same L2 prefetch on block-per-row shapes (+-1% at 1/2, -20% at 1/1; the
  // row-block kernels' own prefetching form, fp32 +0-2.3% at 1/4, 2-byte rows -1-3%).
  for (D d : {D::kFloat32, D::kBFloat16}) {
    for (int q : {-1, 1, 2}) {
      cuda::KernelChoice k;
      k.prefetch = q;
      add("softmax", {8192, 8192}, d, k, q < 0 ? "auto no prefetch" : q == 1 ? "auto prefetch=1" : "auto prefetch=2");
    }
  }
  // The row-block kernel at 256 threads x 8 (against fp32 8192^2's automatic 512 x 4).
  add("softmax", {8192, 8192}, D::kFloat32, Choice(0, 8, 0, 256, 0, 0), "rowblock t=256 v=8");
  // ---- row sum
  for (D d : {D::kFloat32, D::kBFloat16}) {
    for (const Shape& s : RowShapes()) add("rowsum", s, d, Choice(0, 0, 0, 0, 0, 0, 0, kPlain), "auto plain");
  }
  add("rowsum", {262144, 128}, D::kFloat32, Choice(8, 0, 0, 0, 0, -1, 0, kPlain), "rows tpr=8 plain");
  add("rowsum", {262144, 128}, D::kBFloat16, Choice(8, 0, 0, 0, 0, -1, 0, kPlain), "rows tpr=8 plain");
  add("rowsum", {262144, 128}, D::kBFloat16, Choice(4, 0, 0, 512, 0, -1, 0, kPlain), "rows tpr=4 t=512 plain");
  add("rowsum", {65536, 1024}, D::kFloat32, Choice(32, 0, 0, 0, 0, -1), "rows tpr=32");
  add("rowsum", {8192, 8192}, D::kBFloat16, Choice(32, 0, 0, 0, 0, -1), "rows tpr=32 (was auto)");
  add("rowsum", {128, 1048576}, D::kFloat32, Choice(0, 0, 4, 0, 0, 1), "cluster c=4");
  // Rows of one batch are the automatic choice at 8192 columns (bf16 512 x 2, fp32 512 x 4);
  // "block u=8 t=256" below is fp32's loop-kernel alternative there.
  // Long rows: loads in flight per thread x threads per block (automatic: 256 threads with the
  // most of 16 / 8 / 4 loads that a thread's accesses fill).
  for (D d : {D::kFloat32, D::kBFloat16}) {
    for (Shape sh : {Shape{8192, 8192}, Shape{2048, 32768}, Shape{128, 1048576}}) {
      add("rowsum", sh, d, Choice(0, 4, 0, 256, 0, 1), "block u=4 t=256");
      add("rowsum", sh, d, Choice(0, 8, 0, 256, 0, 1), "block u=8 t=256 (old default)");
      add("rowsum", sh, d, Choice(0, 16, 0, 256, 0, 1), "block u=16 t=256");
      add("rowsum", sh, d, Choice(0, 8, 0, 512, 0, 1), "block u=8 t=512");
    }
  }
  return v;
}

}  // namespace fusebox::bench
