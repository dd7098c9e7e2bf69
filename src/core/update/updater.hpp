// Updater: the one owner of the optimizer update (Adam / AdamW over this rank's sub-groups).
//
// One plan builder (plan()), one host-part builder (host_part()), one executor
// (begin_group_update(): the device sub-groups as Device::adam_step on the update stream, the
// offloaded ones as the group's host part in the one UpdatePipeline), used by all three
// triggers: step() (start_update), the update in backward (start_in_backward, zoe.update_in_
// backward) and the delayed update (start_update with gradient snapshots, zoe.delayed_update).
// Its phase says whether this step's update has begun in backward.
//
// The update overlaps the next forward (ZeRO-Offload's CPU step, without its one-step delay):
// after_update(g) orders the side stream after group g's update (a device wait on the device
// part's event, a host function waiting for the host part's latch), so the next forward of
// module k waits only for the groups it uses. The host latch, not an event the worker
// records, because waiting on a CUDA event that is not yet recorded does not wait; the side
// stream, not the engine's thread, blocks, so prefetching queues ahead without waiting for
// later groups' updates. Collectives stay on the engine's thread in program order: stages 1-2
// leave the new shard in Group::updated and after_update() all-gathers it before the group's
// next use.
//
// Delayed update (ZeRO-Offload's one-step-delayed parameter update, Ren et al. 2021, §4.2
// "DPU"): update N reads a snapshot of step N's gradients and writes the new parameters aside;
// step N+1's forward and backward use the parameters of update N-1; step N+1's step() applies
// update N. This changes the math in exchange for the CPU step overlapping a whole step.
//
// It also owns what the update reads and writes besides the groups: the loss scaler, the lr,
// the step count, the update stream, the pipeline and the gradient sink (the reduced gradients'
// way into the optimizer tier), and the sub-groups' placement and states (update/sub_groups.cpp).
// Not thread-safe: the thread that drives the Engine calls it (the pipeline's worker runs the
// host parts).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/core/collectives.hpp"
#include "src/core/engine_context.hpp"
#include "src/core/loss_scaler.hpp"
#include "src/core/model.hpp"
#include "src/core/offload_tiers.hpp"
#include "src/core/update/device_update_batch.hpp"
#include "src/core/update/gradient_sink.hpp"
#include "src/core/update/kept_shard_reads.hpp"
#include "src/core/update/update_pipeline.hpp"

namespace zoe::core {

class Updater {
 public:
  /// Whether this step's update has begun: not before step() (between_steps), or group by
  /// group in backward since the first group's gradient became final (in_backward, until
  /// step() ends).
  enum class Phase { between_steps, in_backward };

  Updater(EngineContext& cx, Model& model, Collectives& coll, OffloadTiers& tiers);
  /// stop().
  ~Updater();
  /// Waits for a running update and for gradients on their way to the tier, then for the
  /// update stream (errors dropped): what must end before the side stream can be drained.
  void stop();
  Updater(const Updater&) = delete;
  Updater& operator=(const Updater&) = delete;

  // ---- build (update/sub_groups.cpp)
  /// Splits every group's optimizer range into sub-groups of sub_group_size elements: the first
  /// ones (in forward order) get device memory, offload_optimizer.ratio of them (the last ones)
  /// go to the optimizer tier. Sizes only; the values are written after the tiers open.
  void place_sub_groups();
  /// With optimizer or parameter offload: the update pipeline and the gradient sink, with pinned
  /// staging of the largest offloaded sub-group (after the tiers' finalize).
  void build_paths();

  // ---- the plan
  /// The update of the coming step (step count + 1) with this step's lr and gradient factor
  /// `grad_scale` (1 / (loss scale x world x micro-batches) x pre-divisor x clip coefficient).
  UpdatePlan plan(float grad_scale) const;
  /// The gradient factor without clipping: pre_divisor / (loss scale x world x micro-batches).
  double unclipped_grad_factor() const;

  // ---- the three triggers
  /// step(): queues the update of every trainable group not yet started in backward and counts
  /// the step (steps() becomes plan.step); returns at once (zoe.overlap_step) or after
  /// finish_update().
  void start_update(const UpdatePlan& plan);
  /// zoe.update_in_backward: group gi's gradient of the step's last micro-batch is reduced:
  /// starts its update now as one pipeline wave (waiting for the gradient sink).
  void start_in_backward(int gi);
  /// At step(): the previous step's update (unless this step's began in backward, which is
  /// queued behind it: only its errors so far are rethrown).
  void wait_for_previous_step();
  /// At the end of step(): the next step's update has not begun.
  void step_ended() { phase_ = Phase::between_steps; }

  // ---- ordering the side stream after the update
  /// Makes the side stream wait for group g's update and, stages 1-2 / delayed update, applies
  /// its new parameters (all-gathered), then records g.param_ready on the side stream. No-op
  /// unless the group's update is pending.
  void after_update(Group& g);
  /// after_update without recording the group's param_ready: for a caller that queues more
  /// side-stream work for the group (stage 3's all-gather) and records param_ready after it.
  void settle_update(Group& g);
  /// Blocks until the whole update is done (rethrows its error), then after_update of every group.
  void finish_update();

  // ---- the gradients' way into the optimizer tier
  /// Adds group g's reduced shard (compute dtype, device memory, reduced on the side stream) to
  /// the fp32 gradients of its offloaded sub-groups (after the group's previous update).
  /// Returns the event after which `shard` is no longer read.
  std::shared_ptr<Event> accept_gradient(Group& g, const void* shard, bool first, bool last);
  /// Sets the offloaded sub-groups' gradients to zero (no backward reached the group).
  void zero_offloaded_gradients(Group& g);
  /// Blocks until every gradient on its way into the tier is there.
  void drain_gradients();
  /// Whether some of the group's sub-groups are on the device optimizer / offloaded.
  bool has_device_sub_groups(const Group& g) const;
  bool has_offloaded_sub_groups(const Group& g) const;

  // ---- split master weights with the update in backward (update/kept_shard_reads.hpp)
  /// Keeps `read` (an NVMe read of group gi's parameter shard made this step) for the group's
  /// update when it reads the shard (split masters on NVMe, update in backward) and has not
  /// started yet; otherwise does nothing.
  void keep_shard_read(int gi, std::shared_ptr<offload::ShardRead> read);
  /// A parameter tier read buffer held by a kept read back, or waited for
  /// (KeptShardReads::free_one); false if none is held.
  bool free_kept_read() { return kept_reads_.free_one(); }
  /// Set once by the engine: how free_kept_read reduces the gradients waiting in the bucket.
  KeptShardReads& kept_reads() { return kept_reads_; }

  // ---- misuse while the update is in backward
  /// Throws UsageError naming `call` while this step's update has begun in backward.
  void check_no_update_in_backward(const char* call) const;
  /// Throws UsageError when module `m` uses a group whose update began in backward this step.
  void check_forward_allowed(const ModuleInfo& m) const;
  /// Throws Error (the step cannot be skipped) when this step's update began in backward.
  void check_overflow_skippable() const;
  /// Whether this step's update has begun in backward.
  Phase phase() const { return phase_; }

  // ---- the optimizer's own state (state_dict)
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  /// Updates applied so far (DeepSpeed's global_steps less the skipped ones).
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }
  /// This rank's fp32 master weights of the group's range (opt_numel floats), host memory.
  std::vector<float> master_range(Group& g);
  /// master / exp_avg / exp_avg_sq of the group's range ([3 x opt_numel] floats, host memory).
  std::vector<float> read_states(Group& g);
  /// Writes all three states of the range from `all` ([3 x opt_numel] floats).
  void write_states(Group& g, const std::vector<float>& all);
  /// Split master weights (zoe.split_master_weights): the group's bf16 parameter shard, the
  /// masters' high halves (opt_numel values from the parameter tier; sub-group sg's at
  /// sg.begin), which read_master / read_all of OptimizerStates need; empty otherwise.
  std::vector<std::uint16_t> master_high_halves(const Group& g);
  /// Pinned staging bytes of the pipeline and the gradient sink.
  std::int64_t staging_bytes() const;

 private:
  int device_sub_group_count() const;
  /// At step(), once every update of the step has begun: warns (once per engine) if an update
  /// found the read kept for it given up, so it read its shard from NVMe again.
  void report_kept_reads();
  void place_sub_groups(Group& g, int& device_left);
  /// On the update stream after group g's update: its gradients are consumed (stages 0-1 zero
  /// the persistent buffer for the next step).
  void consume_gradients(Group& g);
  // Which optimizers a group's sub-groups use, one byte per group (kSomeOnDevice |
  // kSomeOffloaded), set by place_sub_groups().
  static constexpr std::uint8_t kSomeOnDevice = 1, kSomeOffloaded = 2;
  static std::uint8_t mix_of(const Group& g);  // from its sub-group vector
  std::uint8_t sub_group_mix(const Group& g) const;
  std::vector<std::uint8_t> sub_group_mix_;
  /// The executor: queues group gi's update (device part on the update stream, host part
  /// appended to `host_parts`); `snapshot`: the delayed update's copy of its gradient.
  void begin_group_update(int gi, const UpdatePlan& plan, const std::shared_ptr<DeviceBuffer>& snapshot,
                          std::vector<PipelineGroup>& host_parts);
  /// The group's device sub-groups' updates, run by run, added to the device batch.
  void update_on_device(Group& g, const UpdatePlan& plan, const void* grad, void* out);
  /// The dtype of the gradients the device part reads.
  DType update_grad_dtype() const;
  /// kernels::adam_coeffs of `h` for the plan's step and gradient factor (memoised).
  kernels::AdamCoeffs coeffs_for(const optim::AdamHyper& h, const UpdatePlan& plan);
  /// The host-part builder: the group's offloaded sub-groups for the pipeline, their outputs to
  /// `out` (device memory, the group's range), or, with parameter offload, into the shard's
  /// home in the parameter tier (after copying the device sub-groups' `device_out` there).
  PipelineGroup host_part(Group& g, int gi, void* out, std::shared_ptr<DeviceBuffer> device_out);
  /// Stages 1-2: all-gathers the group's updated shard into param_full, in pieces of at most
  /// about allgather_bucket_size elements (DeepSpeed's all_gather_dp_groups).
  void gather_update(Group& g);
  /// The pieces gather_update cuts group g's updated shard into, and their size (elements).
  struct Pieces {
    std::int64_t count, size;
  };
  Pieces update_pieces(const Group& g) const;
  /// Whether g's updated shard may be all-gathered together with its neighbours' (stages 1-2):
  /// ranks as threads (the communicator moves parts in place: no staging), one piece, and no
  /// host part (an offloaded update keeps its own gather, so the next forward waits for that
  /// group's CPU update only, not its neighbours').
  bool gathers_together(const Group& g) const;
  /// Settles `first` and the pending groups after it that gather together, up to
  /// allgather_bucket_size elements, with one grouped all-gather (records the others'
  /// param_ready; after_update records first's).
  void settle_together(Group& first);
  /// pending -> settled: the side stream waits for group g's update (device part and, if any,
  /// host part). What the new values need next (a gather, a copy) is the caller's.
  void side_waits_for_update(Group& g);
  int groups_updated_in_backward() const;

  EngineContext& cx_;
  Model& model_;
  Collectives& coll_;
  OffloadTiers& tiers_;
  LossScaler scaler_;
  double lr_;
  std::int64_t steps_ = 0;
  std::unique_ptr<Stream> update_stream_;  // the device sub-groups' updates, in batches
  SharedReady update_points_;               // "done" points shared by a batch's groups (the side stream waits)
  DeviceUpdateBatch device_batch_;          // queues them on update_stream_
  // With optimizer or parameter offload: the CPU optimizer's pipeline and the gradients' way
  // into the tier. Declared after what they use: destroyed first.
  std::unique_ptr<UpdatePipeline> pipeline_;
  std::unique_ptr<GradientSink> grad_sink_;
  Phase phase_ = Phase::between_steps;
  // Reads of parameter shards kept for their groups' updates, and which groups use them (one
  // byte per group, set by build_paths). A handed read shares its counter, not this object.
  KeptShardReads kept_reads_;
  std::vector<std::uint8_t> keeps_reads_;
  bool kept_reads_missed_said_ = false;  // report_kept_reads warned
  UpdatePlan backward_plan_{};  // the plan of the update begun in backward (phase in_backward)
  struct CoeffMemo {
    optim::AdamHyper hyper;
    std::int64_t step = -1;
    float grad_scale = 0.0f;
    kernels::AdamCoeffs coeffs{};
    bool valid = false;
  } coeff_memo_;  // coeffs_for's last result
};

}  // namespace zoe::core
