#include <gtest/gtest.h>

#include "src/config/did_you_mean.hpp"

namespace {
using zoe::config_detail::edit_distance;
using zoe::config_detail::nearest;

TEST(DidYouMean, EditDistanceKnownValues) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);  // the textbook example
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("stage", "stage"), 0u);
  EXPECT_EQ(edit_distance("stgae", "stage"), 1u);  // one transposition
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);       // OSA (true Damerau would give 2)
  EXPECT_EQ(edit_distance("Stage", "sTAGE"), 0u);  // case-insensitive
}

TEST(DidYouMean, NearestOnlyForNearMisses) {
  const std::vector<std::string> keys = {"stage", "overlap_comm", "sub_group_size", "stage3_prefetch_bucket_size"};
  EXPECT_EQ(nearest("stag", keys), "stage");
  EXPECT_EQ(nearest("overlap_com", keys), "overlap_comm");
  EXPECT_EQ(nearest("subgroup_size", keys), "sub_group_size");
  EXPECT_EQ(nearest("prefetch_bucket_size", keys), "stage3_prefetch_bucket_size");
  EXPECT_EQ(nearest("zzzzz", keys), std::nullopt);
  EXPECT_EQ(nearest("comm", keys), std::nullopt);  // contained, but too short to mean it
}
}  // namespace
