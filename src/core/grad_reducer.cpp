// The GradReducer's work (see grad_reducer.hpp for the design).
#include <algorithm>

#include "src/common/check.hpp"
#include "src/core/grad_reducer.hpp"

namespace zoe::core {

void GradReducer::prepare(const ModuleInfo& m, int round) {
  // A group of several modules whose round this module already finished: the others ran no
  // backward in it (as a module may skip one); its round ends here, with what they wrote.
  for (int gi : m.groups) {
    const Group& g = model_.group(gi);
    if (g.grad_state == Group::GradState::accumulating && round > g.micro_batches + 1) complete_round(gi);
  }
  // A group still waiting in the bucket is reduced before its buffer takes the next
  // micro-batch's gradients.
  for (int gi : m.groups)
    if (model_.group(gi).grad_state == Group::GradState::queued) {
      flush_bucket();
      break;
    }
  bool filled = false;
  for (int gi : m.groups) {
    Group& g = model_.group(gi);
    // Frozen: no gradient buffer. Accumulating: another user of the group began first.
    if (g.frozen || g.grad_state == Group::GradState::accumulating) continue;
    g.grad_state = Group::GradState::accumulating;
    if (!cx_.policy.shards_grads) continue;  // persistent buffers, zeroed after each step
    if (g.grad_full) {
      // A persistent group's kept buffer: the side stream's reduction of the last round
      // read it, so the trainer's compute (this zero-fill first) waits for that.
      if (!filled) cx_.compute_waits_for_side();
    } else {
      // A fresh buffer (no queued work uses what the allocator hands out).
      g.grad_full = cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->padded_numel());
    }
    // Zeroed where the trainer's compute sees it first: no task for the side stream.
    cx_.device.fill_for_compute(g.grad_full.data(), cx_.dtype, g.layout->padded_numel(), 0.0f);
    filled = true;
  }
  if (filled) {
    // The trainer's backward waits for the side stream's work queued so far (the reductions
    // before it): the side stream never falls more than a module behind, so which released
    // buffers are still held at the device's peak does not depend on its pace (the estimate
    // is that peak). Recording queues nothing; where the side stream has finished, the host
    // device returns at once.
    cx_.compute_waits_for_side();
  }
}

void GradReducer::finish_backward(const ModuleInfo& m) {
  cx_.side_waits_for_compute();
  for (int gi : m.groups) {
    Group& g = model_.group(gi);
    if (g.frozen) continue;  // no gradients: never reduced
    if (--g.pending_users == 0) complete_round(gi);
  }
  if (round_complete()) flush_bucket();
}

void GradReducer::complete_round(int gi) {
  Group& g = model_.group(gi);
  g.pending_users = static_cast<int>(g.users.size());
  ++g.micro_batches;
  reached_round(g);
  if (cx_.policy.shards_grads || g.micro_batches == cx_.config.gradient_accumulation_steps) {
    queue_reduction(gi);
  } else {
    g.grad_state = Group::GradState::idle;  // stages 0-1: the sum waits in grad_full for the last one
  }
}

void GradReducer::complete_partial_rounds() {
  for (std::size_t gi = 0; gi < model_.groups.size(); ++gi) {
    const Group& g = model_.groups[gi];
    if (g.grad_state == Group::GradState::accumulating && g.pending_users < static_cast<int>(g.users.size()))
      complete_round(static_cast<int>(gi));
  }
}

void GradReducer::queue_reduction(int gi) {
  const std::int64_t n = model_.group(gi).layout->padded_numel();
  const std::int64_t cap = cx_.config.zero_optimization.reduce_bucket_size;
  if (!bucket_.groups.empty() && bucket_.elements + n > cap) flush_bucket();  // DeepSpeed's test, before adding
  bucket_.groups.push_back(gi);
  bucket_.elements += n;
  model_.group(gi).grad_state = Group::GradState::queued;
  bucket_round_ = std::max(bucket_round_, model_.group(gi).micro_batches);
  if (bucket_.elements >= cap) flush_bucket();  // full: nothing more can join (same buckets, issued sooner)
}

bool GradReducer::round_complete() const {
  if (bucket_.groups.empty()) return false;
  // Every group taking part has reached the bucket's round (counted as they reach it).
  return bucket_round_ < static_cast<int>(reached_.size()) && reached_[static_cast<std::size_t>(bucket_round_)] == taking_part_;
}

void GradReducer::flush_bucket() {
  if (bucket_.groups.empty()) return;
  std::vector<int> gis = std::move(bucket_.groups);
  bucket_ = GradBucket{};
  bucket_round_ = 0;
  for (int gi : gis) model_.group(gi).grad_state = Group::GradState::reduced;
  if (const double p = cx_.pre_divisor(); p != 1.0)  // prescale_gradients / gradient_predivide_factor
    for (int gi : gis) {
      Group& g = model_.group(gi);
      cx_.device.scale(g.grad_full.data(), cx_.dtype, static_cast<std::size_t>(g.layout->padded_numel()),
                   static_cast<float>(1.0 / p), *cx_.side);
    }
  if (gis.size() == 1) {
    reduce_group(model_.group(gis.front()));
    start_update_if_final(gis.front());
  } else {
    reduce_groups(gis);  // starts each group's update as soon as its shard is absorbed
  }
  if (!cx_.config.zero_optimization.overlap_comm) {
    // DeepSpeed without overlap_comm reduces on the compute stream: the trainer's next work
    // (the rest of backward) starts after the reduction.
    cx_.compute_waits_for_side();
  }
}

void GradReducer::reduce_groups(const std::vector<int>& gis) {
  const std::size_t esz = dtype_size(cx_.dtype);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  const CollectiveTag tag = coll_.coalesced_tag(gis, CollectiveTag::Kind::grads);
  if (!cx_.policy.shards_optimizer) {  // stage 0: all-reduce the concatenation, copy the sums back
    std::int64_t total = 0;
    for (int gi : gis) total += model_.group(gi).layout->padded_numel();
    DeviceBuffer flat = cx_.alloc(MemKind::buffer, cx_.dtype, total);
    std::vector<CopyRegion> in, out;  // one queued copy each way for the whole bucket
    std::int64_t off = 0;
    for (int gi : gis) {
      Group& g = model_.group(gi);
      in.push_back({at(flat.data(), off), g.grad_full.data(), g.grad_full.bytes()});
      out.push_back({g.grad_full.data(), at(flat.data(), off), g.grad_full.bytes()});
      off += g.layout->padded_numel();
    }
    cx_.device.copy_batch(in, CopyPlaces::within_device, *cx_.side);
    coll_.all_reduce(flat.data(), total, cx_.dtype, tag);
    cx_.device.copy_batch(out, CopyPlaces::within_device, *cx_.side);
    cx_.frees.after_side(std::move(flat));
    return;
  }
  // One reduce-scatter for the bucket: each group's reduced shard lands straight in its
  // gradient shard where the step reads it as it is, else in a buffer of the bucket's,
  // absorbed after (accumulated over micro-batches, or handed to the offloaded sub-groups).
  std::vector<void*> direct(gis.size(), nullptr);
  std::int64_t elsewhere = 0;  // the elements reduced into `out`
  for (std::size_t k = 0; k < gis.size(); ++k) {
    direct[k] = shard_receiving_reduction(model_.group(gis[k]));
    if (!direct[k]) elsewhere += model_.group(gis[k]).layout->shard_numel();
  }
  DeviceBuffer out = elsewhere > 0 ? cx_.alloc(MemKind::buffer, cx_.dtype, elsewhere) : DeviceBuffer{};
  std::vector<GroupedPart> parts;
  parts.reserve(gis.size());
  std::int64_t off = 0;
  for (std::size_t k = 0; k < gis.size(); ++k) {
    Group& g = model_.group(gis[k]);
    const std::int64_t S = g.layout->shard_numel();
    void* recv = direct[k];
    if (!recv) {
      recv = at(out.data(), off);
      off += S;
    }
    parts.push_back({g.grad_full.data(), recv, static_cast<std::size_t>(S)});
  }
  coll_.reduce_scatter_grouped(parts, cx_.dtype, tag);
  // Each group's shard goes on before the next one's (update in backward: the tier's recycled
  // gradient buffers then need to hold one group, not a bucket).
  std::vector<DeviceBuffer> reduced_from;  // the gradient buffers the bucket was reduced from: freed together
  for (std::size_t k = 0; k < gis.size(); ++k) {
    Group& g = model_.group(gis[k]);
    if (direct[k]) {
      if (updater_.has_offloaded_sub_groups(g)) updater_.accept_gradient(g, g.grad_shard.data(), true, true);
    } else {
      absorb_shard(g, parts[k].recv);
    }
    if (cx_.policy.shards_grads && !keeps_gradient_buffer(g)) reduced_from.push_back(std::move(g.grad_full));
    start_update_if_final(gis[k]);
  }
  cx_.frees.after_side(std::move(reduced_from));
  if (out) cx_.frees.after_side(std::move(out));
}

void* GradReducer::shard_receiving_reduction(Group& g) {
  // Stage 1's shard of the step (allocated for it), or stages 2-3's one micro-batch.
  if (cx_.policy.reduces_at_step) {
    g.grad_shard = cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->shard_numel());
    return g.grad_shard.data();
  }
  return cx_.config.gradient_accumulation_steps == 1 && g.grad_shard ? g.grad_shard.data() : nullptr;
}

void GradReducer::start_update_if_final(int gi) {
  // zoe.update_in_backward: a group whose gradient of the step's last micro-batch is now in the
  // tier's hands starts its update (Updater::start_in_backward) before the next group of the
  // bucket is absorbed, so the tier's recycled gradient buffers need to hold one group, not a
  // bucket (OptimizerStates::recycle_gradient_slots).
  if (cx_.config.zoe.update_in_backward && model_.group(gi).micro_batches == cx_.config.gradient_accumulation_steps)
    updater_.start_in_backward(gi);
}

void GradReducer::absorb_shard(Group& g, const void* reduced) {
  const std::int64_t S = g.layout->shard_numel();
  const std::size_t bytes = static_cast<std::size_t>(S) * dtype_size(cx_.dtype);
  const int gas = cx_.config.gradient_accumulation_steps;
  const bool offloaded = updater_.has_offloaded_sub_groups(g);
  const bool first = g.micro_batches == 1, last = g.micro_batches == gas;
  if (g.grad_shard && first) cx_.device.cast(reduced, cx_.dtype, g.grad_shard.data(), DType::f32, S, *cx_.side);
  if (g.grad_shard && !first) cx_.device.accumulate(reduced, cx_.dtype, static_cast<float*>(g.grad_shard.data()), S, *cx_.side);
  if (offloaded) {
    // The tier's copy reads on a stream of its own: give it a buffer that lives until then.
    DeviceBuffer part = cx_.alloc(MemKind::buffer, cx_.dtype, S);
    cx_.device.copy(part.data(), reduced, bytes, *cx_.side);
    std::shared_ptr<Event> read = updater_.accept_gradient(g, part.data(), first, last);
    cx_.frees.after(std::move(part), std::move(read));
  }
}

void GradReducer::reduce_group(Group& g) {
  const FlatLayout& L = *g.layout;
  const std::int64_t S = L.shard_numel();
  const int gas = cx_.config.gradient_accumulation_steps;
  const bool offloaded = updater_.has_offloaded_sub_groups(g);
  if (!cx_.policy.shards_optimizer) {
    coll_.all_reduce(g.grad_full.data(), L.padded_numel(), cx_.dtype, coll_.grads_tag(g));
    return;
  }
  if (cx_.policy.reduces_at_step) {  // after the last micro-batch, into a shard the step reads
    g.grad_shard = cx_.alloc(MemKind::buffer, cx_.dtype, S);
    coll_.reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, cx_.dtype, coll_.grads_tag(g));
    if (offloaded) updater_.accept_gradient(g, g.grad_shard.data(), true, true);  // read before the step (drained)
    return;
  }
  // Each micro-batch, as soon as the group's backward ended.
  const bool first = g.micro_batches == 1, last = g.micro_batches == gas;
  if (gas == 1 && g.grad_shard) {
    coll_.reduce_scatter(g.grad_full.data(), g.grad_shard.data(), S, cx_.dtype, coll_.grads_tag(g));
    if (offloaded) updater_.accept_gradient(g, g.grad_shard.data(), true, true);
  } else {
    DeviceBuffer part = cx_.alloc(MemKind::buffer, cx_.dtype, S);
    coll_.reduce_scatter(g.grad_full.data(), part.data(), S, cx_.dtype, coll_.grads_tag(g));
    // Micro-batches add up in fp32 (grad_dtype() is f32 when gas > 1).
    if (g.grad_shard && first) cx_.device.cast(part.data(), cx_.dtype, g.grad_shard.data(), DType::f32, S, *cx_.side);
    if (g.grad_shard && !first) cx_.device.accumulate(part.data(), cx_.dtype, static_cast<float*>(g.grad_shard.data()), S, *cx_.side);
    if (offloaded) {
      std::shared_ptr<Event> read = updater_.accept_gradient(g, part.data(), first, last);
      cx_.frees.after(std::move(part), std::move(read));
    } else {
      cx_.frees.after_side(std::move(part));
    }
  }
  if (!keeps_gradient_buffer(g)) cx_.frees.after_side(std::move(g.grad_full));
}

bool GradReducer::keeps_gradient_buffer(const Group& g) const {
  // zoe.debug_poison frees every gradient buffer, so a view kept past end_backward reads NaN.
  return g.persistent && !cx_.frees.poison();
}

void GradReducer::zero_unused_gradients() {
  Stream& s = *cx_.side;
  for (Group& g : model_.groups) {
    if (g.frozen || g.micro_batches != 0) continue;
    if (cx_.policy.reduces_at_step) g.grad_shard = cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->shard_numel());
    if (cx_.policy.shards_optimizer && g.grad_shard)
      cx_.device.fill(g.grad_shard.data(), cx_.grad_dtype(), g.layout->shard_numel(), 0.0f, s);
    if (updater_.has_offloaded_sub_groups(g)) updater_.zero_offloaded_gradients(g);
  }
}

void GradReducer::reached_round(const Group& g) {
  if (taking_part_ < 0) {
    // Frozen groups have no gradients (micro_batches stays 0): they take no part in a round;
    // neither does a group no module uses (the empty trainable group of a module whose
    // parameters are all frozen or owned by another module).
    taking_part_ = static_cast<int>(std::count_if(model_.groups.begin(), model_.groups.end(),
                                                  [](const Group& x) { return !x.frozen && !x.users.empty(); }));
  }
  const auto r = static_cast<std::size_t>(g.micro_batches);
  if (reached_.size() <= r) reached_.resize(r + 1, 0);
  ++reached_[r];  // rounds are reached one at a time: reaching r means >= r from now on
}

void GradReducer::reset_for_next_step(bool skipped) {
  std::fill(reached_.begin(), reached_.end(), 0);
  // The update, if running, owns the gradients it reads until it is done.
  for (Group& g : model_.groups) {
    if (g.frozen) continue;
    if (skipped && !cx_.policy.shards_grads)
      cx_.device.fill(g.grad_full.data(), cx_.dtype, g.layout->padded_numel(), 0.0f, *cx_.side);
    if (skipped && cx_.policy.reduces_at_step) cx_.frees.after_side(std::move(g.grad_shard));
    g.micro_batches = 0;
    g.pending_users = static_cast<int>(g.users.size());
    g.grad_state = Group::GradState::idle;
  }
}

}  // namespace zoe::core
