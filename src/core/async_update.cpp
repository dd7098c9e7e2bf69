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
// Sub-groups on the device optimizer are Device::adam_step calls queued on the update stream.
// Offloaded ones run the CPU optimizer: on the host device as host functions on the update
// stream (an executor thread); on other devices synchronously on the calling thread.
#include <algorithm>
#include <cstring>

#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"
#include "src/core/test_hooks.hpp"

namespace zoe::core {

void EngineImpl::start_update(const UpdatePlan& plan) {
  const bool queue = config.zoe.overlap_step && device.kind() == DeviceKind::host;
  // Delayed update: the next step's backward refills the gradient buffers while this update
  // still reads them, so it reads a snapshot (stage 1's reduce-scatter output is already
  // private to the step), and the persistent buffers are zeroed now.
  std::vector<std::shared_ptr<DeviceBuffer>> snapshots(groups.size());
  if (delayed) {
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      Group& g = groups[gi];
      // (Validated: the delayed update needs optimizer offload, hence stage >= 1.)
      if (stage >= 2) {
        if (!g.grad_shard) continue;  // every sub-group offloaded: offload_grads waits for the update
        snapshots[gi] = std::make_shared<DeviceBuffer>(alloc(MemKind::buffer, grad_dtype(), g.layout->shard_numel()));
        device.copy(snapshots[gi]->data(), grad_of(g), snapshots[gi]->bytes(), *side);
      } else {
        device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *side);
      }
    }
    device.synchronize(*side);
  }
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    Group& g = groups[gi];
    if (stage == 1 || stage == 2 || delayed) {
      // The new parameters wait in `updated` until after_update applies them.
      g.updated = alloc(MemKind::buffer, dtype, g.layout->shard_numel());
      g.params_stale = true;
    }
    // Pointers are taken now: the buffers may change hands before the work runs.
    const void* grad = snapshots[gi] ? snapshots[gi]->data() : grad_of(g);
    void* out = g.updated ? g.updated.data() : stage == 0 ? g.param_full.data() : g.param_shard.data();
    // Parameter offload: device sub-groups write into a device buffer the write-back reads.
    std::shared_ptr<DeviceBuffer> device_out;
    if (param_store) {
      const bool any_on_device = std::any_of(g.subgroups.begin(), g.subgroups.end(),
                                             [](const SubGroup& sg) { return !sg.offloaded(); });
      device_out = std::make_shared<DeviceBuffer>(
          any_on_device ? alloc(MemKind::buffer, dtype, g.layout->shard_numel()) : DeviceBuffer());
      out = device_out->data();
    }
    if (out) update_on_device(g, plan, grad, out, *update_stream);
    auto host_work = [this, &g, gi, plan, out, device_out] {
      if (device_out) {
        update_offloaded_params(g, plan, *device_out);
      } else {
        update_offloaded(g, plan, out, *update_stream);
      }
      if (test_hooks::after_group_update) test_hooks::after_group_update(static_cast<int>(gi));
    };
    if (queue) {
      device.host_func(*update_stream, std::move(host_work));
    } else {
      device.synchronize(*update_stream);  // the device sub-groups' output is read below
      host_work();
    }
    // The gradients are consumed: stages 0-1 zero the persistent buffer for the next step.
    if (stage <= 1 && !delayed) device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *update_stream);
    device.record(*g.update_done, *update_stream);
    // Buffers the update reads are freed after it.
    auto free_after_update = [&](DeviceBuffer buffer, std::shared_ptr<void> hold) {
      PendingFree f{std::move(buffer), device.create_event(), 0, std::move(hold)};
      device.record(*f.after, *update_stream);
      pending_frees.push_back(std::move(f));
    };
    if (device_out && *device_out) free_after_update(DeviceBuffer(), device_out);
    if (snapshots[gi]) free_after_update(DeviceBuffer(), snapshots[gi]);
    if (stage == 1) free_after_update(std::move(g.grad_shard), nullptr);
  }
  if (!queue && !delayed) finish_update();
}

void EngineImpl::after_update(Group& g) {
  device.wait(*side, *g.update_done);
  if (!g.params_stale) return;
  g.params_stale = false;
  if (stage == 1 || stage == 2) {
    all_gather(g.updated.data(), g.param_full.data(), g.layout->shard_numel(), dtype, params_tag(g));
  } else {  // stage 3, delayed update
    device.copy(g.param_shard.data(), g.updated.data(), g.param_shard.bytes(), *side);
  }
  device.record(*g.param_ready, *side);
  free_after_side(std::move(g.updated));
}

void EngineImpl::finish_update() {
  device.synchronize(*update_stream);  // rethrows an error of the update
  for (Group& g : groups) after_update(g);
}

}  // namespace zoe::core
