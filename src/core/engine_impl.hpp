// EngineImpl (Engine::Impl): the state of one rank's ZeRO engine and the pieces of its work, split
// over files by idea: engine.cpp (registration, partitioning, public API), gather.cpp
// (stage-3 all-gather, prefetch, release), gradients.cpp (gradient buffers and their
// reduction), step.cpp (norm, overflow, clipping, the optimizer over sub-groups).
// Not thread-safe: one thread drives an Engine.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/core/call_rules.hpp"
#include "src/core/device_buffer.hpp"
#include "src/core/flat_layout.hpp"
#include "src/core/loss_scaler.hpp"
#include "src/core/memory_ledger.hpp"
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
};

/// A sub-group: up to sub_group_size elements of a rank's optimizer range whose step runs as
/// one unit, either on the device optimizer (Device::adam_step; fp32 states in
/// `device_states`) or on the CPU optimizer (states in the offload tier, id `offload_id`).
/// offload_optimizer.ratio chooses how many sub-groups are offloaded (the last ones).
struct SubGroup {
  std::int64_t begin = 0, numel = 0;  // elements, within the group's optimizer range
  int offload_id = -1;                // OptimizerStates id; -1 = device optimizer
  DeviceBuffer device_states;         // device: [master | exp_avg | exp_avg_sq], 3 * numel floats
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

  // Compute-dtype parameters. Stages 0-2: param_full is the persistent full copy.
  // Stage 3: param_shard is persistent, param_full exists while gathered; with parameter
  // offload the shard lives in EngineImpl::param_store (id param_id), not on the device.
  DeviceBuffer param_full, param_shard;
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

  // Stages 1-2: the updated own shard waits in `updated` until it is all-gathered into
  // param_full (lazily, before the group's next use, in module order on every rank).
  // Delayed update, every stage: the new parameters wait there until the next step().
  DeviceBuffer updated;
  bool params_stale = false;
  /// Recorded on the update stream after this group's optimizer update.
  std::unique_ptr<Event> update_done;
};

/// The optimizer update of one step (Adam hyper-parameters, step number, gradient factor).
struct UpdatePlan {
  optim::AdamHyper hyper;
  std::int64_t step;
  float grad_scale;  // 1 / (loss_scale * world * micro_batches) * clip_coef
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
  std::unique_ptr<Event> after;
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
  int stage;
  DType dtype;  // compute dtype
  std::unique_ptr<Stream> side;  // collectives, reductions, optimizer copies (in order)
  MemoryLedger ledger;
  LossScaler scaler;
  std::unique_ptr<optim::CpuAdam> adam;
  std::unique_ptr<offload::OptimizerStates> states;  // optimizer offload (cpu / nvme)
  std::unique_ptr<Stream> update_stream;             // the optimizer update, group by group
  std::unique_ptr<offload::ParamShards> param_store;  // parameter offload (stage 3: cpu / nvme)
  double lr;
  std::int64_t step_count = 0;
  bool delayed = false;  // zoe.delayed_update: forward/backward do not wait for the last update
  CallRules rules{config.gradient_accumulation_steps};  // call order; collective identity (call_rules.hpp)
  bool poison = false;  // zoe.debug_poison: freed buffers are filled with NaN (free_after_side)

  std::vector<ParamInfo> params;
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
  void check_module(ModuleId m) const;
  ModuleTensors views(const ModuleInfo& m, bool with_grads);
  /// Makes work queued on `side` before now visible to the trainer's compute.
  void ready_for_compute(Event& event);
  /// Makes the trainer's work so far visible to `side`.
  void side_waits_for_compute();
  /// Frees `buffer` once the side stream has reached this point (with zoe.debug_poison it is
  /// first filled with NaN there).
  void free_after_side(DeviceBuffer buffer, std::int64_t gathered_elements = 0, std::shared_ptr<void> hold = {});
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
  void gather(Group& g);
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
  /// Adds the group's reduced shard (compute dtype, device memory) to the fp32 gradients of
  /// its offloaded sub-groups, on the side stream (after the group's previous update).
  void offload_grads(Group& g, const void* shard, bool first, bool last);
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
  std::int64_t sub_group_numel() const;
  const void* grad_of(const Group& g) const;
  /// The CPU optimizer over the group's offloaded sub-groups: reads their fp32 gradients from
  /// the offload tier, writes their new compute-dtype parameters into `out` (the group's
  /// range). Runs on the calling thread; `stream` orders its device copies (off the host device).
  void update_offloaded(Group& g, const UpdatePlan& plan, void* out, Stream& stream);
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

  /// Parameter offload: the update of one group written back to its shard's home.
  void update_offloaded_params(Group& g, const UpdatePlan& plan, const DeviceBuffer& device_out);
  /// Copies device memory to host memory now (a plain memcpy on the host device, where this
  /// may run inside a host function).
  void copy_to_host_now(void* dst, const void* src, std::size_t bytes, Stream& stream);

  // async_update.cpp
  /// Queues the update of every group on the update stream (zoe.overlap_step) or runs it now.
  void start_update(const UpdatePlan& plan);
  /// Makes `side` wait for group g's update and, stages 1-2, all-gathers its new shard.
  void after_update(Group& g);
  /// Blocks until the whole update is done (rethrows its error), then all-gathers every
  /// stale group (stages 1-2).
  void finish_update();
  /// This rank's fp32 master weights of the group's range (opt_numel floats), host memory.
  std::vector<float> master_range(Group& g);
};

}  // namespace zoe::core

namespace zoe {
struct Engine::Impl : core::EngineImpl {
  using EngineImpl::EngineImpl;
};
}  // namespace zoe
