// The four ops on the CPU (ops.h): dtype handling, row/segment decomposition and
// threading around the vector inner loops of simd.h. Half types are widened into
// small L1-resident float blocks (kBlock floats), computed, and narrowed back,
// so they also make one pass over memory. Costs:
//   Gelu        1 read + 1 write per element, ~20 flops (one exp, one divide); from pieces
//               (GeluPieces) the same, each block's bytes first copied into L1.
//   Softmax     rows <= kShortRow columns: 1 read + 1 write from memory (max, exp+sum
//               and scale passes run on the cached row), one exp per element.
//               Longer rows: per segment an online max+sum pass, then a write pass:
//               2 reads + 1 write, two exps per element; segments run in parallel.
//   RowSum      1 read per element; float32 partial sums of <= 256 elements, added
//               in double (relative error ~1e-7 typical, <~1e-6 worst, any length).
//   MatmulRelu  float32: cblas_sgemm (2MNK flops) then one bias+relu pass over C.
//               Half types: A and B widened to float32 (chunked: at most ~2^25 floats
//               each for A and B chunks and 2^24 for C), sgemm, then bias+relu fused
//               with the narrowing store.
#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace fusebox::cpu {
namespace {

constexpr int64_t kBlock = 4096;        // floats per converted block (16 KiB, L1)
constexpr int64_t kShortRow = 32768;    // softmax rows held in cache up to this (128 KiB as float)
constexpr int64_t kSegment = 65536;     // long rows split into segments of this many columns
constexpr int64_t kMinTask = 16384;     // elements a thread takes at least per chunk

const char* At(DType dt, const void* p, int64_t i) {
  return static_cast<const char*>(p) + i * static_cast<int64_t>(ElementSize(dt));
}
char* At(DType dt, void* p, int64_t i) {
  return static_cast<char*>(p) + i * static_cast<int64_t>(ElementSize(dt));
}

std::unique_ptr<float[]> AllocFloats(int64_t n) {
  return std::unique_ptr<float[]>(new (std::nothrow) float[static_cast<size_t>(n)]);
}

absl::Status OutOfMemory(const char* op, int64_t floats) {
  return absl::ResourceExhaustedError(std::string(op) + ": cannot allocate " +
                                      std::to_string(floats * 4) + " bytes of CPU scratch");
}

constexpr int64_t kDefaultOperandFloats = int64_t{1} << 25, kDefaultOutFloats = int64_t{1} << 24;
int64_t g_operand_floats = kDefaultOperandFloats, g_out_floats = kDefaultOutFloats;

int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, kMinTask / std::max<int64_t>(cols, 1)); }

}  // namespace

absl::Status Gelu(DType dt, const void* in, void* out, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  const simd::Kernels& k = simd::Active();
  ParallelFor(n, 4 * kMinTask, [&](int64_t b, int64_t e) {
    if (dt == DType::kFloat32) {
      k.gelu(static_cast<const float*>(in) + b, static_cast<float*>(out) + b, e - b);
      return;
    }
    alignas(64) float buf[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t len = std::min(kBlock, e - i);
      k.load(dt, At(dt, in, i), buf, len);
      k.gelu(buf, buf, len);
      k.store(dt, buf, At(dt, out, i), len);
    }
  });
  return absl::OkStatus();
}

absl::Status GeluPieces(DType dt, const HostPieces& pieces, void* out, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  const simd::Kernels& k = simd::Active();
  const size_t es = ElementSize(dt);
  std::atomic<bool> short_input{false};
  ParallelFor(n, 4 * kMinTask, [&](int64_t b, int64_t e) {
    PiecePos pos;
    if (!SeekPieces(pieces, static_cast<size_t>(b) * es, &pos)) {
      short_input.store(true);
      return;
    }
    alignas(64) float buf[kBlock];
    alignas(64) uint16_t half[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t len = std::min(kBlock, e - i);
      void* block = dt == DType::kFloat32 ? static_cast<void*>(buf) : static_cast<void*>(half);
      if (!GatherPieces(pieces, &pos, block, static_cast<size_t>(len) * es, 1)) {
        short_input.store(true);
        return;
      }
      if (dt == DType::kFloat32) {
        k.gelu(buf, static_cast<float*>(out) + i, len);
        continue;
      }
      k.load(dt, half, buf, len);
      k.gelu(buf, buf, len);
      k.store(dt, buf, At(dt, out, i), len);
    }
  });
  if (short_input.load()) return absl::InternalError("GeluPieces: the pieces hold fewer bytes than n elements");
  return absl::OkStatus();
}

namespace {

// Rows short enough to keep in cache: max, exp+sum (into the output row, or a
// float scratch row for half types), scale.
absl::Status SoftmaxShortRows(const simd::Kernels& k, DType dt, const void* in, void* out,
                              int64_t rows, int64_t cols) {
  const bool f32 = dt == DType::kFloat32;
  std::atomic<bool> oom{false};
  ParallelFor(rows, RowGrain(cols), [&](int64_t rb, int64_t re) {
    std::unique_ptr<float[]> scratch;
    if (!f32 && !(scratch = AllocFloats(cols))) {
      oom.store(true);
      return;
    }
    for (int64_t r = rb; r < re; ++r) {
      const float* x;
      float* y;
      if (f32) {
        x = static_cast<const float*>(in) + r * cols;
        y = static_cast<float*>(out) + r * cols;
      } else {
        k.load(dt, At(dt, in, r * cols), scratch.get(), cols);
        x = y = scratch.get();
      }
      // A NaN anywhere makes the sum NaN, so the whole row NaN; a row of -inf gives
      // exp(-inf - -inf) = NaN, and +inf entries exp(inf - inf) = NaN, as in fp64.
      const float m = k.max(x, cols);
      const double s = k.exp_sum(x, y, cols, m);
      k.scale(y, cols, static_cast<float>(1.0 / s));
      if (!f32) k.store(dt, y, At(dt, out, r * cols), cols);
    }
  });
  return oom.load() ? OutOfMemory("Softmax", cols) : absl::OkStatus();
}

// Long rows: segments of kSegment columns in parallel. Pass 1 finds each
// segment's max m and sum of exp(x - m) online, block by block; the segments of
// a row are combined; pass 2 writes exp(x - M) / S.
absl::Status SoftmaxLongRows(const simd::Kernels& k, DType dt, const void* in, void* out,
                             int64_t rows, int64_t cols) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const bool f32 = dt == DType::kFloat32;
  const int64_t nseg = (cols + kSegment - 1) / kSegment;
  struct Stat {
    float m;
    double s;
  };
  std::unique_ptr<Stat[]> stats(new (std::nothrow) Stat[static_cast<size_t>(rows * nseg)]);
  std::unique_ptr<Stat[]> row_stats(new (std::nothrow) Stat[static_cast<size_t>(rows)]);
  if (!stats || !row_stats) return OutOfMemory("Softmax", 4 * rows * (nseg + 1));

  ParallelFor(rows * nseg, 1, [&](int64_t tb, int64_t te) {
    alignas(64) float buf[kBlock];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t r = t / nseg, c0 = (t % nseg) * kSegment, c1 = std::min(cols, c0 + kSegment);
      float m = -kInf;
      double s = 0;
      for (int64_t c = c0; c < c1; c += kBlock) {
        const int64_t len = std::min(kBlock, c1 - c);
        const float* x = static_cast<const float*>(in) + r * cols + c;
        if (!f32) {
          k.load(dt, At(dt, in, r * cols + c), buf, len);
          x = buf;
        }
        const float bm = k.max(x, len);
        if (std::isnan(bm)) {  // the row is NaN
          m = bm;
          s = kNaN;
          break;
        }
        if (bm == -kInf) continue;  // adds exp(-inf - M) = 0 unless the whole row is -inf
        if (bm > m) {
          s *= std::exp(static_cast<double>(m) - bm);  // m = -inf: s is 0 and stays 0
          m = bm;
        }
        s += k.exp_sum(x, nullptr, len, m);  // +inf entries: exp(inf - inf) = NaN
      }
      stats[t] = {m, s};
    }
  });

  for (int64_t r = 0; r < rows; ++r) {
    const Stat* st = &stats[r * nseg];
    float mx = -kInf;
    bool nan = false;
    for (int64_t j = 0; j < nseg; ++j) {
      nan |= std::isnan(st[j].m);
      mx = std::max(mx, st[j].m);
    }
    double sum = 0;
    for (int64_t j = 0; j < nseg; ++j) {
      if (st[j].m != -kInf) sum += st[j].s * std::exp(static_cast<double>(st[j].m) - mx);
    }
    // All -inf (no segment contributed) gives NaN, as exp(-inf - -inf) does in fp64.
    if (nan || mx == -kInf) sum = kNaN;
    row_stats[r] = {mx, 1.0 / sum};
  }

  ParallelFor(rows * nseg, 1, [&](int64_t tb, int64_t te) {
    alignas(64) float buf[kBlock];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t r = t / nseg, c0 = (t % nseg) * kSegment, c1 = std::min(cols, c0 + kSegment);
      const float m = row_stats[r].m, inv = static_cast<float>(row_stats[r].s);
      for (int64_t c = c0; c < c1; c += kBlock) {
        const int64_t len = std::min(kBlock, c1 - c);
        if (f32) {
          k.exp_scale(static_cast<const float*>(in) + r * cols + c,
                      static_cast<float*>(out) + r * cols + c, len, m, inv);
        } else {
          k.load(dt, At(dt, in, r * cols + c), buf, len);
          k.exp_scale(buf, buf, len, m, inv);
          k.store(dt, buf, At(dt, out, r * cols + c), len);
        }
      }
    }
  });
  return absl::OkStatus();
}

// Sum of row r over columns [c0, c1), in double over float32 blocks.
double RowSpanSum(const simd::Kernels& k, DType dt, const void* in, int64_t cols, int64_t r,
                  int64_t c0, int64_t c1, float* buf) {
  if (dt == DType::kFloat32) return k.sum(static_cast<const float*>(in) + r * cols + c0, c1 - c0);
  double s = 0;
  for (int64_t c = c0; c < c1; c += kBlock) {
    const int64_t len = std::min(kBlock, c1 - c);
    k.load(dt, At(dt, in, r * cols + c), buf, len);
    s += k.sum(buf, len);
  }
  return s;
}

}  // namespace

absl::Status Softmax(DType dt, const void* in, void* out, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return absl::OkStatus();
  const simd::Kernels& k = simd::Active();
  return cols <= kShortRow ? SoftmaxShortRows(k, dt, in, out, rows, cols)
                           : SoftmaxLongRows(k, dt, in, out, rows, cols);
}

absl::Status RowSum(DType dt, const void* in, float* out, int64_t rows, int64_t cols) {
  if (rows <= 0) return absl::OkStatus();
  if (cols <= 0) {
    std::fill(out, out + rows, 0.0f);
    return absl::OkStatus();
  }
  const simd::Kernels& k = simd::Active();
  const int64_t nseg = (cols + kSegment - 1) / kSegment;
  if (nseg == 1) {
    ParallelFor(rows, RowGrain(cols), [&](int64_t rb, int64_t re) {
      alignas(64) float buf[kBlock];
      for (int64_t r = rb; r < re; ++r) {
        out[r] = static_cast<float>(RowSpanSum(k, dt, in, cols, r, 0, cols, buf));
      }
    });
    return absl::OkStatus();
  }
  std::unique_ptr<double[]> partial(new (std::nothrow) double[static_cast<size_t>(rows * nseg)]);
  if (!partial) return OutOfMemory("RowSum", 2 * rows * nseg);
  ParallelFor(rows * nseg, 1, [&](int64_t tb, int64_t te) {
    alignas(64) float buf[kBlock];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t r = t / nseg, c0 = (t % nseg) * kSegment;
      partial[t] = RowSpanSum(k, dt, in, cols, r, c0, std::min(cols, c0 + kSegment), buf);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < nseg; ++j) s += partial[r * nseg + j];
    out[r] = static_cast<float>(s);
  }
  return absl::OkStatus();
}

absl::Status MatmulRelu(DType dt, const void* a, const void* b, const void* bias, void* out,
                        int64_t m, int64_t n, int64_t kdim) {
  if (m <= 0 || n <= 0) return absl::OkStatus();
  if (n > INT_MAX || kdim > INT_MAX) {
    return absl::InvalidArgumentError("MatmulRelu: N and K must be below 2^31 (BLAS limit)");
  }
  const simd::Kernels& k = simd::Active();
  const bool f32 = dt == DType::kFloat32;

  std::unique_ptr<float[]> bias_buf;
  const float* bias32 = static_cast<const float*>(bias);
  if (bias != nullptr && !f32) {
    if (!(bias_buf = AllocFloats(n))) return OutOfMemory("MatmulRelu", n);
    k.load(dt, bias, bias_buf.get(), n);
    bias32 = bias_buf.get();
  }

  if (kdim <= 0) {  // empty sum: relu(bias), or zeros
    ParallelFor(m, RowGrain(n), [&](int64_t rb, int64_t re) {
      alignas(64) float buf[kBlock];
      for (int64_t r = rb; r < re; ++r) {
        for (int64_t c = 0; c < n; c += kBlock) {
          const int64_t len = std::min(kBlock, n - c);
          std::fill(buf, buf + len, 0.0f);
          k.bias_relu(buf, bias32 != nullptr ? bias32 + c : nullptr, len);
          k.store(dt, buf, At(dt, out, r * n + c), len);
        }
      }
    });
    return absl::OkStatus();
  }

  if (f32) {
    float* c = static_cast<float*>(out);
    for (int64_t i0 = 0; i0 < m; i0 += INT_MAX) {
      const int64_t rows = std::min<int64_t>(INT_MAX, m - i0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n), static_cast<int>(kdim), 1.0f,
                  static_cast<const float*>(a) + i0 * kdim, static_cast<int>(kdim),
                  static_cast<const float*>(b), static_cast<int>(n), 0.0f, c + i0 * n,
                  static_cast<int>(n));
    }
    ParallelFor(m, RowGrain(n), [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) k.bias_relu(c + r * n, bias32, n);
    });
    return absl::OkStatus();
  }

  // Half types: widen column blocks of B and row blocks of A to float32.
  const int64_t nb = std::min(n, std::max<int64_t>(1, g_operand_floats / kdim));
  int64_t mb = std::min(m, std::max<int64_t>(1, g_operand_floats / kdim));
  mb = std::min(mb, std::max<int64_t>(1, g_out_floats / nb));
  std::unique_ptr<float[]> bf = AllocFloats(kdim * nb), af = AllocFloats(mb * kdim),
                           cf = AllocFloats(mb * nb);
  if (!bf || !af || !cf) return OutOfMemory("MatmulRelu", kdim * nb + mb * kdim + mb * nb);
  for (int64_t j0 = 0; j0 < n; j0 += nb) {
    const int64_t jn = std::min(nb, n - j0);
    ParallelFor(kdim, RowGrain(jn), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) k.load(dt, At(dt, b, p * n + j0), bf.get() + p * jn, jn);
    });
    for (int64_t i0 = 0; i0 < m; i0 += mb) {
      const int64_t in = std::min(mb, m - i0);
      ParallelFor(in * kdim, 4 * kMinTask, [&](int64_t eb, int64_t ee) {
        k.load(dt, At(dt, a, i0 * kdim + eb), af.get() + eb, ee - eb);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(in),
                  static_cast<int>(jn), static_cast<int>(kdim), 1.0f, af.get(),
                  static_cast<int>(kdim), bf.get(), static_cast<int>(jn), 0.0f, cf.get(),
                  static_cast<int>(jn));
      ParallelFor(in, RowGrain(jn), [&](int64_t rb, int64_t re) {
        for (int64_t r = rb; r < re; ++r) {
          float* row = cf.get() + r * jn;
          k.bias_relu(row, bias32 != nullptr ? bias32 + j0 : nullptr, jn);
          k.store(dt, row, At(dt, out, (i0 + r) * n + j0), jn);
        }
      });
    }
  }
  return absl::OkStatus();
}

namespace internal {
void SetMatmulChunkBudget(int64_t operand_floats, int64_t out_floats) {
  g_operand_floats = operand_floats > 0 ? operand_floats : kDefaultOperandFloats;
  g_out_floats = out_floats > 0 ? out_floats : kDefaultOutFloats;
}
}  // namespace internal

}  // namespace fusebox::cpu
