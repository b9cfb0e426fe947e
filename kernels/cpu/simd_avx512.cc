// The avx512 variant of the CPU inner loops (simd_impl.inc), 16 floats per vector.
// Compiled with: -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c; only called
// after simd.cc checked that the CPU supports it.
#define FUSEBOX_SIMD_NS avx512
#define FUSEBOX_SIMD_WIDTH 16
#include "kernels/cpu/simd_impl.inc"

namespace fusebox::cpu::simd {
const Kernels* Avx512Kernels() { return avx512::Get(); }
}  // namespace fusebox::cpu::simd
