// Learning-rate schedule: linear warmup, then cosine decay to a floor (as nanoGPT / GPT-3,
// Brown et al. 2020 §2.3 / Appendix B: "cosine decay ... with warmup").
// Thread-safety: pure function.
#pragma once

#include <algorithm>
#include <cmath>

namespace gpt {

/// lr at 0-based `step` of `total`: peak*(step+1)/warmup during warmup, then
/// min_lr + (peak - min_lr) * (1 + cos(pi * t)) / 2 with t = (step - warmup)/(total - warmup).
inline double learning_rate(int step, int total, int warmup, double peak, double min_lr) {
  if (warmup > 0 && step < warmup) return peak * (step + 1) / warmup;
  if (total <= warmup) return peak;
  const double t = std::clamp(static_cast<double>(step - warmup) / (total - warmup), 0.0, 1.0);
  return min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
}

}  // namespace gpt
