// EngineImpl (Engine::Impl): the state of one rank's ZeRO engine and the pieces of its work, split
// over files by idea: engine.cpp (registration, partitioning, public API), gather.cpp
// (stage-3 all-gather, prefetch, release), gradients.cpp (gradient buffers and their
// reduction), step.cpp (norm, overflow, clipping, the optimizer over sub-groups).
// Not thread-safe: one thread drives an Engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/core/call_rules.hpp"
#include "src/core/device_buffer.hpp"
#include "src/core/flat_layout.hpp"
#include "src/core/loss_scaler.hpp"
#include "src/core/gradient_sink.hpp"
#include "src/core/memory_ledger.hpp"
#include "src/core/update_pipeline.hpp"
#include "src/device/device.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/offload/param_shards.hpp"
#include "src/optim/cpu_adam.hpp"
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

/// The parameters one module owns (the first module that lists them), as one flat buffer.
struct Group {
  std::string name;
  std::vector<std::uint32_t> params;
  std::optional<FlatLayout> layout;
  std::vector<int> users;  // modules whose params live here
  bool persistent = false;  // stage 3: stays gathered (below the persistence threshold)
  /// The module's frozen parameters (ParamOptions::frozen) form a group of their own: compute-
  /// dtype parameters only (no gradient buffers, no sub-groups, opt_numel 0), never reduced
  /// or updated. Every other group holds trainable parameters only.
  bool frozen = false;

  // Compute-dtype parameters. Stages 0-2: param_full is the persistent full copy.
  // Stage 3: param_shard is persistent, param_full exists while gathered; with parameter
  // offload the shard lives in EngineImpl::param_store (id param_id), not on the device.
  DeviceBuffer param_full, param_shard;
  // FSDP2's sharded / unsharded: whether param_full exists (its all-gather queued; valid once
  // param_ready completes). Stage 3 moves it with the only two transitions, gather() (sharded
  // -> gathered) and reshard() (gathered -> sharded); stages 0-2 are gathered from build on.
  enum class ParamState { sharded, gathered } param_state = ParamState::sharded;
  int param_id = -1;
  std::unique_ptr<Event> param_ready;  // param_full is valid once this completes
  int active = 0;                      // modules between begin_* and end_* using it

  // Gradients (compute dtype). Stages 0-1: grad_full persistent, the trainer accumulates
  // into it over micro-batches. Stages 2-3: grad_full per micro-batch, grad_shard keeps the
  // reduced own shard accumulated over micro-batches (grad_dtype(); only when some sub-group
  // is on the device optimizer: offloaded sub-groups keep fp32 gradients in the offload
  // tier). Stage 1: grad_shard holds the reduce-scatter output between the last backward and
  // the step.
  DeviceBuffer grad_full, grad_shard;
  int pending_users = 0;   // users still to finish backward in this micro-batch
  int micro_batches = 0;   // micro-batches whose gradients were reduced into grad_shard/full

  // Optimizer states for this rank's range [opt_begin, opt_begin + opt_numel) of the flat
  // buffer, in sub-groups of sub_group_size elements (see SubGroup).
  std::int64_t opt_begin = 0, opt_numel = 0;
  std::vector<SubGroup> subgroups;

  // The update lifecycle (see async_update.cpp). start_update: settled -> pending;
  // after_update: pending -> settled (the side stream is ordered after the update and, stages
  // 1-2 / delayed update, the new parameters waiting in `updated` are applied).
  enum class UpdateState { settled, pending } update_state = UpdateState::settled;
  // Stages 1-2: the updated own shard waits in `updated` until it is all-gathered into
  // param_full (lazily, before the group's next use, in module order on every rank).
  // Delayed update, every stage: the new parameters wait there until the next step().
  DeviceBuffer updated;
  /// Recorded on the update stream after the device sub-groups' update (the device part).
  std::unique_ptr<Event> update_done;
  /// The host part (CPU optimizer) of the last update: set once its new parameters are on
  /// the device (or in the parameter tier). Null when the group has no host part.
  std::shared_ptr<GroupDone> host_done;
};


/// What the ZeRO stage decides, computed once from zero_optimization.stage: the engine tests
/// these named decisions, never the stage number.
struct StagePolicy {
  explicit StagePolicy(int stage)
      : shards_optimizer(stage >= 1), shards_grads(stage >= 2), shards_params(stage == 3),
        gathers_updates(stage == 1 || stage == 2), reduces_at_step(stage == 1) {}
  /// Stages 1-3: each rank's optimizer range is its shard (stage 0: the whole buffer; the norm
  /// then forms every rank's partial itself and the gradient is all-reduced).
  bool shards_optimizer;
  /// Stages 2-3: a group's gradient is reduce-scattered as soon as its backward ends, each
  /// micro-batch, into a persistent shard; grad_full lives one micro-batch. Otherwise grad_full
  /// is persistent and the trainer accumulates into it.
  bool shards_grads;
  /// Stage 3: the compute-dtype parameters are sharded and gathered per module.
  bool shards_params;
  /// Stages 1-2: the updated shard waits aside and is all-gathered into the full copy.
  bool gathers_updates;
  /// Stage 1: the gradient is reduce-scattered after the last micro-batch into a shard that
  /// lives until the step's update has read it.
  bool reduces_at_step;
};

struct ModuleInfo {
  std::string name;
  std::vector<std::uint32_t> params;
  std::vector<int> groups;  // distinct groups of its params, ascending
  enum class Phase { idle, forward, backward } phase = Phase::idle;
  int backward_count = 0;  // since the last step
};

/// One entry of the recorded execution order (stage-3 prefetch follows it).
struct TraceEntry {
  int module;
  bool backward;
  bool operator==(const TraceEntry&) const = default;
};

struct PendingFree {
  DeviceBuffer buffer;
  std::shared_ptr<Event> after;
  std::int64_t gathered_elements = 0;  // a released stage-3 gather buffer's elements
  std::shared_ptr<void> hold;          // released with the buffer (e.g. a pinned read buffer)
};

struct EngineImpl {
  EngineImpl(const Config& config, RankContext rank);
  ~EngineImpl();

  Config config;
  RankContext ctx;
  Device& device;
  Communicator& comm;
  int rank, world;
  int stage;           // zero_optimization.stage (checkpoint header); decisions use `policy`
  StagePolicy policy;
  DType dtype;  // compute dtype
  std::unique_ptr<Stream> side;  // collectives, reductions, optimizer copies (in order)
  MemoryLedger ledger;
  LossScaler scaler;
  std::unique_ptr<optim::CpuAdam> adam;
  std::unique_ptr<offload::OptimizerStates> states;  // optimizer offload (cpu / nvme)
  std::unique_ptr<Stream> update_stream;             // the optimizer update, group by group
  std::unique_ptr<offload::ParamShards> param_store;  // parameter offload (stage 3: cpu / nvme)
  // With optimizer offload (built by finalize): the CPU optimizer's pipeline and the
  // gradients' way into the offload tier. Declared after what they use: destroyed first.
  std::unique_ptr<UpdatePipeline> pipeline;
  std::unique_ptr<GradientSink> grad_sink;
  double lr;
  std::int64_t step_count = 0;
  bool delayed = false;  // zoe.delayed_update: forward/backward do not wait for the last update
  CallRules rules{config.gradient_accumulation_steps};  // call order; collective identity (call_rules.hpp)
  bool poison = false;  // zoe.debug_poison: freed buffers are filled with NaN (free_after_side)

  std::vector<ParamInfo> params;
  std::unordered_map<std::string, std::uint32_t> param_by_name;  // every registered name
  std::vector<std::string> param_groups;                          // add_param_group names, in order
  std::vector<ModuleInfo> modules;
  std::vector<Group> groups;
  bool finalized = false;
  std::string finalize_error;  // why a finalize failed (the engine is unusable then)

  // Stage-3 gathering.
  std::vector<TraceEntry> trace, last_trace;
  std::size_t trace_pos = 0;    // position in last_trace of the current call
  bool trace_valid = false;     // this step follows last_trace so far
  std::int64_t live_elements = 0;       // gathered parameter elements in use or prefetched
  std::int64_t releasing_elements = 0;  // released gather buffers not yet returned
  std::deque<PendingFree> pending_frees;

  // Traffic of the current / last step.
  CommStats step_start_stats;
  TrafficReport last_traffic;
  std::int64_t elements_sent = 0, elements_at_step_start = 0;

  // engine.cpp
  /// Builds the groups, places every state and writes the initial values (at the first call
  /// that needs them). A failure is kept: later calls throw UsageError naming it.
  void finalize();
  void build();
  /// With optimizer or parameter offload: the update pipeline and the gradient sink, with
  /// pinned staging of the largest offloaded sub-group (after the tiers' finalize).
  void build_update_paths();
  void check_module(ModuleId m) const;
  ModuleTensors views(const ModuleInfo& m, bool with_grads);
  /// Makes work queued on `side` before now visible to the trainer's compute.
  void ready_for_compute(Event& event);
  /// Makes the trainer's work so far visible to `side`.
  void side_waits_for_compute();
  /// Frees `buffer` once the side stream has reached this point (with zoe.debug_poison it is
  /// first filled with NaN there).
  void free_after_side(DeviceBuffer buffer, std::int64_t gathered_elements = 0, std::shared_ptr<void> hold = {});
  /// Frees `buffer` once `after` has completed.
  void free_after(DeviceBuffer buffer, std::shared_ptr<Event> after);
  /// zoe.debug_poison: makes the NaN of the buffers freed so far visible to the trainer's
  /// compute (end_forward / end_backward), so a stale view reads NaN from then on.
  void show_poison();
  void reap_frees(bool wait_all);
  DeviceBuffer alloc(MemKind kind, DType dt, std::int64_t numel);

  // counted collectives (elements as nccl-tests counts bus traffic), tagged with what they are
  // for (group_tag in call_rules.hpp) and noted in the step's fingerprint
  void all_gather(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  void all_reduce(void* buf, std::int64_t count, DType dt, CollectiveTag tag);
  // call_rules.cpp: the tags of collectives about group g's parameters / gradients now
  CollectiveTag params_tag(const Group& g) const;
  CollectiveTag grads_tag(const Group& g) const;

  // gather.cpp
  void acquire(int module, bool backward);
  void release(int module);
  /// Stage 3, sharded -> gathered: allocates param_full and queues its all-gather on the side
  /// stream (after the group's update); no-op when gathered.
  void gather(Group& g);
  /// Stage 3, gathered -> sharded: param_full is freed after the side stream's work so far
  /// (the caller has ordered the trainer's reads before it: side_waits_for_compute).
  void reshard(Group& g);
  /// Parameter offload: the group's shard on its way in (waits for a free read buffer by
  /// returning finished gathers' buffers).
  std::shared_ptr<offload::ShardRead> begin_shard_read(Group& g);
  void prefetch_after(std::size_t pos);
  bool in_prefetch_window(int group) const;
  void drop_all_gathered();

  // gradients.cpp
  void prepare_grads(ModuleInfo& m);
  void finish_backward(ModuleInfo& m);
  void reduce_group(Group& g);
  /// Adds the group's reduced shard (compute dtype, device memory; reduced on the side stream)
  /// to the fp32 gradients of its offloaded sub-groups through the GradientSink (after the
  /// group's previous update). Returns the event after which `shard` is no longer read.
  std::shared_ptr<Event> offload_grads(Group& g, const void* shard, bool first, bool last);
  /// Sets the offloaded sub-groups' gradients to zero (no backward reached the group).
  void zero_offloaded_grads(Group& g);
  /// The dtype of grad_of(): fp32 for stages 2-3 accumulating micro-batches (the shard sums
  /// them in fp32, as the offloaded gradients do), else the compute dtype.
  DType grad_dtype() const;
  /// Whether some of the group's sub-groups are on the device optimizer / offloaded.
  bool has_device_sub_groups(const Group& g) const;
  bool has_offloaded_sub_groups(const Group& g) const;

  // step.cpp
  StepResult step();
  /// At least `bytes` of host memory registered with the device, for the step's small
  /// read-backs (kept between steps; a few bytes per sub-group, not in the ledger).
  std::byte* readback_area(std::size_t bytes);
  AlignedBuffer readback;
  bool readback_registered = false;
  std::int64_t sub_group_numel() const;
  const void* grad_of(const Group& g) const;
  /// The group's host part of the update for the pipeline: its offloaded sub-groups, their new
  /// compute-dtype parameters going to `out` (device memory, the group's range).
  PipelineGroup host_part(Group& g, int index, void* out);
  /// Queues Device::adam_step for the group's device sub-groups on `stream`, reading `grad`
  /// (grad_dtype(), the group's range).
  void update_on_device(Group& g, const UpdatePlan& plan, const void* grad, void* out, Stream& stream);
  // sub_groups.cpp
  /// How many sub-groups (of all groups, in order) stay on the device optimizer.
  int device_sub_group_count() const;
  /// Splits the group's range into sub-groups (their sizes only; initialize.cpp writes their
  /// initial states): the first `device_left` get device memory (decremented), the rest are
  /// registered with the offload tier.
  void place_sub_groups(Group& g, int& device_left);

  // initialize.cpp
  /// Writes every group's initial values to their homes, chunk by chunk (see the file).
  /// After the offload tiers' finalize().
  void write_initial_values();
  /// Fills `out` with the group's fp32 initial values of flat elements [begin, begin +
  /// out.size()) from the parameters' initializers (padding zero). Throws Error naming the
  /// parameter whose initializer failed.
  void fill_initial(const Group& g, std::int64_t begin, std::span<float> out);
  /// Fills master / exp_avg / exp_avg_sq ([3 * opt_numel] floats, host memory) of the range.
  std::vector<float> read_states(Group& g);
  /// Writes all three states of the range from `all` ([3 * opt_numel] floats).
  void write_states(Group& g, const std::vector<float>& all);

  /// Parameter offload: the host part writing the group's update into its shard's home
  /// (the tier's write buffer, committed after the last sub-group).
  PipelineGroup param_host_part(Group& g, int index, std::shared_ptr<DeviceBuffer> device_out);

  // async_update.cpp
  /// Queues every group's update: device sub-groups on the update stream, offloaded ones in the
  /// pipeline; returns at once (zoe.overlap_step) or after finish_update().
  void start_update(const UpdatePlan& plan);
  /// Makes `side` wait for group g's update and, stages 1-2, all-gathers its new shard.
  void after_update(Group& g);
  /// Blocks until the whole update is done (rethrows its error), then all-gathers every
  /// stale group (stages 1-2).
  void finish_update();
  /// This rank's fp32 master weights of the group's range (opt_numel floats), host memory.
  std::vector<float> master_range(Group& g);

  // param_access.cpp
  /// Runs of equal optimizer options over the group's flat buffer [0, padded_numel): parameter
  /// i covers [offset(i), offset(i + 1)) (its padding with it), neighbours with equal options merged.
  std::vector<OptimRun> option_runs(const Group& g) const;
  /// Writes all three states of the group's range from `all` and recomputes its compute-
  /// dtype parameters from the master weights (stages 1-2: all-gathered into the full copy).
  void write_states_and_params(Group& g, const std::vector<float>& all);
  /// This rank's compute-dtype part of a frozen group: its shard [shard_begin(rank),
  /// + shard_numel) (stages 0-2: that slice of the full copy), host memory, shard_numel x
  /// dtype_size bytes. read_frozen_shard / write_frozen_shard (stages 0-2: all-gathered into
  /// the full copy, tagged).
  std::vector<std::byte> read_frozen_shard(Group& g);
  void write_frozen_shard(Group& g, const std::byte* shard);
  /// The group's whole padded flat buffer in fp32 (the master weights; frozen: the compute-
  /// dtype values widened), gathered from every rank (tagged collective). Host memory.
  std::vector<float> gather_group(Group& g, const CollectiveTag& tag);
  /// UsageError naming `param` and `call` if a module is between begin_* and end_*.
  void check_between_steps(const ParamInfo& param, const char* call) const;
  /// Counted, tagged all-gather of raw fp64 words for the trainer's scalars.
  void all_reduce_scalars(std::span<double> values, ScalarReduce op, const std::string& name);
};

}  // namespace zoe::core

namespace zoe {
struct Engine::Impl : core::EngineImpl {
  using EngineImpl::EngineImpl;
  // The public step()'s bookkeeping for the config's logging keys (engine.cpp): step() calls
  // made, skipped ones included (DeepSpeed's global_steps), those skipped, and when the last
  // one returned (the Engine's construction before the first).
  std::int64_t step_calls = 0, skipped_calls = 0;
  std::chrono::steady_clock::time_point last_step_end = std::chrono::steady_clock::now();
};
}  // namespace zoe
