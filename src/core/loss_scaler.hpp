// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision
// Training", §3.2; DeepSpeed's DynamicLossScaler semantics):
//  - overflow: if the hysteresis budget is > 1 it is decremented and the scale kept;
//    otherwise scale = max(scale / 2, min_scale). The step is skipped either way.
//  - after loss_scale_window consecutive good steps: scale *= 2, hysteresis refilled.
// A static scale (loss_scale > 0) never changes; without fp16 the scale is 1.
// Not thread-safe (owned by one Engine).
#pragma once

#include "zoe/config.hpp"

namespace zoe::core {

class LossScaler {
 public:
  explicit LossScaler(const Config& config);
  double scale() const { return scale_; }
  /// Records one step's outcome and updates the scale.
  void update(bool overflow);

  /// Everything that changes over training (for checkpoints).
  struct State {
    double scale;
    int good_steps, hysteresis_left;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    good_steps_ = s.good_steps;
    hysteresis_left_ = s.hysteresis_left;
  }

 private:
  bool dynamic_;
  double scale_, min_scale_;
  int window_, hysteresis_, hysteresis_left_, good_steps_ = 0;
};

}  // namespace zoe::core
