// Gradient buffers handed to the trainer and their reduction.
//  stage 0: grad_full persistent; all-reduced after the last micro-batch's backward.
//  stage 1: grad_full persistent; reduce-scattered into grad_shard after the last one.
//  stages 2-3: grad_full lives for one micro-batch; reduce-scattered as soon as every module
//    using the group finished its backward (overlapping the rest of backward on the side
//    stream) and accumulated into the persistent grad_shard.
// A group's reduction is one bucket (the module's flat buffer). With optimizer offload the
// reduced shard also goes, as soon as it is ready, into the fp32 gradients of the offloaded
// sub-groups (host memory or NVMe; offload_grads through the GradientSink: a copy stream of its
// own into pinned buffers, then an I/O worker, never the collective stream), accumulating over
// micro-batches.
#include <algorithm>

#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

void EngineImpl::prepare_grads(ModuleInfo& m) {
  if (!policy.shards_grads) return;  // persistent buffers, zeroed after each step
  bool filled = false;
  for (int gi : m.groups) {
    Group& g = groups[gi];
    if (g.frozen || g.grad_full) continue;  // frozen: no gradient buffer
    g.grad_full = alloc(MemKind::buffer, dtype, g.layout->padded_numel());
    device.fill(g.grad_full.data(), dtype, g.layout->padded_numel(), 0.0f, *side);
    filled = true;
  }
  if (filled) {
    auto e = device.create_event();
    device.record(*e, *side);
    ready_for_compute(*e);
  }
}

void EngineImpl::finish_backward(ModuleInfo& m) {
  ++m.backward_count;
  side_waits_for_compute();
  for (int gi : m.groups) {
    Group& g = groups[gi];
    if (g.frozen) continue;  // no gradients: never reduced
    if (--g.pending_users > 0) continue;
    g.pending_users = static_cast<int>(g.users.size());
    ++g.micro_batches;
    if (policy.shards_grads || g.micro_batches == config.gradient_accumulation_steps) reduce_group(g);
  }
}

void EngineImpl::reduce_group(Group& g) {
  const FlatLayout& L = *g.layout;
  const std::int64_t S = L.shard_numel();
  const int gas = config.gradient_accumulation_steps;
  const bool offloaded = has_offloaded_sub_groups(g);
  if (!policy.shards_optimizer) {
    all_reduce(g.grad_full.data(), L.padded_numel(), dtype, grads_tag(g));
    return;
  }
  if (policy.reduces_at_step) {  // after the last micro-batch, into a shard the step reads
    g.grad_shard = alloc(MemKind::buffer, dtype, S);
    reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, dtype, grads_tag(g));
    if (offloaded) offload_grads(g, g.grad_shard.data(), true, true);  // read before the step (drained)
    return;
  }
  // Each micro-batch, as soon as the group's backward ended.
  const bool first = g.micro_batches == 1, last = g.micro_batches == gas;
  if (gas == 1 && g.grad_shard) {
    reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, dtype, grads_tag(g));
    if (offloaded) offload_grads(g, g.grad_shard.data(), true, true);
  } else {
    DeviceBuffer part = alloc(MemKind::buffer, dtype, S);
    reduce_scatter(g.grad_full.data(), part.data(), S, dtype, grads_tag(g));
    // Micro-batches add up in fp32 (grad_dtype() is f32 when gas > 1).
    if (g.grad_shard && first) device.cast(part.data(), dtype, g.grad_shard.data(), DType::f32, S, *side);
    if (g.grad_shard && !first) device.accumulate(part.data(), dtype, static_cast<float*>(g.grad_shard.data()), S, *side);
    if (offloaded) {
      std::shared_ptr<Event> read = offload_grads(g, part.data(), first, last);
      free_after(std::move(part), std::move(read));
    } else {
      free_after_side(std::move(part));
    }
  }
  free_after_side(std::move(g.grad_full));
}

std::shared_ptr<Event> EngineImpl::offload_grads(Group& g, const void* shard, bool first, bool last) {
  auto reduced = std::shared_ptr<Event>(device.create_event());
  device.record(*reduced, *side);
  std::shared_ptr<Event> read = reduced;
  const std::size_t esz = dtype_size(dtype);
  // The tier write waits for the group's previous update (it may still read the gradients:
  // delayed update).
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded())
      read = grad_sink->add(sg.offload_id, static_cast<const char*>(shard) + sg.begin * esz, sg.numel, first, last,
                            *reduced, g.host_done);
  return read;
}

void EngineImpl::zero_offloaded_grads(Group& g) {
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded()) grad_sink->zero(sg.offload_id, g.host_done);
}

DType EngineImpl::grad_dtype() const {
  return policy.shards_grads && config.gradient_accumulation_steps > 1 ? DType::f32 : dtype;
}

bool EngineImpl::has_device_sub_groups(const Group& g) const {
  if (!states) return true;  // no offload: everything is on the device, even an empty group
  return std::any_of(g.subgroups.begin(), g.subgroups.end(), [](const SubGroup& sg) { return !sg.offloaded(); });
}

bool EngineImpl::has_offloaded_sub_groups(const Group& g) const {
  return std::any_of(g.subgroups.begin(), g.subgroups.end(), [](const SubGroup& sg) { return sg.offloaded(); });
}

}  // namespace zoe::core
