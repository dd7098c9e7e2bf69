// The optimizer update overlapping the next forward (ZeRO-Offload's CPU step, without its
// one-step delay). step() computes the norm and clip factor, then queues each group's Adam
// update, in registration (= forward) order, on the update stream and returns. An event
// after each group lets the side stream, not the trainer's thread, wait for exactly the
// groups the next collective reads, so begin_forward(module k) waits only for the groups of
// module k and prefetching stays ahead. The math is the synchronous step's: nothing reads
// a group before its update is done.
//
// Delayed update (zoe.delayed_update, ZeRO-Offload's one-step-delayed parameter update,
// Ren et al. 2021, §4.2 "DPU"): the update of step N reads a snapshot of step N's gradients
// and writes the new parameters aside; step N+1's forward and backward use the parameters of
// update N-1 and do not wait for it; step N+1's step() applies it. This changes the math
// (gradients of step N+1 are taken at parameters one update old), in exchange for the CPU
// step overlapping the whole next forward and backward. save_checkpoint, synchronize and
// gather_parameter apply a pending update first.
//
// Collectives stay on the engine's thread and in program order (every rank issues them in
// the same order): the update only writes memory; stages 1-2 leave the new shard in
// Group::updated and after_update() all-gathers it before the group's next use.
//
// Sub-groups on the device optimizer are Device::adam_step calls queued on the update stream
// (its event `update_done`). Offloaded ones form the group's host part, run by the one
// UpdatePipeline on every device (its worker thread, CpuAdam's own arena); their GroupDone is
// set once the new parameters are on the device. after_update() orders the side stream after
// both: a device wait on update_done, and a host function waiting for GroupDone. The host
// latch, not an event the worker records, because waiting on a CUDA event that is not yet
// recorded does not wait; the side stream, not the engine's thread, blocks, so prefetching
// queues ahead without waiting for later groups' updates.
#include <algorithm>
#include <cstring>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

void EngineImpl::start_update(const UpdatePlan& plan) {
  // Delayed update: the next step's backward refills the gradient buffers while this update
  // still reads them, so it reads a snapshot (stage 1's reduce-scatter output is already
  // private to the step), and the persistent buffers are zeroed now.
  std::vector<std::shared_ptr<DeviceBuffer>> snapshots(groups.size());
  if (delayed) {
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      Group& g = groups[gi];
      if (g.frozen) continue;
      // (Validated: the delayed update needs optimizer offload, hence a sharded optimizer.)
      if (policy.shards_grads) {
        if (!g.grad_shard) continue;  // every sub-group offloaded: offload_grads waits for the update
        snapshots[gi] = std::make_shared<DeviceBuffer>(alloc(MemKind::buffer, grad_dtype(), g.layout->shard_numel()));
        device.copy(snapshots[gi]->data(), grad_of(g), snapshots[gi]->bytes(), *side);
      } else {
        device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *side);
      }
    }
    device.synchronize(*side);
  }
  std::vector<PipelineGroup> host_parts;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    Group& g = groups[gi];
    // Frozen: nothing to update (it stays settled). update_step == plan.step: started in
    // backward (zoe.update_in_backward).
    if (g.frozen || g.update_step == plan.step) continue;
    // The previous step's update of a group this step never used (step() waited for it only
    // when no update began in backward).
    if (g.update_state == Group::UpdateState::pending) after_update(g);
    begin_group_update(gi, plan, snapshots[gi], host_parts);
  }
  if (!host_parts.empty()) pipeline->start(std::move(host_parts), plan);
  if (!config.zoe.overlap_step && !delayed) finish_update();
}

void EngineImpl::begin_group_update(std::size_t gi, const UpdatePlan& plan,
                                    const std::shared_ptr<DeviceBuffer>& snapshot,
                                    std::vector<PipelineGroup>& host_parts) {
  Group& g = groups[gi];
  ZOE_CHECK(g.update_state == Group::UpdateState::settled, "group ", detail::quoted(g.name), ": update started twice");
  g.update_step = plan.step;
  if (policy.gathers_updates || delayed) {
    // The new parameters wait in `updated` until after_update applies them.
    g.updated = alloc(MemKind::buffer, dtype, g.layout->shard_numel());
  }
  // Pointers are taken now: the buffers may change hands before the work runs.
  const void* grad = snapshot ? snapshot->data() : grad_of(g);
  void* out = g.updated ? g.updated.data() : !policy.shards_optimizer ? g.param_full.data() : g.param_shard.data();
  // Parameter offload: device sub-groups write into a device buffer the host part copies
  // into the tier.
  std::shared_ptr<DeviceBuffer> device_out;
  if (param_store) {
    device_out = std::make_shared<DeviceBuffer>(
        has_device_sub_groups(g) ? alloc(MemKind::buffer, dtype, g.layout->shard_numel()) : DeviceBuffer());
    out = device_out->data();
  }
  if (out) update_on_device(g, plan, grad, out, *update_stream);
  // The gradients are consumed: stages 0-1 zero the persistent buffer for the next step.
  if (!policy.shards_grads && !delayed) device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *update_stream);
  device.record(*g.update_done, *update_stream);
  g.update_state = Group::UpdateState::pending;
  g.host_done.reset();
  if (param_store || has_offloaded_sub_groups(g)) {
    host_parts.push_back(param_store ? param_host_part(g, static_cast<int>(gi), device_out)
                                     : host_part(g, static_cast<int>(gi), out));
    g.host_done = host_parts.back().done = std::make_shared<GroupDone>();
  }
  // Buffers the device part reads are freed after it.
  if (snapshot) frees.after_stream(*update_stream, DeviceBuffer(), snapshot);
  if (policy.reduces_at_step) frees.after_stream(*update_stream, std::move(g.grad_shard));
}

UpdatePlan EngineImpl::plan_without_norm() const {
  const auto& oc = config.optimizer;
  const double l = config.scheduler.type != SchedulerType::none ? config.scheduler.lr_at(oc.lr, step_count) : lr;
  const double inv = pre_divisor() / (scaler.scale() * world * config.gradient_accumulation_steps);
  return UpdatePlan{optim::AdamHyper{l, oc.betas[0], oc.betas[1], oc.eps, oc.weight_decay,
                                     oc.type == OptimizerType::adamw, oc.bias_correction},
                    step_count + 1, static_cast<float>(inv)};
}

// zoe.update_in_backward (the optimizer step in backward: PyTorch's optimizer hooks in
// backward, LOMO's fused update; here with the states offloaded). A group's gradient is final
// once the step's last micro-batch reduced it; with no clipping and no loss scaling (the
// config refuses both: they need every gradient's norm first) nothing else its update needs
// is still to come, so its update starts then, while backward goes on: the CPU optimizer's
// NVMe reads and writes overlap the rest of backward, not only the next forward. The math is
// the plain step's, bit for bit. Each group is one pipeline wave (its `ready` latch: the
// gradient sink has written its gradient), queued behind the previous step's last wave.
void EngineImpl::start_update_in_backward(int gi) {
  Group& g = groups[static_cast<std::size_t>(gi)];
  if (step_update == StepUpdate::not_started) {
    backward_plan = plan_without_norm();
    step_update = StepUpdate::in_backward;
  }
  if (g.update_state == Group::UpdateState::pending) after_update(g);  // the previous step's, not yet applied
  std::vector<PipelineGroup> host_parts;
  begin_group_update(static_cast<std::size_t>(gi), backward_plan, nullptr, host_parts);
  if (host_parts.empty()) return;
  host_parts.front().ready = std::make_shared<GroupDone>();
  grad_sink->signal(host_parts.front().ready);
  pipeline->start(std::move(host_parts), backward_plan);
}

int EngineImpl::groups_updated_in_backward() const {
  int started = 0;
  for (const Group& g : groups) started += g.update_step == backward_plan.step ? 1 : 0;
  return started;
}

void EngineImpl::check_forward_after_update_in_backward(int m) const {
  if (step_update != StepUpdate::in_backward) return;
  const ModuleInfo& mod = modules[static_cast<std::size_t>(m)];
  for (int gi : mod.groups) {
    const Group& g = groups[static_cast<std::size_t>(gi)];
    ZOE_CHECK_USAGE(g.update_step != backward_plan.step, "begin_forward(", detail::quoted(mod.name), ") before step() with "
                    "zoe.update_in_backward: its group ", detail::quoted(g.name), " already took step ", backward_plan.step,
                    "'s update in backward; call step() first (evaluation belongs between steps)");
  }
}

void EngineImpl::check_no_update_in_backward(const char* call) const {
  if (step_update != StepUpdate::in_backward) return;
  ZOE_THROW(UsageError, call, " after the last micro-batch's backward and before step() with "
            "zoe.update_in_backward: ", groups_updated_in_backward(), " group(s) already took step ", backward_plan.step,
            "'s update, so the parameters and optimizer states are between two steps; call step() first");
}

PipelineGroup EngineImpl::host_part(Group& g, int index, void* out) {
  PipelineGroup pg;
  pg.index = index;
  pg.out = out;
  pg.out_on_device = true;
  const std::size_t esz = dtype_size(dtype);
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded())
      pg.subgroups.push_back(
          PipelineSubGroup{sg.offload_id, sg.numel, static_cast<std::size_t>(sg.begin) * esz, sg.runs});
  return pg;
}

void EngineImpl::after_update(Group& g) {
  if (g.update_state != Group::UpdateState::pending) return;
  g.update_state = Group::UpdateState::settled;
  device.wait(*side, *g.update_done);
  // The host part: wait on the side stream (not on this thread) for its latch.
  if (g.host_done) device.host_func(*side, [done = g.host_done] { done->wait(); });
  if (g.updated) {
    if (policy.gathers_updates) {
      gather_update(g);
    } else {  // stage 3, delayed update
      device.copy(g.param_shard.data(), g.updated.data(), g.param_shard.bytes(), *side);
    }
    frees.after_side(std::move(g.updated));
  }
  device.record(*g.param_ready, *side);
}

void EngineImpl::finish_update() {
  if (pipeline) pipeline->finish();        // rethrows an error of the host part
  device.synchronize(*update_stream);       // and of the device part
  for (Group& g : groups) after_update(g);
}

void EngineImpl::gather_update(Group& g) {
  // DeepSpeed's all_gather_dp_groups: max(1, shard · world / allgather_bucket_size) pieces of
  // the shard, each aligned (16 elements here, zoe's alignment), the last taking the rest.
  const std::int64_t S = g.layout->shard_numel();
  const std::int64_t pieces = std::max<std::int64_t>(1, S * world / config.zero_optimization.allgather_bucket_size);
  // DeepSpeed aligns a piece down (to 2 elements) and would issue empty ones below that.
  const std::int64_t piece = std::max<std::int64_t>(FlatLayout::kAlign, S / pieces / FlatLayout::kAlign * FlatLayout::kAlign);
  const std::int64_t count = std::min(pieces, S / piece);
  if (count == 1) {
    all_gather(g.updated.data(), g.param_full.data(), S, dtype, params_tag(g));
    return;
  }
  const std::size_t esz = dtype_size(dtype);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t begin = k * piece, n = k + 1 == count ? S - begin : piece;  // the last takes the rest
    DeviceBuffer recv = alloc(MemKind::buffer, dtype, n * world);
    all_gather(at(g.updated.data(), begin), recv.data(), n, dtype, params_tag(g));
    for (int r = 0; r < world; ++r)
      device.copy(at(g.param_full.data(), r * S + begin), at(recv.data(), r * n), static_cast<std::size_t>(n) * esz, *side);
    frees.after_side(std::move(recv));
  }
}

}  // namespace zoe::core
