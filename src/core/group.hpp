// The engine's units of state: a parameter, the group (flat buffer) that owns it with the
// group's sub-groups, and a module (what the trainer calls begin_/end_forward on). A group's
// three state machines, ParamState (sharded / gathered / stale), GradState (idle / accumulating /
// queued / reduced) and UpdateState (settled / pending), are changed only by their named
// transitions (gather / reshard / mark_stale in gatherer.cpp; prepare / finish_backward / flush_bucket /
// reset_for_next_step in grad_reducer.cpp; start_update / after_update in update/updater.cpp).
// Not thread-safe: owned by Model, driven by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/core/device_buffer.hpp"
#include "src/core/flat_layout.hpp"
#include "src/core/update/update_pipeline.hpp"
#include "src/device/device.hpp"
#include "zoe/engine.hpp"

namespace zoe::core {

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  ParamInitializer init;       // the initial value's source; released after finalize
  int group = -1;              // owning group
  std::size_t slot = 0;        // index inside the owning group's layout
  ParamOptions options;        // weight_decay resolved against the config at registration
  std::string param_group;     // the add_param_group that set `options` ("" = registration's)
};

/// A sub-group: up to sub_group_size elements of a rank's optimizer range whose step runs as
/// one unit, either on the device optimizer (Device::adam_step; fp32 states in
/// `device_states`) or on the CPU optimizer (states in the offload tier, id `offload_id`).
/// offload_optimizer.ratio chooses how many sub-groups are offloaded (the last ones).
struct SubGroup {
  std::int64_t begin = 0, numel = 0;  // elements, within the group's optimizer range
  int offload_id = -1;                // OptimizerStates id; -1 = device optimizer
  DeviceBuffer device_states;         // device: [master | exp_avg | exp_avg_sq], 3 * numel floats
  /// Runs of equal per-parameter options covering [0, numel) (begin relative to the sub-group),
  /// in order: both optimizers step each run with its own weight decay and lr factor.
  std::vector<OptimRun> runs;
  bool offloaded() const { return offload_id >= 0; }
  float* master() const { return static_cast<float*>(device_states.data()); }
};

/// The parameters one module owns (the first module that lists them), or a run of small
/// modules shares (zoe.small_module_threshold, Model::build_groups), as one flat buffer.
struct Group {
  // (Field order: what the per-module calls read and change first, then the layout, then
  // what registration and the step read. A pass over thousands of small groups reads each
  // group's lines once, and they do not stay in cache between passes: the fewer lines a call
  // touches, the flatter the cost per module.)
  bool persistent = false;  // stage 3: stays gathered (below the persistence threshold)
  /// The module's frozen parameters (ParamOptions::frozen) form a group of their own: compute-
  /// dtype parameters only (no gradient buffers, no sub-groups, opt_numel 0), never reduced
  /// or updated. Every other group holds trainable parameters only.
  bool frozen = false;
  // Gradients (compute dtype). Stages 0-1: grad_full persistent, the trainer accumulates
  // into it over micro-batches. Stages 2-3: grad_full per micro-batch (kept between them by a
  // persistent group, GradReducer::keeps_gradient_buffer), grad_shard keeps the
  // reduced own shard accumulated over micro-batches (EngineContext::grad_dtype(); only when some sub-group
  // is on the device optimizer: offloaded sub-groups keep fp32 gradients in the offload
  // tier). Stage 1: grad_shard holds the reduce-scatter output between the last backward and
  // the step.
  DeviceBuffer grad_full, grad_shard;
  int pending_users = 0;   // users still to finish backward in this micro-batch
  int micro_batches = 0;   // micro-batches whose backward every user finished this step
  // The gradient's lifecycle in a round (a micro-batch; stages 0-1 reduce after the last one),
  // changed only by GradReducer (grad_reducer.cpp):
  //   idle          no backward of this round began. Stages 2-3: no grad_full (a persistent
  //                 group's kept one holds the last round's values, unread); stages 0-1:
  //                 grad_full holds the earlier micro-batches' sum (zero at a step's start).
  //   accumulating  a user's backward began (prepare): the trainer writes into grad_full.
  //   queued        every user finished (finish_backward), or the round ended without some
  //                 (complete_round: one of them began the next round, or step()): waiting in
  //                 the bucket.
  //   reduced       its reduction is on the side stream (flush_bucket): the result goes into
  //                 grad_shard and the offloaded sub-groups' gradients (the tier); stages 2-3
  //                 released grad_full (persistent groups keep it). The next micro-batch's
  //                 prepare makes it accumulating.
  // Frozen groups stay idle. reset_for_next_step: every group -> idle.
  enum class GradState { idle, accumulating, queued, reduced } grad_state = GradState::idle;
  // Compute-dtype parameters. Stages 0-2: param_full is the persistent full copy.
  // Stage 3: param_shard is persistent, param_full exists while gathered; with parameter
  // offload the shard lives in the parameter tier (OffloadTiers::params, id param_id), not on the device.
  DeviceBuffer param_full, param_shard;
  // FSDP2's sharded / unsharded: whether param_full exists (its all-gather queued; valid once
  // param_ready completes). Stage 3 moves it with three transitions: gather() (sharded or
  // stale -> gathered), reshard() (gathered or stale -> sharded) and, at the step,
  // mark_stale() (gathered -> stale) for a persistent group: its buffer stays allocated (as DeepSpeed keeps
  // persistent parameters), holding the previous step's values until the next gather
  // all-gathers the updated shards into it in place. Stages 0-2 are gathered from build on.
  enum class ParamState { sharded, gathered, stale } param_state = ParamState::sharded;
  int param_id = -1;
  std::unique_ptr<Event> param_ready;  // param_full is valid once this completes
  int active = 0;                      // modules between begin_* and end_* using it
  std::optional<FlatLayout> layout;
  // Optimizer states for this rank's range [opt_begin, opt_begin + opt_numel) of the flat
  // buffer, in sub-groups of sub_group_size elements (see SubGroup).
  std::int64_t opt_begin = 0, opt_numel = 0;
  std::vector<SubGroup> subgroups;

  // The update lifecycle (see update/updater.cpp). start_update: settled -> pending;
  // after_update: pending -> settled (the side stream is ordered after the update and, stages
  // 1-2 / delayed update, the new parameters waiting in `updated` are applied).
  enum class UpdateState { settled, pending } update_state = UpdateState::settled;
  // The step number (1-based) whose update the group started last: zoe.update_in_backward
  // starts a group's update in backward, and step() starts only the groups still behind.
  std::int64_t update_step = 0;
  // Stages 1-2: the updated own shard waits in `updated` until it is all-gathered into
  // param_full (lazily, before the group's next use, in module order on every rank).
  // Delayed update, every stage: the new parameters wait there until the next step().
  DeviceBuffer updated;
  /// Recorded on the update stream after the device sub-groups' update (the device part).
  std::unique_ptr<Event> update_done;
  /// The host part (CPU optimizer) of the last update: set once its new parameters are on
  /// the device (or in the parameter tier). Null when the group has no host part.
  std::shared_ptr<GroupDone> host_done;

  // Registration's: the group's name, its parameters and the modules that use them.
  std::string name;
  std::vector<std::uint32_t> params;
  std::vector<int> users;  // modules whose params live here
};


/// A module as registered: its parameters and the groups they live in. Its phase and its
/// backward passes this step are CallRules' (call_rules.hpp), kept there only.
struct ModuleInfo {
  std::string name;
  std::vector<std::uint32_t> params;
  std::vector<int> groups;  // distinct groups of its params, ascending
};

/// DeepSpeed's IPG bucket (independent partition gradients): groups whose gradients of this
/// round (stages 2-3: a micro-batch; stages 0-1: the step's last one) are complete, waiting to
/// be reduced together by one collective (GradReducer). A group joins when its last user ends its backward;
/// the bucket is reduced before a group that would take it past reduce_bucket_size elements
/// joins (a group larger than that is a bucket of its own), once it is full, when the round is
/// complete (every group reduced), before a module of the bucket starts its next backward, and
/// at step(). Elements are the groups' padded flat sizes, what the collective carries.
struct GradBucket {
  std::vector<int> groups;  // in the order their backward completed (the same on every rank)
  std::int64_t elements = 0;
  bool holds(int group) const { return std::find(groups.begin(), groups.end(), group) != groups.end(); }
};

}  // namespace zoe::core
