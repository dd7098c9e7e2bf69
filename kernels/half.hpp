// Scalar fp32 <-> bf16 / fp16 conversions, host and device (ZOE_HD).
// Rounding: round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf;
// fp16 overflow rounds to inf, fp16 underflow produces subnormals / signed zero
// exactly as IEEE 754 binary16 conversion does. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.hpp"

namespace zoe::kernels {

ZOE_HD std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
ZOE_HD float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// fp32 -> bf16 bits, round to nearest even; NaN -> quiet NaN with the sign kept.
ZOE_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// bf16 bits -> fp32 (exact).
ZOE_HD float bf16_to_f32(std::uint16_t h) { return bits_f32(static_cast<std::uint32_t>(h) << 16); }

/// fp32 -> IEEE fp16 bits, round to nearest even (as _cvtss_sh with _MM_FROUND_TO_NEAREST_INT).
ZOE_HD std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = f32_bits(f);
  std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // below fp16's smallest normal 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 ties to even = 0)
    std::uint32_t exp = a >> 23;
    std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126u - exp;  // value = mant * 2^(exp-150); fp16 sub unit 2^-24
    std::uint32_t q = mant >> shift;
    std::uint32_t rem = mant & ((1u << shift) - 1u);
    std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits.
  std::uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// IEEE fp16 bits -> fp32 (exact).
ZOE_HD float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace zoe::kernels
