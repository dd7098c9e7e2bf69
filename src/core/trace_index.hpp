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
  /// Every step rebuilds it: a counting sort of the uses by group into one array, so a
  /// step with thousands of groups allocates nothing once the arrays have grown.
  void build(std::span<const TraceEntry> order, const Model& model) {
    const std::size_t n = order.size();
    uses_.assign(model.groups.size(), Uses{});
    prefix_.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t elements = 0;
      for (int g : model.modules[static_cast<std::size_t>(order[i].module)].groups) {
        ++uses_[static_cast<std::size_t>(g)].end;  // a count for now
        elements += model.group(g).layout->live_numel();
      }
      prefix_[i + 1] = prefix_[i] + elements;
    }
    std::size_t begin = 0;
    for (Uses& u : uses_) {  // counts -> [next, end) = where each group's positions go
      u.next = begin;
      begin += u.end;
      u.end = u.next;
    }
    positions_.resize(begin);
    for (std::size_t i = 0; i < n; ++i)
      for (int g : model.modules[static_cast<std::size_t>(order[i].module)].groups)
        positions_[uses_[static_cast<std::size_t>(g)].end++] = i;
    cursor_ = 0;
  }
  /// The first position >= `pos` that uses group g, or npos. `pos` must not decrease between
  /// calls for the same group within a step.
  std::size_t next_use(int g, std::size_t pos) {
    const auto gi = static_cast<std::size_t>(g);
    if (gi >= uses_.size()) return npos;
    Uses& u = uses_[gi];
    while (u.next < u.end && positions_[u.next] < pos) ++u.next;
    return u.next < u.end ? positions_[u.next] : npos;
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
    positions_.clear();
    prefix_.assign(1, 0);
    cursor_ = 0;
  }

 private:
  // Per group: its positions are positions_[next, end), ascending; `next` advances past the
  // uses already behind.
  struct Uses {
    std::size_t next = 0, end = 0;
  };
  std::vector<Uses> uses_;
  std::vector<std::size_t> positions_;  // every group's uses, grouped by group
  std::vector<std::int64_t> prefix_{0};  // prefix_[i]: elements of entries [0, i)
  std::size_t cursor_ = 0;
};

}  // namespace zoe::core
