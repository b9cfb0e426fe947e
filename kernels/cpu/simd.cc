// Picks the CPU inner-loop variant once, at first use: AVX-512 when the CPU (and
// OS) support F/BW/DQ/VL+FMA+F16C, else AVX2+FMA+F16C, else the baseline build.
// FUSEBOX_CPU_ISA=generic|avx2|avx512 in the environment overrides the choice
// (ignored when the CPU lacks that variant). Costs nothing after the first call.
#include "kernels/cpu/simd.h"

#include <atomic>
#include <cstdlib>

#if defined(FUSEBOX_X86_VARIANTS)
#include <cpuid.h>
#endif

namespace fusebox::cpu::simd {

#if !defined(FUSEBOX_X86_VARIANTS)
const Kernels* Avx2Kernels() { return nullptr; }
const Kernels* Avx512Kernels() { return nullptr; }
#endif

namespace {

bool Supported(const Kernels* k) {
  if (k == nullptr) return false;
  if (k == GenericKernels()) return true;
#if defined(FUSEBOX_X86_VARIANTS)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 itself: clang before 16 has no "f16c" for __builtin_cpu_supports
  // (the fuzzers are built with Debian's clang 14).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (k == Avx2Kernels()) return avx2;
  if (k == Avx512Kernels()) {
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
#endif
  return false;
}

const Kernels* ByName(const std::string& name) {
  if (name == "generic") return GenericKernels();
  if (name == "avx2") return Avx2Kernels();
  if (name == "avx512") return Avx512Kernels();
  return nullptr;
}

const Kernels* Best() {
  if (const char* env = std::getenv("FUSEBOX_CPU_ISA"); env != nullptr && *env != '\0') {
    const Kernels* k = ByName(env);
    if (Supported(k)) return k;
  }
  for (const Kernels* k : {Avx512Kernels(), Avx2Kernels()}) {
    if (Supported(k)) return k;
  }
  return GenericKernels();
}

std::atomic<const Kernels*> g_active{nullptr};

}  // namespace

const Kernels& Active() {
  const Kernels* k = g_active.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = Best();
    g_active.store(k, std::memory_order_release);
  }
  return *k;
}

std::vector<std::string> SupportedIsas() {
  std::vector<std::string> out;
  for (const char* name : {"generic", "avx2", "avx512"}) {
    if (Supported(ByName(name))) out.push_back(name);
  }
  return out;
}

bool ForceIsa(const std::string& name) {
  const Kernels* k = name.empty() ? Best() : ByName(name);
  if (!Supported(k)) return false;
  g_active.store(k, std::memory_order_release);
  return true;
}

}  // namespace fusebox::cpu::simd
