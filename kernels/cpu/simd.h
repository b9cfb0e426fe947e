// The inner loops of the CPU kernels, compiled once per instruction set and
// picked at run time (see simd.cc): plain x86-64 (SSE2), AVX2+FMA+F16C, and
// AVX-512 (F/BW/DQ/VL). Each works on contiguous float32 spans that are already
// in the cache or streaming through it; ops.cc does the dtypes, rows, chunking
// and threading. No function here allocates or fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace fusebox::cpu::simd {

struct Kernels {
  const char* name;
  // dst[i] = float(src[i]) / dst[i] = dtype(src[i]) (round to nearest even, NaN stays NaN).
  void (*load)(DType dt, const void* src, float* dst, int64_t n);
  void (*store)(DType dt, const float* src, void* dst, int64_t n);
  // y[i] = gelu_tanh(x[i]); y may equal x.
  void (*gelu)(const float* x, float* y, int64_t n);
  // Largest element; NaN if any element is NaN; -inf when n == 0.
  float (*max)(const float* x, int64_t n);
  // y[i] = exp(x[i] - m) (y may be null: not stored); returns the sum in double
  // of float32 partial sums over short blocks.
  double (*exp_sum)(const float* x, float* y, int64_t n, float m);
  // y[i] = exp(x[i] - m) * s.
  void (*exp_scale)(const float* x, float* y, int64_t n, float m, float s);
  // y[i] *= s.
  void (*scale)(float* y, int64_t n, float s);
  // Sum of x: float32 lanes over blocks of a few hundred elements, blocks added in double.
  double (*sum)(const float* x, int64_t n);
  // y[i] = relu(y[i] + bias[i]) (bias may be null); NaN stays NaN.
  void (*bias_relu)(float* y, const float* bias, int64_t n);
  // Scalar exp with the vector code's accuracy (for tests).
  float (*exp)(float x);
};

// The kernels in use: the best the CPU supports unless ForceIsa chose another.
const Kernels& Active();
// Names of the variants this CPU can run, best last ("generic", "avx2", "avx512").
std::vector<std::string> SupportedIsas();
// Use the named variant from now on ("" = best supported). False if unsupported.
// For tests and benchmarks; not meant to be switched while ops run.
bool ForceIsa(const std::string& name);

// One per variant, defined in simd_<name>.cc (null where not built).
const Kernels* GenericKernels();
const Kernels* Avx2Kernels();
const Kernels* Avx512Kernels();

}  // namespace fusebox::cpu::simd
