// Store candidate pick: paired per-round ratios, medians, a noise margin, simplest within it.
#include "src/optim/store_pick.hpp"

#include <algorithm>
#include <cmath>

namespace zoe::optim::detail {
namespace {

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

}  // namespace

StorePick pick_simplest_within_noise(const std::vector<std::vector<double>>& secs) {
  StorePick r;
  r.margin = kMinStoreMargin;
  const std::size_t candidates = secs.size();
  if (candidates == 0) return r;
  const std::size_t rounds = secs[0].size();
  for (const auto& s : secs)
    if (s.size() != rounds || rounds == 0) return r;
  // Per-round ratios to candidate 0, their medians and the pooled deviations around them.
  std::vector<double> deviations;
  r.relative.assign(candidates, 1.0);
  const double fastest0 = *std::min_element(secs[0].begin(), secs[0].end());
  for (std::size_t c = 1; c < candidates; ++c) {
    std::vector<double> ratio(rounds);
    for (std::size_t k = 0; k < rounds; ++k) ratio[k] = secs[c][k] / secs[0][k];
    const double mid = median(ratio);
    for (double q : ratio) deviations.push_back(std::fabs(q / mid - 1.0));
    // Other processes only ever slow a trial down: each candidate's fastest trial is the
    // estimate least disturbed by them (medians moved by 10% between processes at load 12).
    r.relative[c] = *std::min_element(secs[c].begin(), secs[c].end()) / fastest0;
  }
  // sigma of one round's ratio from the median absolute deviation (x 1.4826 for a normal
  // distribution); the median of `rounds` of them has a standard error of 1.2533 sigma / sqrt(rounds).
  if (!deviations.empty()) {
    const double sigma = 1.4826 * median(deviations);
    r.margin = std::max(kMinStoreMargin, 2 * 1.2533 * sigma / std::sqrt(static_cast<double>(rounds)));
  }
  const double fastest = *std::min_element(r.relative.begin(), r.relative.end());
  for (std::size_t c = 0; c < candidates; ++c)
    if (r.relative[c] <= fastest * (1 + r.margin)) {
      r.chosen = static_cast<int>(c);
      break;
    }
  return r;
}

}  // namespace zoe::optim::detail
