// DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py: WarmupLR,
// WarmupDecayLR, WarmupCosineLR), operation for operation in double as DeepSpeed's Python
// computes them, so zoe's lr equals DeepSpeed's bit for bit (same libm log and cos).
//
// DeepSpeed's indexing: the scheduler is built with last_batch_iteration = -1 and sets the
// optimizer's lr to get_lr() then; DeepSpeed's engine steps the scheduler after every applied
// optimizer step (not after a skipped fp16 step), which adds one to last_batch_iteration. So
// the optimizer step that follows `applied` applied steps runs with last_batch_iteration =
// applied - 1: the first step with -1 (WarmupLR: warmup_min_lr; WarmupCosineLR: 0), the
// second with 0, and so on.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "zoe/config.hpp"

namespace zoe {
namespace {
// WarmupLR._get_gamma / WarmupCosineLR's warmup ratio for last_batch_iteration < warmup steps.
double warmup_gamma(WarmupType type, std::int64_t last, std::int64_t warmup_num_steps) {
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warmup_num_steps));
  if (type == WarmupType::log) return inverse_log_warm_up * std::log(static_cast<double>(last + 1));
  return static_cast<double>(last) / static_cast<double>(warmup_num_steps);
}
}  // namespace

double SchedulerConfig::lr_at(double optimizer_lr, std::int64_t applied_steps) const {
  const std::int64_t last = applied_steps - 1;  // DeepSpeed's last_batch_iteration
  const std::int64_t warmup = std::max<std::int64_t>(2, warmup_num_steps);  // self.warmup_num_steps = max(2, n)
  switch (type) {
    case SchedulerType::none:
      return optimizer_lr;
    case SchedulerType::warmup_lr:
    case SchedulerType::warmup_decay_lr: {
      // WarmupLR's warmup_max_lr defaults to the optimizer's lr; WarmupDecayLR's to 0.001.
      const double max_lr = warmup_max_lr.value_or(type == SchedulerType::warmup_lr ? optimizer_lr : 0.001);
      const double min_lr = warmup_min_lr;
      if (last < 0) return min_lr;  // get_lr() before the first scheduler step
      const double delta_lr = max_lr - min_lr;
      double gamma = 1.0;
      if (last < warmup) {
        gamma = warmup_gamma(warmup_type, last, warmup);
      } else if (type == SchedulerType::warmup_decay_lr) {
        // max(0.0, float(total - last) / float(max(1.0, total - warmup)))
        const double den = std::max(1.0, static_cast<double>(total_num_steps - warmup));
        gamma = std::max(0.0, static_cast<double>(total_num_steps - last) / den);
      }
      return min_lr + delta_lr * gamma;
    }
    case SchedulerType::warmup_cosine_lr: {
      if (last < 0) return 0.0;  // get_lr() before the first scheduler step: [0.0 for each group]
      double ratio;
      if (last < warmup) {
        ratio = warmup_gamma(warmup_type, last, warmup);
        const double ratio_delta = 1. - warmup_min_ratio;
        ratio = warmup_min_ratio + ratio * ratio_delta;
      } else {
        const double real_last_step = static_cast<double>(last - warmup + 1);
        const double real_total_steps = static_cast<double>(std::max<std::int64_t>(1, total_num_steps - warmup));
        const double cosine_progress = std::min(1.0, real_last_step / real_total_steps);
        const double ratio_delta = 1. - cos_min_ratio;
        ratio = (1 + std::cos(std::numbers::pi * cosine_progress)) / 2;
        ratio = std::max(0.0, cos_min_ratio + ratio_delta * ratio);
      }
      return optimizer_lr * ratio;
    }
  }
  return optimizer_lr;
}

}  // namespace zoe
