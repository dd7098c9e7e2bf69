#include <gtest/gtest.h>

#include "src/core/flat_layout.hpp"
#include "src/core/loss_scaler.hpp"

using zoe::core::FlatLayout;

TEST(FlatLayout, FiftySevenElementsOverTwoRanks) {
  FlatLayout L({57}, 2);
  EXPECT_EQ(L.shard_numel() * 2, L.padded_numel());
  EXPECT_EQ(L.shard_numel() % FlatLayout::kAlign, 0);
  EXPECT_EQ(L.shard_numel(), 32);
  EXPECT_EQ(L.live_in_shard(0) + L.live_in_shard(1), 57);
  EXPECT_EQ(L.live_in_shard(0), 32);
  EXPECT_EQ(L.live_in_shard(1), 25);
}

TEST(FlatLayout, ZeroSizeAndAlignedOffsets) {
  FlatLayout L({8, 0, 24}, 2);
  EXPECT_EQ(L.offset(0), 0);
  EXPECT_EQ(L.offset(1), 16);
  EXPECT_EQ(L.offset(2), 16);
  EXPECT_EQ(L.live_numel(), 32);
  EXPECT_EQ(L.padded_numel(), 64);
  ASSERT_EQ(L.live_ranges().size(), 2u);
  EXPECT_EQ(L.live_ranges()[1].begin, 16);
  EXPECT_EQ(L.live_ranges()[1].end, 40);
  EXPECT_EQ(L.live_in_shard(0) + L.live_in_shard(1), 32);
}

TEST(FlatLayout, FewerElementsThanRanks) {
  FlatLayout L({3}, 4);
  EXPECT_EQ(L.shard_numel(), 16);
  EXPECT_EQ(L.live_in_shard(0), 3);
  EXPECT_EQ(L.live_in_shard(1) + L.live_in_shard(2) + L.live_in_shard(3), 0);
}

TEST(LossScaler, HysteresisThenHalvingThenGrowth) {
  zoe::Config c;
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 4;
  c.fp16.hysteresis = 2;
  c.fp16.loss_scale_window = 3;
  c.fp16.min_loss_scale = 4;
  zoe::core::LossScaler s(c);
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // hysteresis absorbs the first overflow
  EXPECT_EQ(s.scale(), 16);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  EXPECT_EQ(s.scale(), 4);
  s.update(true);  // min scale
  EXPECT_EQ(s.scale(), 4);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 8);
}
