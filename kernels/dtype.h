// Element types fusebox computes on, and exact scalar conversions between the
// half types and float32 (round to nearest even, NaN kept NaN). Shared by the
// CPU kernels, the tests and the server; no CUDA and no gRPC here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fusebox {

// Values match fusebox.v1.DType so the RPC layer can cast.
enum class DType : int { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

constexpr size_t ElementSize(DType d) { return d == DType::kFloat32 ? 4 : 2; }
constexpr const char* DTypeName(DType d) {
  return d == DType::kFloat32 ? "float32" : d == DType::kFloat16 ? "float16" : "bfloat16";
}

// The bytes of a tensor of `element_bytes`-byte elements with these non-negative dims: 0 when
// a dim is 0 (whatever the others multiply to), -1 when the count passes int64.
template <typename Dims>
int64_t ShapeBytes(int64_t element_bytes, const Dims& dims) {
  for (int64_t d : dims) {
    if (d == 0) return 0;
  }
  int64_t bytes = element_bytes;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) return -1;
  }
  return bytes;
}

inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float BF16ToFloat(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }
inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;
  return sign ? -mag : mag;
}
inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;             // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;            // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    // Adding 0.5 makes the FPU round the mantissa at 2^-24 granularity (nearest even).
    const float s = BitsFloat(a) + 0.5f;
    return sign | static_cast<uint16_t>(FloatBits(s) - 0x3f000000u);
  }
  uint32_t r = a - 0x38000000u;                           // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);                         // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

// double -> float rounded to odd (an inexact result gets its last mantissa bit set): narrowed
// again to float16 or bfloat16 (11 or 8 bits against float's 24) it rounds as one direct
// rounding of the double to nearest even would, where double -> float -> half can round
// twice (1 + 2^-8 + 2^-30 would become bfloat16 1.0, not 1 + 2^-7).
inline float DoubleToFloatRoundToOdd(double d) {
  const float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || d != d) return f;  // exact, or NaN
  uint32_t u = FloatBits(f);
  // Magnitude order is bit order for one sign: step back toward zero if f rounded away.
  if ((f < 0 ? -static_cast<double>(f) : static_cast<double>(f)) > (d < 0 ? -d : d)) --u;
  return BitsFloat(u | 1u);
}

// Load / store element i of a buffer of dtype d as float.
inline float LoadAsFloat(DType d, const void* p, size_t i) {
  switch (d) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    default: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}
inline void StoreFromFloat(DType d, void* p, size_t i, float v) {
  switch (d) {
    case DType::kFloat32: static_cast<float*>(p)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = FloatToHalf(v); break;
    default: static_cast<uint16_t*>(p)[i] = FloatToBF16(v); break;
  }
}

}  // namespace fusebox
