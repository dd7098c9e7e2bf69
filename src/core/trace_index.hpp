// TraceIndex: the previous step's recorded order (ExecutionTrace), indexed so that the
// Gatherer's two questions cost O(1) amortised per call instead of a walk over the rest of
// the order (which made a pass over n modules cost O(n^2)):
//  - where prefetch resumes: every entry before the cursor has all its groups gathered or
//    issued; a group that is resharded moves the cursor back to its next use;
//  - a group's reuse distance: elements of execution between now and its next use, from a
//    prefix sum over the order and a per-group list of the positions that use it.
// Positions only grow within a step (ExecutionTrace::position), so each per-group pointer
// advances at most once per use: O(total uses) per step.
// Not thread-safe: the thread that drives the Engine uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "src/core/execution_trace.hpp"
#include "src/core/model.hpp"

namespace zoe::core {

class TraceIndex {
 public:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  /// Indexes `order` (the previous step's calls); entry i uses the groups of its module.
  void build(std::span<const TraceEntry> order, const Model& model) {
    const std::size_t n = order.size();
    uses_.assign(model.groups.size(), {});
    next_.assign(model.groups.size(), 0);
    prefix_.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t elements = 0;
      for (int g : model.modules[static_cast<std::size_t>(order[i].module)].groups) {
        uses_[static_cast<std::size_t>(g)].push_back(i);
        elements += model.group(g).layout->live_numel();
      }
      prefix_[i + 1] = prefix_[i] + elements;
    }
    cursor_ = 0;
  }
  /// The first position >= `pos` that uses group g, or npos. `pos` must not decrease between
  /// calls for the same group within a step.
  std::size_t next_use(int g, std::size_t pos) {
    const auto gi = static_cast<std::size_t>(g);
    if (gi >= uses_.size()) return npos;
    const std::vector<std::size_t>& u = uses_[gi];
    std::size_t& k = next_[gi];
    while (k < u.size() && u[k] < pos) ++k;
    return k < u.size() ? u[k] : npos;
  }
  /// Live elements of the groups of entries [a, b) (a group used twice counts twice).
  std::int64_t elements_between(std::size_t a, std::size_t b) const { return prefix_[b] - prefix_[a]; }

  /// Where the prefetch walk resumes (at least `pos`).
  std::size_t cursor(std::size_t pos) const { return cursor_ > pos ? cursor_ : pos; }
  void advance_cursor(std::size_t to) { cursor_ = to; }
  /// Group g is no longer gathered: the walk must visit its next use (>= pos) again.
  void resharded(int g, std::size_t pos) {
    const std::size_t at = next_use(g, pos);
    if (at < cursor_) cursor_ = at;
  }
  /// Prediction is off (a call departed from the order): nothing to resume.
  void clear() {
    uses_.clear();
    next_.clear();
    prefix_.assign(1, 0);
    cursor_ = 0;
  }

 private:
  std::vector<std::vector<std::size_t>> uses_;  // per group: the positions that use it, ascending
  std::vector<std::size_t> next_;               // per group: index into uses_ of its next use
  std::vector<std::int64_t> prefix_{0};         // prefix_[i]: elements of entries [0, i)
  std::size_t cursor_ = 0;
};

}  // namespace zoe::core
