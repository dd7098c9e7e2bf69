// The 16-bit storage formats of mixed-precision training (Micikevicius et al. 2018, "Mixed
// Precision Training"): bfloat16 and IEEE binary16 (fp16) to and from fp32, one element at a time,
// written once (GPT_HD) for the host backends and the CUDA kernels, so every backend rounds to
// the same bits.
//
// Rounding: to nearest, ties to even (IEEE 754's default, what zoe's engine uses for its bf16/fp16
// compute copies). Overflow rounds to +-inf (fp16: |x| >= 65520; bf16: beyond 3.39e38), which is
// how an fp16 gradient that the loss scale pushed too far reaches the engine's inf/NaN check; NaN
// stays NaN (quiet); fp16 keeps subnormals (down to 2^-24), bf16 keeps fp32's. Widening is exact.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "examples/gpt/kernel_math.hpp"  // GPT_HD

namespace gpt::kernels {

GPT_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
GPT_HD float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/// fp32 -> bfloat16 bits, nearest even.
GPT_HD std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
/// bfloat16 bits -> fp32 (exact).
GPT_HD float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

/// fp32 -> IEEE binary16 bits, nearest even, with subnormals; |x| >= 65520 gives +-inf.
GPT_HD std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN (quiet)
  if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // 65520 and up: inf
  if (ax < 0x38800000u) {  // below 2^-14: an fp16 subnormal (or zero), round(|x| / 2^-24)
    if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to 0
    const std::uint32_t e = ax >> 23;  // 102..112
    const std::uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);  // r = 0x400 is the smallest normal: right
  }
  const std::uint32_t y = ax - 0x38000000u;  // exponent bias 127 -> 15
  std::uint32_t r = y >> 13;
  const std::uint32_t rem = y & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | r);
}
/// IEEE binary16 bits -> fp32 (exact).
GPT_HD float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// The 16-bit format of a compute-dtype buffer (zoe::DType::bf16 or f16 as the engine hands them).
enum class Storage16 : std::uint8_t { bf16, fp16 };

/// dst[i] = float(src[i]) for element i.
GPT_HD void widen_element(std::int64_t i, Storage16 s, const std::uint16_t* src, float* dst) {
  dst[i] = s == Storage16::bf16 ? bf16_to_float(src[i]) : fp16_to_float(src[i]);
}
/// dst[i] = round(float(dst[i]) + scale * src[i]) for element i: adds an fp32 gradient, times the
/// loss scale, into a 16-bit gradient buffer (the engine's are zero-filled: one rounding).
GPT_HD void narrow_add_element(std::int64_t i, Storage16 s, const float* src, float scale,
                               std::uint16_t* dst) {
  if (s == Storage16::bf16) dst[i] = float_to_bf16(bf16_to_float(dst[i]) + scale * src[i]);
  else dst[i] = float_to_fp16(fp16_to_float(dst[i]) + scale * src[i]);
}

}  // namespace gpt::kernels
