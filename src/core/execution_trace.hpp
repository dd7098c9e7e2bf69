// ExecutionTrace: stage 3's record of the order in which modules run (forward and backward
// calls), this step's and the previous step's. Prefetch follows the previous step's order as
// long as this step repeats it; at the first call that differs, prediction stops until the next
// step (DeepSpeed's PartitionedParameterCoordinator traces the same way).
//
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace zoe::core {

/// One call of the recorded execution order.
struct TraceEntry {
  int module;
  bool backward;
  bool operator==(const TraceEntry&) const = default;
};

class ExecutionTrace {
 public:
  /// Records a call of this step. Returns true when it ends the prediction (it differs from the
  /// previous step's call at this position): the caller drops what it prefetched for that order.
  bool record(TraceEntry entry) {
    current_.push_back(entry);
    if (!predicting_) return false;
    if (pos_ < last_.size() && last_[pos_] == entry) {
      ++pos_;
      return false;
    }
    predicting_ = false;
    return true;
  }
  /// Whether this step has followed the previous step's order so far.
  bool predicting() const { return predicting_; }
  /// Position of the next call in the previous step's order.
  std::size_t position() const { return pos_; }
  /// The previous step's calls after the last recorded one (empty unless predicting).
  std::span<const TraceEntry> upcoming() const {
    if (!predicting_) return {};
    return std::span<const TraceEntry>(last_).subspan(pos_);
  }
  /// At the step: this step's order becomes the prediction for the next.
  void end_step() {
    last_ = std::move(current_);
    current_.clear();
    pos_ = 0;
    predicting_ = !last_.empty();
  }

 private:
  std::vector<TraceEntry> current_, last_;
  std::size_t pos_ = 0;
  bool predicting_ = false;
};

}  // namespace zoe::core
