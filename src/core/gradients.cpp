// Gradient buffers handed to the trainer and their reduction.
//  stage 0: grad_full persistent; all-reduced after the last micro-batch's backward.
//  stage 1: grad_full persistent; reduce-scattered into grad_shard after the last one.
//  stages 2-3: grad_full lives for one micro-batch; reduce-scattered once every module using
//    the group finished its backward (on the side stream, overlapping the rest of backward)
//    and accumulated into the persistent grad_shard.
// Reductions go through DeepSpeed's IPG bucket (GradBucket, engine_impl.hpp): consecutive
// groups, in the order their backward completed, reduced by one collective of at most
// zero_optimization.reduce_bucket_size elements (a larger group alone, straight from its
// buffer). A bucket of several groups is flattened into one buffer first (rank-major for
// reduce-scatter, so each rank's part is its shards of every group) and the result taken
// back per group; the sums are elementwise in rank order, so bucketing never changes a bit.
// overlap_comm false makes the trainer's compute wait for each bucket's reduction (DeepSpeed
// then reduces on the compute stream). With optimizer offload the reduced shard also goes,
// as soon as it is ready, into the fp32 gradients of the offloaded sub-groups (host memory
// or NVMe; offload_grads through the GradientSink: a copy stream of its own into pinned
// buffers, then an I/O worker, never the collective stream), accumulating over micro-batches.
#include <algorithm>

#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

void EngineImpl::prepare_grads(ModuleInfo& m) {
  // A group still waiting in the bucket is reduced before its buffer takes the next
  // micro-batch's gradients.
  for (int gi : m.groups)
    if (bucket.holds(gi)) {
      flush_bucket();
      break;
    }
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
    if (policy.shards_grads || g.micro_batches == config.gradient_accumulation_steps) queue_reduction(gi);
  }
  if (round_complete()) flush_bucket();
}

void EngineImpl::queue_reduction(int gi) {
  const std::int64_t n = groups[static_cast<std::size_t>(gi)].layout->padded_numel();
  const std::int64_t cap = config.zero_optimization.reduce_bucket_size;
  if (!bucket.groups.empty() && bucket.elements + n > cap) flush_bucket();  // DeepSpeed's test, before adding
  bucket.groups.push_back(gi);
  bucket.elements += n;
  if (bucket.elements >= cap) flush_bucket();  // full: nothing more can join (same buckets, issued sooner)
}

bool EngineImpl::round_complete() const {
  if (bucket.groups.empty()) return false;
  int round = 0;
  for (int gi : bucket.groups) round = std::max(round, groups[static_cast<std::size_t>(gi)].micro_batches);
  // Frozen groups have no gradients (micro_batches stays 0): they take no part in a round;
  // neither does a group no module uses (the empty trainable group of a module whose
  // parameters are all frozen or owned by another module).
  return std::all_of(groups.begin(), groups.end(), [round](const Group& g) {
    return g.frozen || g.users.empty() || g.micro_batches >= round;
  });
}

void EngineImpl::flush_bucket() {
  if (bucket.groups.empty()) return;
  std::vector<int> gis = std::move(bucket.groups);
  bucket = GradBucket{};
  if (const double p = pre_divisor(); p != 1.0)  // prescale_gradients / gradient_predivide_factor
    for (int gi : gis) {
      Group& g = groups[static_cast<std::size_t>(gi)];
      device.scale(g.grad_full.data(), dtype, static_cast<std::size_t>(g.layout->padded_numel()),
                   static_cast<float>(1.0 / p), *side);
    }
  if (gis.size() == 1) {
    reduce_group(groups[static_cast<std::size_t>(gis.front())]);
  } else {
    reduce_groups(gis);
  }
  // zoe.update_in_backward: the groups whose gradient of the step's last micro-batch this
  // reduced start their update now (async_update.cpp).
  if (config.zoe.update_in_backward)
    for (int gi : gis)
      if (groups[static_cast<std::size_t>(gi)].micro_batches == config.gradient_accumulation_steps)
        start_update_in_backward(gi);
  if (!config.zero_optimization.overlap_comm) {
    // DeepSpeed without overlap_comm reduces on the compute stream: the trainer's next work
    // (the rest of backward) starts after the reduction.
    auto done = device.create_event();
    device.record(*done, *side);
    ready_for_compute(*done);
  }
}

void EngineImpl::reduce_groups(const std::vector<int>& gis) {
  const std::size_t esz = dtype_size(dtype);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  const CollectiveTag tag = coalesced_tag(gis, CollectiveTag::Kind::grads);
  if (!policy.shards_optimizer) {  // stage 0: all-reduce the concatenation, copy the sums back
    std::int64_t total = 0;
    for (int gi : gis) total += groups[static_cast<std::size_t>(gi)].layout->padded_numel();
    DeviceBuffer flat = alloc(MemKind::buffer, dtype, total);
    std::int64_t off = 0;
    for (int gi : gis) {
      Group& g = groups[static_cast<std::size_t>(gi)];
      device.copy(at(flat.data(), off), g.grad_full.data(), g.grad_full.bytes(), *side);
      off += g.layout->padded_numel();
    }
    all_reduce(flat.data(), total, dtype, tag);
    off = 0;
    for (int gi : gis) {
      Group& g = groups[static_cast<std::size_t>(gi)];
      device.copy(g.grad_full.data(), at(flat.data(), off), g.grad_full.bytes(), *side);
      off += g.layout->padded_numel();
    }
    frees.after_side(std::move(flat));
    return;
  }
  // Rank-major: part r = [group 1's shard r | group 2's shard r | ...], so rank r receives its
  // shards of every group, contiguously.
  std::vector<std::int64_t> offsets;
  std::int64_t T = 0;
  for (int gi : gis) {
    offsets.push_back(T);
    T += groups[static_cast<std::size_t>(gi)].layout->shard_numel();
  }
  DeviceBuffer send = alloc(MemKind::buffer, dtype, T * world);
  for (int r = 0; r < world; ++r)
    for (std::size_t k = 0; k < gis.size(); ++k) {
      Group& g = groups[static_cast<std::size_t>(gis[k])];
      const std::int64_t S = g.layout->shard_numel();
      device.copy(at(send.data(), r * T + offsets[k]), at(g.grad_full.data(), r * S), static_cast<std::size_t>(S) * esz, *side);
    }
  DeviceBuffer out = alloc(MemKind::buffer, dtype, T);
  reduce_scatter(send.data(), out.data(), T, dtype, tag);
  frees.after_side(std::move(send));
  for (std::size_t k = 0; k < gis.size(); ++k) {
    Group& g = groups[static_cast<std::size_t>(gis[k])];
    absorb_shard(g, at(out.data(), offsets[k]));
    if (policy.shards_grads) frees.after_side(std::move(g.grad_full));
  }
  frees.after_side(std::move(out));
}

void EngineImpl::absorb_shard(Group& g, const void* reduced) {
  const std::int64_t S = g.layout->shard_numel();
  const std::size_t bytes = static_cast<std::size_t>(S) * dtype_size(dtype);
  const int gas = config.gradient_accumulation_steps;
  const bool offloaded = has_offloaded_sub_groups(g);
  if (policy.reduces_at_step || (gas == 1 && g.grad_shard)) {
    // The shard the step reads (stage 1), or the one micro-batch's (stages 2-3).
    if (policy.reduces_at_step) g.grad_shard = alloc(MemKind::buffer, dtype, S);
    device.copy(g.grad_shard.data(), reduced, bytes, *side);
    if (offloaded) offload_grads(g, g.grad_shard.data(), true, true);
    return;
  }
  const bool first = g.micro_batches == 1, last = g.micro_batches == gas;
  if (g.grad_shard && first) device.cast(reduced, dtype, g.grad_shard.data(), DType::f32, S, *side);
  if (g.grad_shard && !first) device.accumulate(reduced, dtype, static_cast<float*>(g.grad_shard.data()), S, *side);
  if (offloaded) {
    // The tier's copy reads on a stream of its own: give it a buffer that lives until then.
    DeviceBuffer part = alloc(MemKind::buffer, dtype, S);
    device.copy(part.data(), reduced, bytes, *side);
    std::shared_ptr<Event> read = offload_grads(g, part.data(), first, last);
    frees.after(std::move(part), std::move(read));
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
      frees.after(std::move(part), std::move(read));
    } else {
      frees.after_side(std::move(part));
    }
  }
  frees.after_side(std::move(g.grad_full));
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
