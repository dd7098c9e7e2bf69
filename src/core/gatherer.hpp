// Gatherer: stage 3's parameters on demand (DeepSpeed's PartitionedParameterCoordinator,
// FSDP2's unshard / reshard). acquire(module) all-gathers the module's groups just before it
// runs, prefetches the next modules' groups along the order recorded in the previous step
// (ExecutionTrace, up to stage3_prefetch_bucket_size elements), and release(module) frees
// gathered buffers after use unless the group is persistent (below the persistence
// threshold) or reused within stage3_max_reuse_distance elements, always within
// stage3_max_live_parameters. One fetch issues one all-gather for the module's groups not yet
// gathered and one for all it prefetches, each coalesced. With parameter offload the shards
// come from the parameter tier through its pinned read buffers. Stages 0-2 keep the full
// parameters: acquire only orders the compute after the group's last update.
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/core/collectives.hpp"
#include "src/core/engine_context.hpp"
#include "src/core/execution_trace.hpp"
#include "src/core/trace_index.hpp"
#include "src/core/model.hpp"
#include "src/core/offload_tiers.hpp"
#include "src/core/shared_ready.hpp"
#include "src/core/update/updater.hpp"

namespace zoe::core {

class Gatherer {
 public:
  Gatherer(EngineContext& cx, Model& model, Collectives& coll, Updater& updater, OffloadTiers& tiers)
      : cx_(cx), model_(model), coll_(coll), updater_(updater), tiers_(tiers), ready_(cx.device, nullptr) {}

  /// Before module `module`'s forward (or `backward`): its groups gathered (and the next ones
  /// prefetched), the trainer's compute ordered after them. Records the call in the trace.
  void acquire(int module, bool backward);
  /// After the module's forward or backward: frees what is not kept (see the file comment).
  void release(int module);
  /// Frees every gathered (or stale) group no module is using (the shards were written
  /// between steps: a loaded checkpoint, set values).
  void drop_all_gathered();
  /// At the step (every shard changes): persistent groups keep their buffers, stale until their
  /// next gather refreshes them in place (DeepSpeed keeps persistent parameters gathered);
  /// the others are freed. zoe.debug_poison frees them all.
  void shards_updated();
  /// At the step: this step's order becomes the next step's prediction.
  void end_step();

 private:
  /// Sharded -> gathered: allocates param_full and queues its all-gather on the side stream
  /// (after the group's update); no-op when gathered.
  void gather(Group& g);
  /// gather() of several groups with one all-gather (DeepSpeed's all_gather_coalesced): their
  /// shards concatenated, gathered rank-major, then copied into each param_full. With parameter
  /// offload at most ParamShards::read_slots() groups per collective (each holds a read buffer).
  void gather_coalesced(std::vector<int> gis);
  /// Gathered or stale -> sharded: param_full freed after the side stream's work so far.
  void reshard(Group& g);
  /// Gathered -> stale (persistent groups at the step): param_full kept, to be gathered into.
  void mark_stale(Group& g);
  /// Parameter offload: the group's shard on its way in (waits for a free read buffer by
  /// returning finished gathers' buffers).
  std::shared_ptr<offload::ShardRead> begin_shard_read(Group& g);
  /// Gathers the groups the recorded order uses next, within the prefetch bucket and the cap.
  void prefetch();
  bool in_prefetch_window(int group);

  EngineContext& cx_;
  Model& model_;
  Collectives& coll_;
  Updater& updater_;
  OffloadTiers& tiers_;
  ExecutionTrace trace_;           // the order prefetch follows
  TraceIndex index_;               // the previous step's order, indexed (O(1) per call)
  SharedReady ready_;              // one event per coalesced all-gather (its groups' readiness)
  std::vector<char> queued_;       // prefetch(): groups already in this call's bucket
  std::int64_t entries_visited_ = 0;  // prefetch walks' entries this step (test_hooks, at end_step)
  std::int64_t live_elements_ = 0;  // gathered parameter elements in use or prefetched
  std::uint64_t frees_before_last_acquire_ = 0;  // DeferredFrees::mark() at the previous acquire
};

}  // namespace zoe::core
