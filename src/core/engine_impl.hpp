// EngineImpl (Engine::Impl): the state of one rank's ZeRO engine and the pieces of its work, split
// over files by idea: engine.cpp (registration, partitioning, public API), gather.cpp
// (stage-3 all-gather, prefetch, release), gradients.cpp (gradient buffers and their
// reduction), step.cpp (norm, overflow, clipping, the optimizer over sub-groups).
// Not thread-safe: one thread drives an Engine.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/common/boundary_errors.hpp"
#include "src/common/check.hpp"
#include "src/core/call_rules.hpp"
#include "src/core/deferred_frees.hpp"
#include "src/core/execution_trace.hpp"
#include "src/core/group.hpp"
#include "src/core/stage_policy.hpp"
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
  /// zoe.pinned_budget_bytes: every pinned consumer below reserves its bytes here (built first,
  /// destroyed last).
  std::shared_ptr<offload::PinnedBudget> pinned_budget;
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
  // zoe.update_in_backward: whether this step's update has begun, group by group, in backward
  // (in_backward from the first group's start, in flush_bucket, until step() ends; the plan is
  // `backward_plan` then). See async_update.cpp.
  enum class StepUpdate { not_started, in_backward } step_update = StepUpdate::not_started;
  UpdatePlan backward_plan{};
  CallRules rules{config.gradient_accumulation_steps};  // call order; collective identity (call_rules.hpp)
  DeferredFrees frees{device, *side, config.zoe.debug_poison};  // zoe.debug_poison: NaN-filled frees

  std::vector<ParamInfo> params;
  std::unordered_map<std::string, std::uint32_t> param_by_name;  // every registered name
  std::vector<std::string> param_groups;                          // add_param_group names, in order
  std::vector<ModuleInfo> modules;
  std::vector<Group> groups;
  bool finalized = false;
  std::string finalize_error;  // why a finalize failed (the engine is unusable then)

  // Stage-3 gathering.
  ExecutionTrace trace;             // the order prefetch follows
  std::int64_t live_elements = 0;   // gathered parameter elements in use or prefetched

  GradBucket bucket;  // gradients waiting for their reduction (gradients.cpp)

  // Traffic of the current / last step.
  CommStats step_start_stats;
  // The engine's collectives over parameters and gradients so far, per kind (the step's
  // agreement and norm all-reduce are not counted): TrafficReport's *_calls.
  std::int64_t all_gather_calls = 0, reduce_scatter_calls = 0, all_reduce_calls = 0;
  std::int64_t calls_at_step_start[3] = {0, 0, 0};
  TrafficReport last_traffic;
  std::int64_t elements_sent = 0, elements_at_step_start = 0;

  // Rank failures. guarded() runs a public call; an error that leaves this rank unable to go
  // on aborts the communicator first (Communicator::abort, cause "<call>: <what()>"), so the
  // peers' collectives throw RankFailedError naming this rank and the error at once instead of
  // waiting comm_timeout_s for it (DeepSpeed on NCCL: ncclCommAbort). Not aborted: UsageError
  // and ConfigError (the call rules and set_lr throw them before changing anything, so the
  // trainer may go on), and errors every rank throws together after agreeing on them
  // (checkpoint.cpp sets `agreed_failure` just before: a failed save or load leaves the engine
  // usable).
  bool agreed_failure = false;
  template <class F>
  decltype(auto) guarded(const char* call, F&& f);

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
  DeviceBuffer alloc(MemKind kind, DType dt, std::int64_t numel);

  // counted collectives (elements as nccl-tests counts bus traffic), tagged with what they are
  // for (group_tag in call_rules.hpp) and noted in the step's fingerprint
  void all_gather(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag);
  void all_reduce(void* buf, std::int64_t count, DType dt, CollectiveTag tag);
  // call_rules.cpp: the tags of collectives about group g's parameters / gradients now
  CollectiveTag params_tag(const Group& g) const;
  CollectiveTag grads_tag(const Group& g) const;
  /// The tag of one collective over several groups' parameters / gradients (a reduce bucket,
  /// a coalesced all-gather): the first group's index and micro-batch, every group named.
  CollectiveTag coalesced_tag(const std::vector<int>& group_indices, CollectiveTag::Kind kind) const;

  // gather.cpp
  void acquire(int module, bool backward);
  void release(int module);
  /// Stage 3, sharded -> gathered: allocates param_full and queues its all-gather on the side
  /// stream (after the group's update); no-op when gathered.
  void gather(Group& g);
  /// gather() of several groups with one all-gather (DeepSpeed's all_gather_coalesced): their
  /// shards concatenated, gathered rank-major, then copied into each param_full. Groups
  /// already gathered are skipped; one group left is a plain gather(). With parameter offload
  /// at most ParamShards::read_slots() groups per collective (each holds a read buffer).
  void gather_coalesced(std::vector<int> gis);
  /// Stage 3, gathered -> sharded: param_full is freed after the side stream's work so far
  /// (the caller has ordered the trainer's reads before it: side_waits_for_compute).
  void reshard(Group& g);
  /// Parameter offload: the group's shard on its way in (waits for a free read buffer by
  /// returning finished gathers' buffers).
  std::shared_ptr<offload::ShardRead> begin_shard_read(Group& g);
  /// Gathers the groups the recorded order uses next, up to stage3_prefetch_bucket_size
  /// elements and within stage3_max_live_parameters (nothing unless the trace predicts).
  void prefetch();
  bool in_prefetch_window(int group) const;
  void drop_all_gathered();

  // gradients.cpp
  void prepare_grads(ModuleInfo& m);
  void finish_backward(ModuleInfo& m);
  /// Puts group `gi`'s complete gradient of this round into the bucket (reducing the bucket
  /// first when it would overflow, after when it is full).
  void queue_reduction(int gi);
  /// Reduces the bucket's groups with one collective (nothing when empty). With
  /// overlap_comm false the trainer's compute then waits for the reduction.
  void flush_bucket();
  /// What each gradient is divided by before its reduction: the world size with
  /// prescale_gradients, else gradient_predivide_factor (DeepSpeed's engine and ZeRO
  /// average_tensor); the step divides the sum by world / this.
  double pre_divisor() const { return config.prescale_gradients ? world : config.gradient_predivide_factor; }
  /// Whether every group has reduced the round of the bucket's last group.
  bool round_complete() const;
  /// One group's reduction straight from its gradient buffer (a bucket of one group).
  void reduce_group(Group& g);
  /// Several groups' reduction: their gradients flattened into one buffer (rank-major for
  /// reduce-scatter: [rank 0's shards of every group | rank 1's | ...]), one collective, the
  /// results copied back (all-reduce) or taken per group from the reduced shards.
  void reduce_groups(const std::vector<int>& gis);
  /// What follows the reduce-scatter of group g into `reduced` (its shard, compute dtype, on
  /// the side stream; stages 1-3): into grad_shard and the offloaded sub-groups. `reduced`
  /// is read only by side-stream work queued here (free it after the side stream).
  void absorb_shard(Group& g, const void* reduced);
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
  /// Where write_values takes a chunk's values: the fp32 master weights of flat elements
  /// [begin, begin + master.size()) of the group and, for a chunk of the optimizer range when
  /// asked, its exp_avg then exp_avg_sq (`moments`: 2 * master.size() floats; else empty).
  using ChunkSource = std::function<void(const Group& g, std::int64_t begin, std::span<float> master,
                                         std::span<float> moments)>;
  /// write_initial_values with the values of `source` (a checkpoint): the same chunks, the
  /// same homes and roundings; `with_moments` also sets exp_avg / exp_avg_sq (else zero).
  /// `source` runs on the calling thread, filling chunk k+1 while a writer thread stores
  /// chunk k (ChunkPipeline); the first error of either is rethrown once both have stopped.
  void write_values(const ChunkSource& source, bool with_moments);
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
  /// Queues group `gi`'s update (its device part on the update stream, its host part appended
  /// to `host_parts`); `snapshot`: the delayed update's copy of its gradient (or null).
  void begin_group_update(std::size_t gi, const UpdatePlan& plan, const std::shared_ptr<DeviceBuffer>& snapshot,
                          std::vector<PipelineGroup>& host_parts);
  /// The plan of the coming step when it needs no global gradient norm (zoe.update_in_backward:
  /// no clipping, no loss scaling): this step's lr, step number and 1 / (world * gas * pre-divisor).
  UpdatePlan plan_without_norm() const;
  /// zoe.update_in_backward: starts group `gi`'s update as one pipeline wave once its gradient
  /// of the step's last micro-batch is in the tier (the wave waits for the gradient sink).
  void start_update_in_backward(int gi);
  /// Throws UsageError naming `call` while this step's update has begun in backward (the
  /// parameters and states are between two steps' values until step()).
  void check_no_update_in_backward(const char* call) const;
  /// Groups that already took this step's update in backward (valid while step_update is in_backward).
  int groups_updated_in_backward() const;
  /// Throws UsageError when module `m` uses a group whose update began in backward this step
  /// (its parameters hold the next step's values until step()). Any other forward may run
  /// (activation checkpointing's recompute of a module not yet through its backward).
  void check_forward_after_update_in_backward(int m) const;
  /// Makes `side` wait for group g's update and, stages 1-2, all-gathers its new shard.
  void after_update(Group& g);
  /// Stages 1-2: all-gathers the group's updated shard into param_full, in pieces of at most
  /// about allgather_bucket_size elements in all (DeepSpeed's all_gather_dp_groups), each
  /// through a staging buffer when there are several.
  void gather_update(Group& g);
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
  /// What read_parameter / write_parameter (`call`) do first: the parameter of `index`, once
  /// it is known (UsageError otherwise), no module is between begin_* and end_* (UsageError
  /// naming the parameter and the module), the engine is built and the last update is done.
  const ParamInfo& param_between_steps(std::uint32_t index, const char* call);
  /// Counted, tagged all-gather of raw fp64 words for the trainer's scalars.
  void all_reduce_scalars(std::span<double> values, ScalarReduce op, const std::string& name);
};

template <class F>
decltype(auto) EngineImpl::guarded(const char* call, F&& f) {
  agreed_failure = false;
  try {
    return std::forward<F>(f)();
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    if (!std::exchange(agreed_failure, false)) comm.abort(detail::concat(call, ": ", e.what()));
    detail::rethrow_as_zoe_error(call);
  } catch (...) {
    comm.abort(detail::concat(call, ": an exception that is not a std::exception"));
    detail::rethrow_as_zoe_error(call);
  }
}

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
