// The generic variant of the CPU inner loops (simd_impl.inc), 4 floats per vector.
// Compiled with: no extra flags (baseline x86-64 / any target); only called
// after simd.cc checked that the CPU supports it.
#define FUSEBOX_SIMD_NS generic
#define FUSEBOX_SIMD_WIDTH 4
#include "kernels/cpu/simd_impl.inc"

namespace fusebox::cpu::simd {
const Kernels* GenericKernels() { return generic::Get(); }
}  // namespace fusebox::cpu::simd
