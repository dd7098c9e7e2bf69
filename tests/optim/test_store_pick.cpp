// The store pick rule on made-up timings: noise cannot flip it, a clear gain does.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/optim/store_pick.hpp"

namespace zoe::optim::detail {
namespace {

using Table = std::vector<std::vector<double>>;

// Rounds of candidate 0 with the given times; each further candidate a fixed factor of them.
Table scaled(const std::vector<double>& base, const std::vector<double>& factors) {
  Table t{base};
  for (double f : factors) {
    t.emplace_back();
    for (double b : base) t.back().push_back(b * f);
  }
  return t;
}

TEST(StorePick, WithinNoiseKeepsTheSimplest) {
  // Candidate 2 is 2% faster in every round: below the 5% floor, so candidate 0 stays.
  const Table secs = scaled({1.00, 1.10, 0.90, 1.05, 1.00}, {1.01, 0.98});
  const StorePick p = pick_simplest_within_noise(secs);
  EXPECT_EQ(p.chosen, 0);
  EXPECT_DOUBLE_EQ(p.margin, kMinStoreMargin);  // the ratios are exact: no measured noise
  EXPECT_NEAR(p.relative[2], 0.98, 1e-12);
  EXPECT_NEAR(p.relative[1], 1.01, 1e-12);
}

TEST(StorePick, AClearGainIsPicked) {
  // Candidate 1 takes 0.85 of candidate 0's time in every round (the machine's speed drifts by
  // 2x between rounds, which the per-round ratio cancels).
  const Table secs = scaled({1.0, 2.0, 1.5, 1.0, 1.2}, {0.85});
  const StorePick p = pick_simplest_within_noise(secs);
  EXPECT_EQ(p.chosen, 1);
  EXPECT_NEAR(p.relative[1], 0.85, 1e-12);
}

TEST(StorePick, NoisyGainBelowTheMeasuredMarginKeepsTheSimplest) {
  // Candidate 1's per-round ratios 0.94, 1.20, 0.90, 1.30, 1.00: median 1.00, deviations
  // 0.06, 0.20, 0.10, 0.30, 0 -> median 0.10, sigma 0.148, standard error of the median of 5
  // 0.083, margin 0.166. Its fastest trial is 0.90 of candidate 0's: a 10% gain inside the
  // margin, so candidate 0.
  const Table secs = {{1, 1, 1, 1, 1}, {0.94, 1.20, 0.90, 1.30, 1.00}};
  const StorePick p = pick_simplest_within_noise(secs);
  EXPECT_EQ(p.chosen, 0);
  EXPECT_NEAR(p.relative[1], 0.90, 1e-12);
  EXPECT_NEAR(p.margin, 2 * 1.2533 * 1.4826 * 0.10 / std::sqrt(5.0), 1e-9);
}

TEST(StorePick, ThePickIsTheSimplestWithinTheMarginOfTheFastest) {
  // Ratios exact: candidate 1 at 0.90, candidate 2 at 0.88 (0.90 is within 5% of 0.88), candidate 3 at
  // 0.95: candidate 1 is the simplest within the margin of the fastest (2).
  const Table secs = scaled({1.0, 1.3, 0.7}, {0.90, 0.88, 0.95});
  EXPECT_EQ(pick_simplest_within_noise(secs).chosen, 1);
}

TEST(StorePick, MalformedTablesGiveCandidateZero) {
  EXPECT_EQ(pick_simplest_within_noise({}).chosen, 0);
  EXPECT_EQ(pick_simplest_within_noise({{1.0, 1.0}, {0.5}}).chosen, 0);
  EXPECT_EQ(pick_simplest_within_noise({{}, {}}).chosen, 0);
}

}  // namespace
}  // namespace zoe::optim::detail
