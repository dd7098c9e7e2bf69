// Stage 3: all-gather a module's parameter groups before it runs, prefetch the next
// modules along the order recorded in the previous step, and free gathered buffers after
// use unless the group is persistent or reused soon (stage3_max_reuse_distance), always
// within stage3_max_live_parameters. Stages 0-2 keep full parameters and only wait for
// the post-step all-gather.
#include <algorithm>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

void EngineImpl::gather(Group& g) {
  if (g.param_state == Group::ParamState::gathered) return;  // gathered or in flight
  const FlatLayout& L = *g.layout;
  // Released buffers still in flight count against stage3_max_live_parameters too: past
  // the cap they are returned first, so memory stays within it.
  if (live_elements + frees.releasing_elements() + L.padded_numel() > config.zero_optimization.stage3_max_live_parameters)
    frees.reap(true);
  if (!delayed) after_update(g);  // the all-gather reads the shard the last update wrote
  g.param_full = alloc(MemKind::buffer, dtype, L.padded_numel());
  g.param_state = Group::ParamState::gathered;
  if (param_store) {
    // Parameter offload: NVMe -> pinned buffer -> device -> all-gather, all on the side
    // stream after the group's update (which writes the shard back) is done.
    std::shared_ptr<offload::ShardRead> read = begin_shard_read(g);
    DeviceBuffer staging = alloc(MemKind::buffer, dtype, L.shard_numel());
    device.host_func(*side, [read] { read->wait(); });
    device.copy(staging.data(), read->data(), staging.bytes(), *side);
    all_gather(staging.data(), g.param_full.data(), L.shard_numel(), dtype, params_tag(g));
    device.record(*g.param_ready, *side);
    frees.after_side(std::move(staging), 0, std::move(read));
  } else {
    all_gather(g.param_shard.data(), g.param_full.data(), L.shard_numel(), dtype, params_tag(g));
    device.record(*g.param_ready, *side);
  }
  live_elements += L.padded_numel();
}

void EngineImpl::acquire(int module, bool backward) {
  ModuleInfo& m = modules[module];
  if (!policy.shards_params) {
    for (int gi : m.groups) {
      if (!delayed) after_update(groups[gi]);  // the previous step's update of this group (and its all-gather)
      ready_for_compute(*groups[gi].param_ready);
      ++groups[gi].active;
    }
    return;
  }
  frees.reap(false);
  if (trace.record(TraceEntry{module, backward})) {
    // The order changed: prediction is off; drop what was prefetched for the old order.
    ZOE_LOG_DEBUG("rank {}: execution order changed at entry {}; prefetch off until the next step", rank,
                  trace.position());
    drop_all_gathered();
  }
  for (int gi : m.groups) {
    gather(groups[gi]);
    ++groups[gi].active;
  }
  prefetch();
  for (int gi : m.groups) ready_for_compute(*groups[gi].param_ready);
}

void EngineImpl::prefetch() {
  const auto& zc = config.zero_optimization;
  std::int64_t issued = 0;
  for (const TraceEntry& next : trace.upcoming()) {
    if (issued >= zc.stage3_prefetch_bucket_size) return;
    for (int gi : modules[next.module].groups) {
      Group& g = groups[gi];
      if (g.param_state == Group::ParamState::gathered) continue;
      std::int64_t n = g.layout->padded_numel();
      if (live_elements + n > zc.stage3_max_live_parameters) return;
      gather(g);
      issued += n;
    }
  }
}

bool EngineImpl::in_prefetch_window(int group) const {
  // Reused within stage3_max_reuse_distance elements of execution along the recorded order?
  std::int64_t distance = 0;
  for (const TraceEntry& next : trace.upcoming()) {
    const ModuleInfo& m = modules[next.module];
    if (std::find(m.groups.begin(), m.groups.end(), group) != m.groups.end())
      return distance < config.zero_optimization.stage3_max_reuse_distance;
    for (int gi : m.groups) distance += groups[gi].layout->live_numel();
    if (distance > config.zero_optimization.stage3_max_reuse_distance) return false;
  }
  return false;
}

void EngineImpl::release(int module) {
  ModuleInfo& m = modules[module];
  for (int gi : m.groups) --groups[gi].active;
  if (!policy.shards_params) return;
  bool any_freed = false;
  for (int gi : m.groups) {
    Group& g = groups[gi];
    // zoe.debug_poison frees every released gather, so a stale view of it reads NaN.
    if (g.active > 0 || (g.persistent && !frees.poison()) || g.param_state != Group::ParamState::gathered) continue;
    bool over_cap = live_elements > config.zero_optimization.stage3_max_live_parameters;
    if (!frees.poison() && !over_cap && in_prefetch_window(gi)) continue;
    if (!any_freed) side_waits_for_compute();  // the trainer's reads of the buffer come first
    any_freed = true;
    reshard(g);
  }
}

void EngineImpl::drop_all_gathered() {
  side_waits_for_compute();
  for (Group& g : groups) {
    if (g.param_state != Group::ParamState::gathered || g.active > 0) continue;
    reshard(g);
  }
}

void EngineImpl::reshard(Group& g) {
  ZOE_CHECK(g.param_state == Group::ParamState::gathered, "reshard of group '", g.name, "', which is not gathered");
  g.param_state = Group::ParamState::sharded;
  live_elements -= g.layout->padded_numel();
  frees.after_side(std::move(g.param_full), g.layout->padded_numel());
}

}  // namespace zoe::core
