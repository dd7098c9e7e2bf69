// Stage 3: all-gather a module's parameter groups before it runs, prefetch the next
// modules along the order recorded in the previous step, and free gathered buffers after
// use unless the group is persistent or reused soon (stage3_max_reuse_distance), always
// within stage3_max_live_parameters. As DeepSpeed's PartitionedParameterCoordinator does,
// one fetch issues one all-gather for the module's groups not yet gathered and one for the
// groups it prefetches (up to stage3_prefetch_bucket_size elements), each coalesced. Stages 0-2 keep full parameters and only wait for
// the post-step all-gather.
#include <algorithm>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/common/quote.hpp"
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

void EngineImpl::gather_coalesced(std::vector<int> gis) {
  std::erase_if(gis, [this](int gi) { return groups[static_cast<std::size_t>(gi)].param_state == Group::ParamState::gathered; });
  if (gis.empty()) return;
  if (gis.size() == 1) return gather(groups[static_cast<std::size_t>(gis.front())]);
  if (world == 1) {
    // One rank: an all-gather is a copy, so there is no collective to save, and coalescing
    // would only add its two staging copies per group.
    for (int gi : gis) gather(groups[static_cast<std::size_t>(gi)]);
    return;
  }
  if (param_store && gis.size() > static_cast<std::size_t>(param_store->read_slots())) {
    const auto per = static_cast<std::ptrdiff_t>(param_store->read_slots());
    for (auto it = gis.begin(); it != gis.end();) {
      auto end = gis.end() - it > per ? it + per : gis.end();
      gather_coalesced(std::vector<int>(it, end));
      it = end;
    }
    return;
  }
  const std::size_t esz = dtype_size(dtype);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  std::int64_t padded = 0, T = 0;
  std::vector<std::int64_t> offsets;
  for (int gi : gis) {
    const FlatLayout& L = *groups[static_cast<std::size_t>(gi)].layout;
    offsets.push_back(T);
    T += L.shard_numel();
    padded += L.padded_numel();
  }
  if (live_elements + frees.releasing_elements() + padded > config.zero_optimization.stage3_max_live_parameters) frees.reap(true);
  for (int gi : gis) {
    Group& g = groups[static_cast<std::size_t>(gi)];
    if (!delayed) after_update(g);  // the all-gather reads the shard the last update wrote
    g.param_full = alloc(MemKind::buffer, dtype, g.layout->padded_numel());
    g.param_state = Group::ParamState::gathered;
  }
  DeviceBuffer send = alloc(MemKind::buffer, dtype, T);
  auto reads = std::make_shared<std::vector<std::shared_ptr<offload::ShardRead>>>();
  for (std::size_t k = 0; k < gis.size(); ++k) {
    Group& g = groups[static_cast<std::size_t>(gis[k])];
    const std::size_t bytes = static_cast<std::size_t>(g.layout->shard_numel()) * esz;
    if (param_store) {
      std::shared_ptr<offload::ShardRead> read = begin_shard_read(g);
      device.host_func(*side, [read] { read->wait(); });
      device.copy(at(send.data(), offsets[k]), read->data(), bytes, *side);
      reads->push_back(std::move(read));
    } else {
      device.copy(at(send.data(), offsets[k]), g.param_shard.data(), bytes, *side);
    }
  }
  DeviceBuffer recv = alloc(MemKind::buffer, dtype, T * world);
  all_gather(send.data(), recv.data(), T, dtype, coalesced_tag(gis, CollectiveTag::Kind::params));
  for (std::size_t k = 0; k < gis.size(); ++k) {
    Group& g = groups[static_cast<std::size_t>(gis[k])];
    const std::int64_t S = g.layout->shard_numel();
    for (int r = 0; r < world; ++r)
      device.copy(at(g.param_full.data(), r * S), at(recv.data(), r * T + offsets[k]), static_cast<std::size_t>(S) * esz, *side);
    device.record(*g.param_ready, *side);
  }
  frees.after_side(std::move(send), 0, std::move(reads));
  frees.after_side(std::move(recv));
  live_elements += padded;
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
  gather_coalesced(m.groups);
  for (int gi : m.groups) ++groups[gi].active;
  prefetch();
  for (int gi : m.groups) ready_for_compute(*groups[gi].param_ready);
}

void EngineImpl::prefetch() {
  const auto& zc = config.zero_optimization;
  // The groups of the next modules in the recorded order, up to the prefetch bucket (the
  // last one may pass it, as in DeepSpeed) and never past stage3_max_live_parameters.
  std::int64_t issued = 0;
  std::vector<int> bucket_groups;
  bool at_cap = false;
  for (const TraceEntry& next : trace.upcoming()) {
    if (at_cap || issued >= zc.stage3_prefetch_bucket_size) break;
    for (int gi : modules[next.module].groups) {
      const Group& g = groups[gi];
      if (g.param_state == Group::ParamState::gathered || std::find(bucket_groups.begin(), bucket_groups.end(), gi) != bucket_groups.end()) continue;
      std::int64_t n = g.layout->padded_numel();
      if (live_elements + issued + n > zc.stage3_max_live_parameters) {
        at_cap = true;  // stop here: a later group must not overtake this one
        break;
      }
      bucket_groups.push_back(gi);
      issued += n;
    }
  }
  gather_coalesced(std::move(bucket_groups));
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
  ZOE_CHECK(g.param_state == Group::ParamState::gathered, "reshard of group ", detail::quoted(g.name), ", which is not gathered");
  g.param_state = Group::ParamState::sharded;
  live_elements -= g.layout->padded_numel();
  frees.after_side(std::move(g.param_full), g.layout->padded_numel());
}

}  // namespace zoe::core
