// The rule StorePolicy::measure picks a store candidate by, apart from the timing (cpu_adam.cpp),
// so that it can be tested on made-up timings.
#pragma once

#include <vector>

namespace zoe::optim::detail {

/// The smallest margin by which a candidate must beat an earlier (simpler) one to be picked
/// over it, whatever the measured noise: differences of a few percent are not worth a
/// different code path, and re-measuring them flips from process to process (on a shared 2-core
/// Zen 5 VM, 128M elements: 3% flipped picks between ordinary and ordinary+prefetch).
inline constexpr double kMinStoreMargin = 0.05;

struct StorePick {
  int chosen = 0;                 // index of the picked candidate
  double margin = 0;              // the margin used (>= kMinStoreMargin), relative
  std::vector<double> relative;   // per candidate: its fastest trial / candidate 0's fastest
};

/// secs[c][r]: the time (any unit, > 0) of candidate c in round r; every candidate has the same
/// number of rounds (>= 1) and each round ran every candidate once, close together. Candidates
/// are listed simplest first; at least one.
/// A candidate's relative time is its fastest trial over candidate 0's fastest (other processes
/// only slow a trial down, so the fastest is the least disturbed estimate: on a 2-core VM at
/// load 12, medians moved by 10% from process to process and flipped the pick).
/// The noise: per round, each candidate's time divided by candidate 0's of the same round;
/// sigma is 1.4826 x the median absolute deviation of those ratios around their candidate's
/// median (pooled over candidates 1..; a normal distribution's sigma); a median of R rounds has a
/// standard error of 1.2533 sigma / sqrt(R), and the margin is max(kMinStoreMargin, 2 x that).
/// The pick is the simplest candidate whose relative time is within the margin of the fastest
/// one: relative[c] <= min(relative) * (1 + margin).
/// Deterministic; throws nothing (an empty or ragged table gives candidate 0).
StorePick pick_simplest_within_noise(const std::vector<std::vector<double>>& secs);

}  // namespace zoe::optim::detail
