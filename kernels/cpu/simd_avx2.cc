// The avx2 variant of the CPU inner loops (simd_impl.inc), 8 floats per vector.
// Compiled with: -mavx2 -mfma -mf16c; only called
// after simd.cc checked that the CPU supports it.
#define FUSEBOX_SIMD_NS avx2
#define FUSEBOX_SIMD_WIDTH 8
#include "kernels/cpu/simd_impl.inc"

namespace fusebox::cpu::simd {
const Kernels* Avx2Kernels() { return avx2::Get(); }
}  // namespace fusebox::cpu::simd
