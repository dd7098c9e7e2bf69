#include "src/core/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

namespace zoe::core {

LossScaler::LossScaler(const Config& c)
    : dynamic_(c.fp16.enabled && c.fp16.loss_scale == 0.0),
      scale_(!c.fp16.enabled ? 1.0 : dynamic_ ? std::ldexp(1.0, c.fp16.initial_scale_power) : c.fp16.loss_scale),
      min_scale_(c.fp16.min_loss_scale),
      window_(c.fp16.loss_scale_window),
      hysteresis_(c.fp16.hysteresis),
      hysteresis_left_(c.fp16.hysteresis) {}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    good_steps_ = 0;
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      scale_ = std::max(scale_ / 2, min_scale_);
    }
    return;
  }
  if (++good_steps_ >= window_) {
    scale_ *= 2;
    good_steps_ = 0;
    hysteresis_left_ = hysteresis_;
  }
}

}  // namespace zoe::core
