// The optimizer step, top-down: check the step's calls, reduce the last gradients, measure
// the global gradient norm and overflow (one small all-reduce), update the loss scale and
// the clip coefficient, then hand the update to the Updater (Adam / AdamW over sub-groups,
// with unscale, averaging and clipping fused into one gradient factor; it overlaps the next
// forward), and reset the step's bookkeeping.
#include <algorithm>
#include <cmath>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/common/log.hpp"
#include "src/core/engine_impl.hpp"
#include "src/core/update/grad_norm.hpp"

namespace zoe {

namespace {
// Throws UsageError unless every module is idle.
void check_modules_idle(const core::Model& model, const core::CallRules& rules) {
  for (std::size_t mi = 0; mi < model.modules.size(); ++mi) {
    const core::ModulePhase phase = rules.phase(static_cast<int>(mi));
    ZOE_CHECK_USAGE(phase == core::ModulePhase::idle, "step() while module ", detail::quoted(model.modules[mi].name), " is still in ",
                    phase == core::ModulePhase::forward ? "forward" : "backward");
  }
}

// Throws UsageError unless every module ran gradient_accumulation_steps backward passes or
// none. (Checked per module, not only per group: modules that share a group add into one
// buffer, so a module that missed a micro-batch would not show in the group's count.)
void check_module_backwards(const core::Model& model, const core::CallRules& rules, int gas) {
  for (std::size_t mi = 0; mi < model.modules.size(); ++mi) {
    const int b = rules.backwards(static_cast<int>(mi));
    ZOE_CHECK_USAGE(b == 0 || b == gas, "step() after ", b, " backward pass(es) of module ", detail::quoted(model.modules[mi].name),
                    "; gradient_accumulation_steps is ", gas,
                    " (rule: a module runs its backward in every micro-batch of a step or in none)");
  }
}

// Throws UsageError unless every trainable group took exactly gradient_accumulation_steps
// micro-batches of backward (a group no module ran backward for takes none: its gradient is
// zero).
void check_micro_batches(const core::Model& model, const core::CallRules& rules, int gas) {
  // Frozen groups have no gradients: they are never reduced and take no part in the step.
  // Neither does a trainable group no module uses (a module whose parameters are all frozen or
  // owned by another module leaves its trainable group empty): its count stays 0.
  int micro = 0;
  bool any_trainable = false;
  for (const core::Group& g : model.groups) {
    if (g.frozen || g.users.empty()) continue;
    any_trainable = true;
    micro = std::max(micro, g.micro_batches);
  }
  if (!any_trainable)  // every parameter frozen: the backward count alone says the step is complete
    for (std::size_t mi = 0; mi < model.modules.size(); ++mi) micro = std::max(micro, rules.backwards(static_cast<int>(mi)));
  ZOE_CHECK_USAGE(micro == gas, "step() after ", micro, " micro-batch(es) of backward; gradient_accumulation_steps is ",
                  gas);
  for (const core::Group& g : model.groups) {
    if (g.frozen) continue;
    ZOE_CHECK_USAGE(g.micro_batches == 0 || g.micro_batches == gas, "module group ", detail::quoted(g.name), " had ",
                    g.micro_batches, " backward passes this step, expected ", gas);
  }
}
}  // namespace

StepResult core::EngineImpl::step() {
  updater.wait_for_previous_step();
  check_modules_idle(model, rules);
  check_module_backwards(model, rules, cx.gradient_accumulation_steps());
  reducer.complete_partial_rounds();
  check_micro_batches(model, rules, cx.gradient_accumulation_steps());
  reducer.flush_bucket();  // the last round's gradients still waiting
  reducer.zero_unused_gradients();
  const core::GradStats stats = core::measure_gradients(cx, model, updater, tiers);
  if (cx.policy.shards_params) gatherer.shards_updated();  // persistent groups stay allocated, stale

  StepResult result;
  result.loss_scale = updater.scaler().scale();
  const bool overflow = stats.nonfinite > 0 || !std::isfinite(stats.sum_squares);
  // The reduced sums are of gradients already divided by pre_divisor() (prescale_gradients).
  const double inv = updater.unclipped_grad_factor();
  result.grad_norm = std::sqrt(stats.sum_squares) * inv;
  const double max_norm = cx.config.gradient_clipping;
  if (!overflow && max_norm > 0) result.clip_coef = std::min(1.0, max_norm / (result.grad_norm + 1e-6));

  if (overflow) {
    updater.check_overflow_skippable();
    result.skipped = true;
    if (cx.config.fp16.enabled)
      ZOE_LOG_WARN("rank {}: inf/NaN in the gradients; step skipped, loss scale {}", cx.rank, updater.scaler().scale());
    else
      ZOE_LOG_WARN("rank {}: inf/NaN in the gradients; step skipped (nothing updated)", cx.rank);
  } else {
    updater.start_update(updater.plan(static_cast<float>(inv * result.clip_coef)));
  }
  updater.step_ended();
  updater.scaler().update(overflow);

  reducer.reset_for_next_step(overflow);
  if (cx.policy.shards_params) gatherer.end_step();
  cx.device.synchronize(*cx.side);
  cx.frees.reap(false);
  coll.end_step();
  result.step = updater.steps();
  return result;
}

}  // namespace zoe
