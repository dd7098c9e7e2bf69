// storage_dtype.hpp: fp32 <-> bf16 / fp16 rounding against IEEE 754 values worked out by hand
// (nearest even, subnormals, overflow to inf, NaN), and exact round trips of every 16-bit pattern.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "examples/gpt/storage_dtype.hpp"

namespace gpt::kernels {
namespace {

TEST(StorageDtype, Fp16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);                 // the largest finite
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7BFF);                // below the midpoint to 2^16
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);                 // the midpoint: ties to even = inf
  EXPECT_EQ(float_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-1e6f), 0xFC00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3C00);         // tie between 1 and 1+2^-10: even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);     // tie between 1+2^-10, 1+2^-9: even
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);                 // the smallest normal
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);                 // the smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);                 // its half: ties to even = 0
  EXPECT_EQ(float_to_fp16(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(float_to_fp16(3 * 0x1p-25f), 0x0002);             // 1.5 ulp: even
  EXPECT_EQ(float_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);      // rounds up into the normals
  EXPECT_EQ(float_to_fp16(1e-10f), 0x0000);
  const std::uint16_t nan = float_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(StorageDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);           // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

// Every finite 16-bit value widens exactly and rounds back to itself; inf stays inf.
TEST(StorageDtype, EveryPatternRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f16 = fp16_to_float(b);
    if (!std::isnan(f16)) ASSERT_EQ(float_to_fp16(f16), b) << std::hex << h;
    const float bf = bf16_to_float(b);
    if (!std::isnan(bf)) ASSERT_EQ(float_to_bf16(bf), b) << std::hex << h;
  }
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x83FF), -1023 * 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
}

// narrow_add adds the scaled fp32 value into the 16-bit element with one rounding.
TEST(StorageDtype, NarrowAddScalesAndRoundsOnce) {
  std::uint16_t d[2] = {float_to_fp16(1.0f), 0};
  const float src[2] = {0.25f, 70000.0f / 1024};
  narrow_add_element(0, Storage16::fp16, src, 1024.0f, d);
  narrow_add_element(1, Storage16::fp16, src, 1024.0f, d);
  EXPECT_EQ(fp16_to_float(d[0]), 257.0f);
  EXPECT_EQ(d[1], 0x7C00);  // 70000 overflows fp16: inf, for the engine's overflow check
  float w = 0;
  const std::uint16_t b = float_to_bf16(1.0f + 0x1p-7f);
  widen_element(0, Storage16::bf16, &b, &w);
  EXPECT_EQ(w, 1.0f + 0x1p-7f);
}

}  // namespace
}  // namespace gpt::kernels
