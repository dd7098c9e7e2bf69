// The scalar bf16/fp16 conversions shared by host and CUDA code, checked exhaustively
// against an independent reference (double rounding arithmetic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/half.hpp"

using namespace zoe::kernels;

namespace {
// Reference: nearest representable of a sorted candidate pair, ties to even mantissa.
double ref_round_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  double dl = std::fabs(double(f) - flo), dh = std::fabs(double(fhi) - f);
  if (dl < dh) return flo;
  if (dh < dl) return fhi;
  return ((lo >> 16) & 1) ? fhi : flo;
}
}  // namespace

TEST(Half, Bf16RoundTripAllBf16Values) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  for (std::uint32_t u = 0x3f800000u; u < 0x3f800000u + (1u << 20); u += 7) {
    float f;
    std::memcpy(&f, &u, 4);
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), float(ref_round_bf16(f))) << u;
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
}

TEST(Half, F16RoundTripAllF16Values) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      EXPECT_EQ(f32_to_f16(f), h) << h;
    }
  }
}

TEST(Half, F16RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  // Midpoints between consecutive fp16 values round to the even one.
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    double a = f16_to_f32(h), b = f16_to_f32(h + 1);
    float mid = float((a + b) / 2);  // exact in fp32
    std::uint16_t expect = (h & 1) ? h + 1 : h;
    EXPECT_EQ(f32_to_f16(mid), expect) << h;
  }
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0);       // tie to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 1);       // above the tie
}
