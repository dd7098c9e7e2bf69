// The optimizer step: global gradient norm and overflow check from the reduced gradients
// (own-shard sums of squares, one small all-reduce), loss-scale update, clip coefficient,
// then Adam/AdamW over sub-groups of this rank's range with unscale, averaging and clipping
// fused into one gradient factor, and the updated parameters written back (stage 3: the
// shard; stages 1-2: all-gathered into the full copy; stage 0: the full copy).
//
// Bitwise agreement between stages: the per-rank partial sums of squares are formed the
// same way in every stage (stage 0 forms all ranks' partials locally) and added in rank
// order, as the communicator's all-reduce does; Adam is elementwise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "kernels/adam_math.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

StepResult EngineImpl::step() {
  // The previous step's update, if it still runs; unless this step's has begun in backward
  // (zoe.update_in_backward), queued behind it: waiting would wait for that too.
  // (Then the error of an earlier wave surfaces here, without waiting.)
  if (step_update == StepUpdate::not_started) {
    finish_update();
  } else if (pipeline) {
    pipeline->check();
  }
  const int gas = config.gradient_accumulation_steps;
  for (const ModuleInfo& m : modules) {
    ZOE_CHECK_USAGE(m.phase == ModuleInfo::Phase::idle, "step() while module ", detail::quoted(m.name), " is still in ",
                    m.phase == ModuleInfo::Phase::forward ? "forward" : "backward");
  }
  // Frozen groups have no gradients: they are never reduced and take no part in the step.
  // Neither does a trainable group no module uses (a module whose parameters are all frozen or
  // owned by another module leaves its trainable group empty): its count stays 0.
  int micro = 0;
  bool any_trainable = false;
  for (const Group& g : groups) {
    if (g.frozen || g.users.empty()) continue;
    any_trainable = true;
    micro = std::max(micro, g.micro_batches);
  }
  if (!any_trainable) {  // every parameter frozen: the backward count alone says the step is complete
    for (const ModuleInfo& m : modules) micro = std::max(micro, m.backward_count);
  }
  ZOE_CHECK_USAGE(micro == gas, "step() after ", micro, " micro-batch(es) of backward; gradient_accumulation_steps is ",
                  gas);
  for (const Group& g : groups) {
    if (g.frozen) continue;
    ZOE_CHECK_USAGE(g.micro_batches == 0 || g.micro_batches == gas, "module group ", detail::quoted(g.name), " had ",
                    g.micro_batches, " backward passes this step, expected ", gas);
  }
  flush_bucket();  // the last round's gradients still waiting
  Stream& s = *side;
  const DType gdt = grad_dtype();
  // Groups no module ran backward for this step have zero gradients.
  for (Group& g : groups) {
    if (g.frozen || g.micro_batches != 0) continue;
    if (policy.reduces_at_step) g.grad_shard = alloc(MemKind::buffer, dtype, g.layout->shard_numel());
    if (policy.shards_optimizer && g.grad_shard) device.fill(g.grad_shard.data(), gdt, g.layout->shard_numel(), 0.0f, s);
    if (has_offloaded_sub_groups(g)) zero_offloaded_grads(g);
  }

  // ---- sums of squares and finite flags. Each rank's shard of each group is summed in
  // pieces of sub_group_size elements (the sub-groups), in fp64, and the pieces are added in
  // order: the same in every stage (stage 0 forms all ranks' partials itself) whether a
  // piece's gradient is on the device or offloaded (whose sum add_grad recorded).
  struct Piece {
    int rank;
    std::int64_t begin, numel;  // in the rank's shard
    int offload_id;             // >= 0: an offloaded sub-group
    const Group* group;
  };
  const int parts = policy.shards_optimizer ? 1 : world;
  const std::size_t G = groups.size();
  std::vector<Piece> pieces;
  for (const Group& g : groups) {
    if (g.frozen) continue;
    const std::int64_t S = g.layout->shard_numel();
    for (int r = 0; r < parts; ++r) {
      for (std::int64_t c = 0; c < S; c += sub_group_numel()) {
        const std::int64_t n = std::min(sub_group_numel(), S - c);
        int id = -1;
        if (policy.shards_optimizer) {
          const SubGroup& sg = g.subgroups[static_cast<std::size_t>(c / sub_group_numel())];
          id = sg.offload_id;
        }
        pieces.push_back(Piece{r, c, n, id, &g});
      }
    }
  }
  DeviceBuffer sums = alloc(MemKind::buffer, DType::f32, static_cast<std::int64_t>(2 * std::max<std::size_t>(pieces.size(), 1)));
  DeviceBuffer finite = alloc(MemKind::buffer, DType::f32, static_cast<std::int64_t>(G));  // ints
  // The step's read-backs (sums, finite flags, the all-reduced pair) land in registered host
  // memory: no pageable copy on the hot path. Layout: [pieces doubles | 2 doubles | G ints].
  std::byte* area = readback_area(pieces.size() * sizeof(double) + 2 * sizeof(double) + G * sizeof(int));
  std::span<double> host_sums(reinterpret_cast<double*>(area), pieces.size());
  double* local = reinterpret_cast<double*>(area) + pieces.size();
  std::span<int> host_finite(reinterpret_cast<int*>(local + 2), G);
  std::fill(host_finite.begin(), host_finite.end(), 1);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.offload_id >= 0) continue;
    const std::int64_t at = p.rank * p.group->layout->shard_numel() + p.begin;
    device.sum_squares(static_cast<const char*>(grad_of(*p.group)) + at * dtype_size(gdt),
                       gdt, static_cast<std::size_t>(p.numel), static_cast<double*>(sums.data()) + i, s);
  }
  for (std::size_t gi = 0; gi < G; ++gi) {
    const Group& g = groups[gi];
    if (!grad_of(g)) continue;  // every sub-group offloaded
    const std::int64_t n = policy.shards_optimizer ? g.layout->shard_numel() : g.layout->padded_numel();
    device.all_finite(grad_of(g), gdt, static_cast<std::size_t>(n), static_cast<int*>(finite.data()) + gi, s);
  }
  device.copy(host_sums.data(), sums.data(), host_sums.size() * sizeof(double), s);
  device.copy(host_finite.data(), finite.data(), host_finite.size() * sizeof(int), s);
  device.synchronize(s);
  if (grad_sink) grad_sink->drain();  // the offloaded gradients' add_grad (their sums of squares)
  for (std::size_t gi = 0; gi < G; ++gi)
    if (!grad_of(groups[gi])) host_finite[gi] = 1;
  double total = 0.0, nonfinite = 0.0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].offload_id < 0) continue;
    host_sums[i] = states->grad_sum_squares(pieces[i].offload_id);
    nonfinite += states->grad_finite(pieces[i].offload_id) ? 0.0 : 1.0;
  }
  for (std::size_t gi = 0; gi < G; ++gi) nonfinite += host_finite[gi] ? 0.0 : 1.0;
  if (!policy.shards_optimizer) {
    for (int r = 0; r < parts; ++r) {
      double partial = 0.0;
      for (std::size_t i = 0; i < pieces.size(); ++i)
        if (pieces[i].rank == r) partial += host_sums[i];
      total += partial;
    }
  } else {
    local[0] = 0.0;
    local[1] = nonfinite;
    for (double x : host_sums) local[0] += x;
    DeviceBuffer red = alloc(MemKind::buffer, DType::f32, 4);
    device.copy(red.data(), local, 2 * sizeof(double), s);
    comm.all_reduce_f64(static_cast<double*>(red.data()), 2, s);
    device.copy(local, red.data(), 2 * sizeof(double), s);
    device.synchronize(s);
    total = local[0];
    nonfinite = local[1];
  }

  if (policy.shards_params) drop_all_gathered();  // persistent groups too: their shards change
  StepResult result;
  result.loss_scale = scaler.scale();
  const bool overflow = nonfinite > 0 || !std::isfinite(total);
  // The reduced sums are of gradients already divided by pre_divisor() (prescale_gradients).
  const double inv = pre_divisor() / (scaler.scale() * world * gas);
  result.grad_norm = std::sqrt(total) * inv;
  const double max_norm = config.gradient_clipping;
  if (!overflow && max_norm > 0) result.clip_coef = std::min(1.0, max_norm / (result.grad_norm + 1e-6));

  if (overflow && step_update == StepUpdate::in_backward) {
    // Some groups already took this step's update: the step cannot be skipped as a whole.
    ZOE_THROW(Error, "rank ", rank, ": inf/NaN in the gradients of step ", backward_plan.step,
              " with zoe.update_in_backward: ", groups_updated_in_backward(), " group(s) had already taken this step's update in "
              "backward, so the step cannot be skipped and those groups' master weights and exp_avg / exp_avg_sq "
              "may now hold inf/NaN; load the last checkpoint (and lower the lr, or turn zoe.update_in_backward "
              "off to get skipped steps)");
  }
  if (overflow) {
    result.skipped = true;
    ZOE_LOG_WARN("rank {}: inf/NaN in the gradients; step skipped, loss scale {}", rank, scaler.scale());
  } else {
    const auto& oc = config.optimizer;
    UpdatePlan plan{optim::AdamHyper{lr, oc.betas[0], oc.betas[1], oc.eps, oc.weight_decay,
                                     oc.type == OptimizerType::adamw, oc.bias_correction},
                    step_count + 1, static_cast<float>(inv * result.clip_coef)};
    if (step_update == StepUpdate::in_backward) {
      // What the groups started in backward used must be what the step computes (set_lr was
      // refused since; no clipping, no loss scale: validated).
      ZOE_CHECK(backward_plan.step == plan.step && backward_plan.grad_scale == plan.grad_scale &&
                    backward_plan.hyper.lr == plan.hyper.lr,
                "update in backward: its plan (step ", backward_plan.step, ", lr ", backward_plan.hyper.lr,
                ", gradient factor ", backward_plan.grad_scale, ") differs from step()'s (step ", plan.step, ", lr ",
                plan.hyper.lr, ", ", plan.grad_scale, ")");
    }
    ++step_count;
    start_update(plan);  // the groups not started in backward
  }
  step_update = StepUpdate::not_started;
  scaler.update(overflow);

  // ---- reset for the next step (the update, if running, owns the groups until it is done)
  for (Group& g : groups) {
    if (g.frozen) continue;
    if (overflow && !policy.shards_grads) device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, s);
    if (overflow && policy.reduces_at_step) frees.after_side(std::move(g.grad_shard));
    g.micro_batches = 0;
    g.pending_users = static_cast<int>(g.users.size());
  }
  for (ModuleInfo& m : modules) m.backward_count = 0;
  if (policy.shards_params) {
    trace.end_step();
  }
  device.synchronize(s);
  frees.reap(false);

  CommStats now = comm.stats();
  last_traffic.all_gather_bytes = now.all_gather_bytes - step_start_stats.all_gather_bytes;
  last_traffic.reduce_scatter_bytes = now.reduce_scatter_bytes - step_start_stats.reduce_scatter_bytes;
  last_traffic.all_reduce_bytes = now.all_reduce_bytes - step_start_stats.all_reduce_bytes;
  last_traffic.bytes_sent = now.total() - step_start_stats.total();
  last_traffic.elements_sent = elements_sent - elements_at_step_start;
  last_traffic.all_gather_calls = all_gather_calls - calls_at_step_start[0];
  last_traffic.reduce_scatter_calls = reduce_scatter_calls - calls_at_step_start[1];
  last_traffic.all_reduce_calls = all_reduce_calls - calls_at_step_start[2];
  last_traffic.calls = now.calls - step_start_stats.calls;
  calls_at_step_start[0] = all_gather_calls;
  calls_at_step_start[1] = reduce_scatter_calls;
  calls_at_step_start[2] = all_reduce_calls;
  step_start_stats = now;
  elements_at_step_start = elements_sent;
  result.step = step_count;
  return result;
}

const void* EngineImpl::grad_of(const Group& g) const {
  return policy.shards_optimizer ? g.grad_shard.data() : g.grad_full.data();
}

void EngineImpl::update_on_device(Group& g, const UpdatePlan& plan, const void* grad_data, void* out_data,
                                  Stream& s) {
  const std::size_t esz = dtype_size(dtype);
  const DType gdt = policy.reduces_at_step ? dtype : grad_dtype();
  for (const SubGroup& sg : g.subgroups) {
    if (sg.offloaded()) continue;
    const auto n = static_cast<std::size_t>(sg.numel);
    float* master = sg.master();
    // Each run of equal per-parameter options (weight decay, lr factor) with its coefficients,
    // from the same double hyper-parameters the CPU optimizer gets (hyper_for): same bits.
    for (const OptimRun& r : sg.runs) {
      const optim::AdamHyper h = hyper_for(plan.hyper, r);
      const kernels::AdamCoeffs c = kernels::adam_coeffs(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled,
                                                         plan.step, plan.grad_scale, h.bias_correction);
      const std::int64_t at = sg.begin + r.begin;
      const auto b = static_cast<std::size_t>(r.begin);
      device.adam_step(c, master + b, master + n + b, master + 2 * n + b,
                       static_cast<const char*>(grad_data) + at * dtype_size(gdt), gdt,
                       static_cast<char*>(out_data) + at * esz, dtype, static_cast<std::size_t>(r.numel), s);
    }
  }
}

std::byte* EngineImpl::readback_area(std::size_t bytes) {
  if (readback.size() < bytes) {
    if (readback_registered) device.unregister_host_memory(readback.data());
    readback = AlignedBuffer(std::max<std::size_t>(bytes, 4096));
    readback_registered = device.register_host_memory(readback.data(), readback.size());
  }
  return static_cast<std::byte*>(readback.data());
}

std::int64_t EngineImpl::sub_group_numel() const {
  return std::max<std::int64_t>(FlatLayout::kAlign,
                                config.zero_optimization.sub_group_size / FlatLayout::kAlign * FlatLayout::kAlign);
}

}  // namespace zoe::core
