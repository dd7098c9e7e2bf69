// The Gatherer's transitions (see gatherer.hpp): gather / gather_coalesced (sharded ->
// gathered), reshard (gathered -> sharded), acquire / release around each module, prefetch
// along the recorded order, and the parameter tier's reads.
#include <algorithm>
#include <utility>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/common/log.hpp"
#include "src/core/gatherer.hpp"
#include "src/core/test_hooks.hpp"

namespace zoe::core {

void Gatherer::gather(Group& g) {
  if (g.param_state == Group::ParamState::gathered) return;  // gathered or in flight
  const FlatLayout& L = *g.layout;
  const bool stale = g.param_state == Group::ParamState::stale;  // its buffer is kept: gathered in place
  // Released buffers still in flight count against stage3_max_live_parameters too: past
  // the cap they are returned first, so memory stays within it.
  if (!stale && live_elements_ + cx_.frees.releasing_elements() + L.padded_numel() > cx_.config.zero_optimization.stage3_max_live_parameters)
    cx_.frees.reap(true);
  // The all-gather reads the shard the last update wrote; it records param_ready itself.
  if (!cx_.config.zoe.delayed_update) updater_.settle_update(g);
  if (!stale) g.param_full = cx_.alloc(MemKind::buffer, cx_.dtype, L.padded_numel());
  g.param_state = Group::ParamState::gathered;
  ready_.forget(model_.index_of(g));  // its own param_ready, recorded below, decides
  if (tiers_.params) {
    // Parameter offload: NVMe -> pinned buffer -> device -> all-gather, all on the side
    // stream after the group's update (which writes the shard back) is done.
    std::shared_ptr<offload::ShardRead> read = begin_shard_read(g);
    updater_.keep_shard_read(model_.index_of(g), read);
    DeviceBuffer staging = cx_.alloc(MemKind::buffer, cx_.dtype, L.shard_numel());
    cx_.device.host_func(*cx_.side, [read] { read->wait(); });
    cx_.device.copy(staging.data(), read->data(), staging.bytes(), *cx_.side);
    coll_.all_gather(staging.data(), g.param_full.data(), L.shard_numel(), cx_.dtype, coll_.params_tag(g));
    cx_.device.record(*g.param_ready, *cx_.side);
    cx_.frees.after_side(std::move(staging), 0, std::move(read));
  } else {
    coll_.all_gather(g.param_shard.data(), g.param_full.data(), L.shard_numel(), cx_.dtype, coll_.params_tag(g));
    cx_.device.record(*g.param_ready, *cx_.side);
  }
  if (!stale) live_elements_ += L.padded_numel();
}

void Gatherer::gather_coalesced(std::vector<int> gis) {
  std::erase_if(gis, [this](int gi) { return model_.group(gi).param_state == Group::ParamState::gathered; });
  if (gis.empty()) return;
  if (gis.size() == 1) return gather(model_.group(gis.front()));
  if (cx_.world == 1 && (tiers_.params || !cx_.comm.gathers_parts_in_place())) {
    // One rank: an all-gather is a copy. Grouped in place, the copies are one collective
    // instead of one per group; packed, coalescing would only add two staging copies per group,
    // and with a parameter tier it would hold every group's staged shard until the last is
    // copied (address-space caps: one at a time).
    for (int gi : gis) gather(model_.group(gi));
    return;
  }
  if (tiers_.params && gis.size() > static_cast<std::size_t>(tiers_.params->read_slots())) {
    const auto per = static_cast<std::ptrdiff_t>(tiers_.params->read_slots());
    for (auto it = gis.begin(); it != gis.end();) {
      auto end = gis.end() - it > per ? it + per : gis.end();
      gather_coalesced(std::vector<int>(it, end));
      it = end;
    }
    return;
  }
  std::int64_t padded = 0, T = 0;  // padded: the elements of the buffers this gather allocates
  for (int gi : gis) {
    const Group& g = model_.group(gi);
    T += g.layout->shard_numel();
    if (g.param_state != Group::ParamState::stale) padded += g.layout->padded_numel();
  }
  if (live_elements_ + cx_.frees.releasing_elements() + padded > cx_.config.zero_optimization.stage3_max_live_parameters) cx_.frees.reap(true);
  for (int gi : gis) {
    Group& g = model_.group(gi);
    if (!cx_.config.zoe.delayed_update) updater_.settle_update(g);  // the all-gather reads it, then records param_ready
    if (g.param_state != Group::ParamState::stale) g.param_full = cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->padded_numel());
    g.param_state = Group::ParamState::gathered;
  }
  // Parameter offload: the shards, read from the tier, are staged side by side on the device
  // (one buffer, so a communicator that packs the parts finds them packed already).
  DeviceBuffer staging;
  auto reads = std::make_shared<std::vector<std::shared_ptr<offload::ShardRead>>>();
  if (tiers_.params) staging = cx_.alloc(MemKind::buffer, cx_.dtype, T);
  const std::size_t esz = dtype_size(cx_.dtype);
  std::vector<GroupedPart> parts;
  parts.reserve(gis.size());
  std::int64_t offset = 0;
  for (int gi : gis) {
    Group& g = model_.group(gi);
    const std::int64_t S = g.layout->shard_numel();
    const void* send = g.param_shard.data();
    if (tiers_.params) {
      void* staged = static_cast<char*>(staging.data()) + offset * static_cast<std::int64_t>(esz);
      std::shared_ptr<offload::ShardRead> read = begin_shard_read(g);
      updater_.keep_shard_read(gi, read);
      cx_.device.host_func(*cx_.side, [read] { read->wait(); });
      cx_.device.copy(staged, read->data(), static_cast<std::size_t>(S) * esz, *cx_.side);
      reads->push_back(std::move(read));
      send = staged;
    }
    parts.push_back({send, g.param_full.data(), static_cast<std::size_t>(S)});
    offset += S;
  }
  coll_.all_gather_grouped(parts, cx_.dtype, coll_.coalesced_tag(gis, CollectiveTag::Kind::params));
  ready_.record(gis, *cx_.side);  // one point for them all
  if (tiers_.params) cx_.frees.after_side(std::move(staging), 0, std::move(reads));
  live_elements_ += padded;
}

void Gatherer::acquire(int module, bool backward) {
  ModuleInfo& m = model_.modules[static_cast<std::size_t>(module)];
  if (!cx_.policy.shards_params) {
    for (int gi : m.groups) {
      if (!cx_.config.zoe.delayed_update) updater_.after_update(model_.group(gi));  // the previous step's update of this group (and its all-gather)
      cx_.ready_for_compute(*model_.group(gi).param_ready);
      ++model_.group(gi).active;
    }
    return;
  }
  // The rate limit (FSDP's limit_all_gathers): what was released before the previous module
  // began is returned before this one gathers, waiting for the side stream if it fell behind.
  // So the device holds the released buffers of one module at most, whatever the side
  // stream's pace. Nothing newer is returned even if the side stream has passed it: the
  // allocated peak is then the same on a quiet or a loaded machine (zoe-estimate's figure).
  cx_.frees.reap_before(frees_before_last_acquire_);
  frees_before_last_acquire_ = cx_.frees.mark();
  if (trace_.record(TraceEntry{module, backward})) {
    // The order changed: prediction is off; drop what was prefetched for the old order.
    ZOE_LOG_DEBUG("rank {}: execution order changed at entry {}; prefetch off until the next step", cx_.rank,
                  trace_.position());
    drop_all_gathered();
    index_.clear();
  }
  // (The usual case, every group already gathered or prefetched, copies no vector.)
  if (std::any_of(m.groups.begin(), m.groups.end(), [this](int gi) { return model_.group(gi).param_state != Group::ParamState::gathered; }))
    gather_coalesced(m.groups);
  for (int gi : m.groups) ++model_.group(gi).active;
  prefetch();
  for (int gi : m.groups) ready_.wait(gi, *model_.group(gi).param_ready);
}

void Gatherer::prefetch() {
  const auto& zc = cx_.config.zero_optimization;
  // The groups of the next modules in the recorded order, up to the prefetch bucket (the
  // last one may pass it, as in DeepSpeed) and never past stage3_max_live_parameters.
  // The walk resumes where the last one stopped (TraceIndex): the entries before that have
  // every group gathered or issued, so each entry is visited O(1) times per step.
  std::int64_t issued = 0;
  std::vector<int> bucket_groups;
  bool at_cap = false;
  const std::span<const TraceEntry> upcoming = trace_.upcoming();
  const std::size_t pos = trace_.position();
  std::size_t e = index_.cursor(pos) - pos;
  const std::size_t walk_start = e;
  queued_.resize(model_.groups.size(), 0);
  for (; e < upcoming.size(); ++e) {
    if (at_cap || issued >= zc.stage3_prefetch_bucket_size) break;
    for (int gi : model_.modules[static_cast<std::size_t>(upcoming[e].module)].groups) {
      const Group& g = model_.group(gi);
      if (g.param_state == Group::ParamState::gathered || queued_[static_cast<std::size_t>(gi)]) continue;
      // A stale group's buffer is already counted live: it adds no memory.
      const std::int64_t n = g.param_state == Group::ParamState::stale ? 0 : g.layout->padded_numel();
      if (live_elements_ + issued + n > zc.stage3_max_live_parameters) {
        at_cap = true;  // stop here: a later group must not overtake this one
        break;
      }
      bucket_groups.push_back(gi);
      queued_[static_cast<std::size_t>(gi)] = 1;
      issued += n;
    }
    if (at_cap) break;  // entry e is not complete: the next walk starts there
  }
  if (!upcoming.empty()) index_.advance_cursor(pos + e);
  entries_visited_ += static_cast<std::int64_t>(e - walk_start);
  for (int gi : bucket_groups) queued_[static_cast<std::size_t>(gi)] = 0;
  gather_coalesced(std::move(bucket_groups));
}

bool Gatherer::in_prefetch_window(int group) {
  // Reused within stage3_max_reuse_distance elements of execution along the recorded order:
  // the elements of the entries between now and the group's next use (prefix sums).
  if (trace_.upcoming().empty()) return false;
  const std::size_t pos = trace_.position();
  const std::size_t next = index_.next_use(group, pos);
  if (next == TraceIndex::npos) return false;
  return index_.elements_between(pos, next) < cx_.config.zero_optimization.stage3_max_reuse_distance;
}

void Gatherer::release(int module) {
  ModuleInfo& m = model_.modules[static_cast<std::size_t>(module)];
  for (int gi : m.groups) --model_.group(gi).active;
  if (!cx_.policy.shards_params) return;
  bool any_freed = false;
  for (int gi : m.groups) {
    Group& g = model_.group(gi);
    // zoe.debug_poison frees every released gather, so a stale view of it reads NaN.
    if (g.active > 0 || (g.persistent && !cx_.frees.poison()) || g.param_state != Group::ParamState::gathered) continue;
    bool over_cap = live_elements_ > cx_.config.zero_optimization.stage3_max_live_parameters;
    if (!cx_.frees.poison() && !over_cap && in_prefetch_window(gi)) continue;
    if (!any_freed) cx_.side_waits_for_compute();  // the trainer's reads of the buffer come first
    any_freed = true;
    reshard(g);
  }
}

void Gatherer::drop_all_gathered() {
  cx_.side_waits_for_compute();
  for (Group& g : model_.groups) {
    if (g.param_state == Group::ParamState::sharded || g.active > 0) continue;
    reshard(g);
  }
}

void Gatherer::shards_updated() {
  // The side stream's next all-gather into a kept buffer comes after the trainer's reads of it.
  cx_.side_waits_for_compute();
  for (Group& g : model_.groups) {
    if (g.param_state != Group::ParamState::gathered) continue;  // (no module is active at the step)
    if (g.persistent && !cx_.frees.poison()) {
      mark_stale(g);
    } else {
      reshard(g);
    }
  }
}

void Gatherer::mark_stale(Group& g) {
  ZOE_CHECK(g.param_state == Group::ParamState::gathered && g.persistent, "mark_stale of group ", detail::quoted(g.name),
            ", which is not a gathered persistent group");
  g.param_state = Group::ParamState::stale;
  if (!trace_.upcoming().empty()) index_.resharded(model_.index_of(g), trace_.position());  // prefetch must visit its next use again
}

void Gatherer::reshard(Group& g) {
  ZOE_CHECK(g.param_state != Group::ParamState::sharded, "reshard of group ", detail::quoted(g.name), ", which is not gathered");
  g.param_state = Group::ParamState::sharded;
  if (!trace_.upcoming().empty()) index_.resharded(model_.index_of(g), trace_.position());  // prefetch must visit its next use again
  live_elements_ -= g.layout->padded_numel();
  cx_.frees.after_side(std::move(g.param_full), g.layout->padded_numel());
}

std::shared_ptr<offload::ShardRead> Gatherer::begin_shard_read(Group& g) {
  // Read ahead now if the shard is final (its update is done); else the side stream issues
  // the read when it reaches it, after the update.
  const bool final_now = cx_.device.query(*g.update_done) && (!g.host_done || g.host_done->ready());
  for (;;) {
    if (auto read = tiers_.params->try_begin_read(g.param_id, final_now)) return *read;
    // Every read buffer is taken: by a gather still on the side stream (wait for the oldest),
    // else by reads kept for updates (Updater::free_kept_read).
    if (cx_.frees.reap_oldest()) continue;
    ZOE_CHECK(updater_.free_kept_read(), "parameter offload: no pinned read buffer free and none in flight");
  }
}

void Gatherer::end_step() {
  // Published once a step: an atomic add per acquire, on a line every rank's thread shares,
  // cost more than the walk it counts.
  test_hooks::prefetch_entries_visited.fetch_add(std::exchange(entries_visited_, 0), std::memory_order_relaxed);
  trace_.end_step();
  index_.build(trace_.upcoming(), model_);
}

}  // namespace zoe::core
