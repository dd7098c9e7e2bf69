// The Updater's executor and triggers (see updater.hpp for the design): start_update (step()),
// start_in_backward (zoe.update_in_backward), the delayed update's snapshots, after_update /
// finish_update, and the gradients' way into the optimizer tier.
#include "src/core/update/updater.hpp"

#include <algorithm>
#include <cstring>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/common/quote.hpp"
#include "kernels/adam_math.hpp"

namespace zoe::core {

namespace {
// The group's reduced gradient the update reads (stages 1-3: its shard; stage 0: the full buffer).
const void* grad_of(const StagePolicy& policy, const Group& g) {
  return policy.shards_optimizer ? g.grad_shard.data() : g.grad_full.data();
}
}  // namespace

Updater::Updater(EngineContext& cx, Model& model, Collectives& coll, OffloadTiers& tiers)
    : cx_(cx), model_(model), coll_(coll), tiers_(tiers), scaler_(cx.config), lr_(cx.config.optimizer.lr),
      update_stream_(cx.device.create_stream()),
      update_points_(cx.device, cx.side.get()),
      device_batch_(cx.device, *update_stream_, update_grad_dtype(), cx.dtype, update_points_) {}

DType Updater::update_grad_dtype() const {
  // Stage 1 reduces at the step, in the compute dtype; the others keep grad_dtype() shards.
  return cx_.policy.reduces_at_step ? cx_.dtype : cx_.grad_dtype();
}

Updater::~Updater() { stop(); }

void Updater::stop() {
  kept_reads_.clear();
  pipeline_.reset();   // waits for a running update
  grad_sink_.reset();  // and for gradients on their way to the tier
  try {
    cx_.device.synchronize(*update_stream_);
  } catch (...) {
  }
}

UpdatePlan Updater::plan(float grad_scale) const {
  const auto& oc = cx_.config.optimizer;
  return UpdatePlan{optim::AdamHyper{lr_, oc.betas[0], oc.betas[1], oc.eps, oc.weight_decay,
                                     oc.type == OptimizerType::adamw, oc.bias_correction},
                    steps_ + 1, grad_scale};
}

double Updater::unclipped_grad_factor() const {
  return cx_.pre_divisor() / (scaler_.scale() * cx_.world * cx_.gradient_accumulation_steps());
}

void Updater::wait_for_previous_step() {
  // Unless this step's update has begun in backward (queued behind the previous one: waiting
  // would wait for that too); then the error of an earlier wave surfaces here, without waiting.
  if (phase_ == Phase::between_steps) {
    finish_update();
  } else if (pipeline_) {
    pipeline_->check();
  }
}

void Updater::drain_gradients() {
  if (grad_sink_) grad_sink_->drain();
}

std::int64_t Updater::staging_bytes() const {
  return (pipeline_ ? static_cast<std::int64_t>(pipeline_->staging_bytes()) : 0) +
         (grad_sink_ ? static_cast<std::int64_t>(grad_sink_->staging_bytes()) : 0);
}


void Updater::start_update(const UpdatePlan& plan) {
  if (phase_ == Phase::in_backward) {
    // What the groups started in backward used must be what the step computes (set_lr was
    // refused since; no clipping, no loss scale: validated).
    ZOE_CHECK(backward_plan_.step == plan.step && backward_plan_.grad_scale == plan.grad_scale &&
                  backward_plan_.hyper.lr == plan.hyper.lr,
              "update in backward: its plan (step ", backward_plan_.step, ", lr ", backward_plan_.hyper.lr,
              ", gradient factor ", backward_plan_.grad_scale, ") differs from step()'s (step ", plan.step, ", lr ",
              plan.hyper.lr, ", ", plan.grad_scale, ")");
  }
  steps_ = plan.step;
  // Delayed update: the next step's backward refills the gradient buffers while this update
  // still reads them, so it reads a snapshot (stage 1's reduce-scatter output is already
  // private to the step), and the persistent buffers are zeroed now.
  std::vector<std::shared_ptr<DeviceBuffer>> snapshots(model_.groups.size());
  if (cx_.config.zoe.delayed_update) {
    for (std::size_t gi = 0; gi < model_.groups.size(); ++gi) {
      Group& g = model_.groups[gi];
      if (g.frozen) continue;
      // (Validated: the delayed update needs optimizer offload, hence a sharded optimizer.)
      if (cx_.policy.shards_grads) {
        if (!g.grad_shard) continue;  // every sub-group offloaded: offload_grads waits for the update
        snapshots[gi] = std::make_shared<DeviceBuffer>(cx_.alloc(MemKind::buffer, cx_.grad_dtype(), g.layout->shard_numel()));
        cx_.device.copy(snapshots[gi]->data(), grad_of(cx_.policy, g), snapshots[gi]->bytes(), *cx_.side);
      } else {
        cx_.device.fill(g.grad_full.data(), cx_.dtype, g.layout->padded_numel(), 0.0f, *cx_.side);
      }
    }
    cx_.device.synchronize(*cx_.side);
  }
  std::vector<PipelineGroup> host_parts;
  const std::size_t n = model_.groups.size();
  for (std::size_t gi = 0; gi < n; ++gi) {
    Group& g = model_.groups[gi];
    // Thousands of small groups: each group's sub-groups, and their runs, are heap blocks of
    // their own, so the loop is a chain of cache misses; ask for those a few groups ahead (the
    // runs once their sub-group has arrived), and for the groups themselves further ahead
    // (reading a group's sub-group pointer before it had arrived stalled the loop there).
    // Each level is asked for once the level above it has had time to arrive.
    constexpr std::size_t kAhead = 8;
    if (gi + 3 * kAhead < n) {
      const Group& far = model_.groups[gi + 3 * kAhead];
      __builtin_prefetch(&far.subgroups);
      __builtin_prefetch(&far.update_step);
    }
    if (gi + 2 * kAhead < n && !model_.groups[gi + 2 * kAhead].subgroups.empty())
      __builtin_prefetch(model_.groups[gi + 2 * kAhead].subgroups.data());
    if (gi + kAhead < n && !model_.groups[gi + kAhead].subgroups.empty() &&
        !model_.groups[gi + kAhead].subgroups.front().runs.empty())
      __builtin_prefetch(model_.groups[gi + kAhead].subgroups.front().runs.data());
    // Frozen: nothing to update (it stays settled). update_step == plan.step: started in
    // backward (zoe.update_in_backward).
    if (g.frozen || g.update_step == plan.step) continue;
    // The previous step's update of a group this step never used (step() waited for it only
    // when no update began in backward).
    if (g.update_state == Group::UpdateState::pending) after_update(g);
    begin_group_update(static_cast<int>(gi), plan, snapshots[gi], host_parts);
  }
  device_batch_.issue();  // every group's event recorded before anything waits on it
  kept_reads_.clear();    // every update of the step has begun: what was not taken is no one's
  report_kept_reads();
  if (!host_parts.empty()) pipeline_->start(std::move(host_parts), plan);
  if (!cx_.config.zoe.overlap_step && !cx_.config.zoe.delayed_update) finish_update();
}

void Updater::begin_group_update(int gi, const UpdatePlan& plan, const std::shared_ptr<DeviceBuffer>& snapshot,
                                 std::vector<PipelineGroup>& host_parts) {
  Group& g = model_.group(gi);
  ZOE_CHECK(g.update_state == Group::UpdateState::settled, "group ", detail::quoted(g.name), ": update started twice");
  g.update_step = plan.step;
  if (cx_.policy.gathers_updates || cx_.config.zoe.delayed_update) {
    // The new parameters wait in `updated` until after_update applies them.
    g.updated = cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->shard_numel());
  }
  // Pointers are taken now: the buffers may change hands before the work runs.
  const void* grad = snapshot ? snapshot->data() : grad_of(cx_.policy, g);
  void* out = g.updated ? g.updated.data() : !cx_.policy.shards_optimizer ? g.param_full.data() : g.param_shard.data();
  // Parameter offload: device sub-groups write into a device buffer the host part copies
  // into the tier.
  std::shared_ptr<DeviceBuffer> device_out;
  if (tiers_.params) {
    device_out = std::make_shared<DeviceBuffer>(
        has_device_sub_groups(g) ? cx_.alloc(MemKind::buffer, cx_.dtype, g.layout->shard_numel()) : DeviceBuffer());
    out = device_out->data();
  }
  if (out) update_on_device(g, plan, grad, out);
  // After the batch's updates, on the update stream: the gradients are consumed, the group's
  // event, and the buffers the device part reads are freed (lambdas of two pointers:
  // std::function holds them without allocating). A group updated only on the device (no host
  // part reads update_done, no parameter tier queries it) is done at its batch's shared point
  // instead of its own event.
  const bool simple = !snapshot && !cx_.policy.reduces_at_step;
  const bool shares_point = simple && !tiers_.params && !has_offloaded_sub_groups(g);
  if (!shares_point) update_points_.forget(gi);
  auto follow_up = [this, &g] {
    consume_gradients(g);
    cx_.device.record(*g.update_done, *update_stream_);
  };
  if (shares_point) {
    device_batch_.then([this, &g] { consume_gradients(g); }, gi);
  } else if (simple) {
    device_batch_.then(follow_up);
  } else {
    std::shared_ptr<DeviceBuffer> read_grad;  // stage 1's shard, read by the update
    if (cx_.policy.reduces_at_step) read_grad = std::make_shared<DeviceBuffer>(std::move(g.grad_shard));
    device_batch_.then([this, follow_up, snapshot, read_grad] {
      follow_up();
      if (snapshot) cx_.frees.after_stream(*update_stream_, DeviceBuffer(), snapshot);
      if (read_grad) cx_.frees.after_stream(*update_stream_, std::move(*read_grad));
    });
  }
  g.update_state = Group::UpdateState::pending;
  g.host_done.reset();
  if (tiers_.params || has_offloaded_sub_groups(g)) {
    host_parts.push_back(host_part(g, gi, out, std::move(device_out)));
    g.host_done = host_parts.back().done = std::make_shared<GroupDone>();
  }
}


// zoe.update_in_backward (the optimizer step in backward: PyTorch's optimizer hooks in
// backward, LOMO's fused update; here with the states offloaded). A group's gradient is final
// once the step's last micro-batch reduced it; with no clipping and no loss scaling (the
// config refuses both: they need every gradient's norm first) nothing else its update needs
// is still to come, so its update starts then, while backward goes on: the CPU optimizer's
// NVMe reads and writes overlap the rest of backward, not only the next forward. The math is
// the plain step's, bit for bit. Each group is one pipeline wave (its `ready` latch: the
// gradient sink has written its gradient), queued behind the previous step's last wave.
void Updater::start_in_backward(int gi) {
  Group& g = model_.group(gi);
  if (phase_ == Phase::between_steps) {
    // No clipping and no loss scaling (validated): the plan needs no global norm. The lr is
    // the one step() will use (the scheduler's for this step, else set_lr's).
    if (cx_.config.scheduler.type != SchedulerType::none)
      lr_ = cx_.config.scheduler.lr_at(cx_.config.optimizer.lr, steps_);
    backward_plan_ = plan(static_cast<float>(unclipped_grad_factor()));
    phase_ = Phase::in_backward;
  }
  if (g.update_state == Group::UpdateState::pending) after_update(g);  // the previous step's, not yet applied
  std::vector<PipelineGroup> host_parts;
  begin_group_update(gi, backward_plan_, nullptr, host_parts);
  device_batch_.issue();  // the group's update starts now, not with later groups'
  if (host_parts.empty()) return;
  host_parts.front().ready = std::make_shared<GroupDone>();
  grad_sink_->signal(host_parts.front().ready);
  pipeline_->start(std::move(host_parts), backward_plan_);
}

void Updater::report_kept_reads() {
  const KeptShardReads::Counts n = kept_reads_.take_counts();
  if (n.missed == 0 || kept_reads_missed_said_) return;
  kept_reads_missed_said_ = true;
  ZOE_LOG_WARN(
      "rank {}: {} of this step's {} split-master updates read their parameter shard from NVMe again "
      "(2 bytes per element each): the read kept for them was given up for lack of pinned read buffers "
      "(offload_param.buffer_count = {}, the prefetch's and the kept reads' together); a larger "
      "offload_param.buffer_count keeps them (said once)",
      cx_.rank, n.missed, n.missed + n.taken, cx_.config.zero_optimization.offload_param.buffer_count);
}

void Updater::keep_shard_read(int gi, std::shared_ptr<offload::ShardRead> read) {
  if (!kept_reads_.enabled() || !keeps_reads_[static_cast<std::size_t>(gi)]) return;
  // A group whose update began this step has read its shard already (a read now is for a
  // later step).
  if (phase_ == Phase::in_backward && model_.group(gi).update_step == backward_plan_.step) return;
  kept_reads_.keep(gi, std::move(read));
}

void Updater::check_overflow_skippable() const {
  if (phase_ != Phase::in_backward) return;
  // Some groups already took this step's update: the step cannot be skipped as a whole.
  ZOE_THROW(Error, "rank ", cx_.rank, ": inf/NaN in the gradients of step ", backward_plan_.step,
            " with zoe.update_in_backward: ", groups_updated_in_backward(), " group(s) had already taken this step's update in "
            "backward, so the step cannot be skipped and those groups' master weights and exp_avg / exp_avg_sq "
            "may now hold inf/NaN; load the last checkpoint (and lower the lr, or turn zoe.update_in_backward "
            "off to get skipped steps)");
}

int Updater::groups_updated_in_backward() const {
  int started = 0;
  for (const Group& g : model_.groups) started += g.update_step == backward_plan_.step ? 1 : 0;
  return started;
}

void Updater::check_forward_allowed(const ModuleInfo& mod) const {
  if (phase_ != Phase::in_backward) return;
  for (int gi : mod.groups) {
    const Group& g = model_.groups[static_cast<std::size_t>(gi)];
    ZOE_CHECK_USAGE(g.update_step != backward_plan_.step, "begin_forward(", detail::quoted(mod.name), ") before step() with "
                    "zoe.update_in_backward: its group ", detail::quoted(g.name), " already took step ", backward_plan_.step,
                    "'s update in backward; call step() first (evaluation belongs between steps)");
  }
}

void Updater::check_no_update_in_backward(const char* call) const {
  if (phase_ != Phase::in_backward) return;
  ZOE_THROW(UsageError, call, " after the last micro-batch's backward and before step() with "
            "zoe.update_in_backward: ", groups_updated_in_backward(), " group(s) already took step ", backward_plan_.step,
            "'s update, so the parameters and optimizer states are between two steps; call step() first");
}


void Updater::after_update(Group& g) {
  if (g.update_state != Group::UpdateState::pending) return;
  settle_update(g);
  cx_.device.record(*g.param_ready, *cx_.side);
}

void Updater::settle_update(Group& g) {
  if (g.update_state != Group::UpdateState::pending) return;
  if (cx_.policy.gathers_updates && g.updated && gathers_together(g)) return settle_together(g);
  side_waits_for_update(g);
  if (g.updated) {
    if (cx_.policy.gathers_updates) {
      gather_update(g);
    } else {  // stage 3, delayed update
      cx_.device.copy(g.param_shard.data(), g.updated.data(), g.param_shard.bytes(), *cx_.side);
    }
    cx_.frees.after_side(std::move(g.updated));
  }
}

void Updater::side_waits_for_update(Group& g) {
  g.update_state = Group::UpdateState::settled;
  update_points_.wait(model_.index_of(g), *g.update_done);
  // The host part: wait on the side stream (not on this thread) for its latch.
  if (g.host_done) cx_.device.host_func(*cx_.side, [done = g.host_done] { done->wait(); });
}

void Updater::finish_update() {
  if (pipeline_) pipeline_->finish();        // rethrows an error of the host part
  cx_.device.synchronize(*update_stream_);       // and of the device part
  for (Group& g : model_.groups) after_update(g);
}

Updater::Pieces Updater::update_pieces(const Group& g) const {
  // DeepSpeed's all_gather_dp_groups: max(1, shard · world / allgather_bucket_size) pieces of
  // the shard, each aligned (16 elements here, zoe's alignment), the last taking the rest.
  const std::int64_t S = g.layout->shard_numel();
  const std::int64_t pieces = std::max<std::int64_t>(1, S * cx_.world / cx_.config.zero_optimization.allgather_bucket_size);
  // DeepSpeed aligns a piece down (to 2 elements) and would issue empty ones below that.
  const std::int64_t piece = std::max<std::int64_t>(FlatLayout::kAlign, S / pieces / FlatLayout::kAlign * FlatLayout::kAlign);
  return Pieces{std::min(pieces, S / piece), piece};
}

bool Updater::gathers_together(const Group& g) const {
  return cx_.world > 1 && cx_.comm.gathers_parts_in_place() && !g.host_done && update_pieces(g).count == 1;
}

void Updater::settle_together(Group& first) {
  // DeepSpeed all-gathers a parameter group's whole updated partition after the step, in
  // pieces of allgather_bucket_size elements; here the groups that gather whole go together in
  // group order, at the first one's next use (thousands of small modules: one collective
  // instead of one per group). Which groups join depends on the calls only, never on timing,
  // so every rank issues the same collective.
  const std::int64_t bucket = cx_.config.zero_optimization.allgather_bucket_size;
  std::vector<int> batch;
  std::int64_t elements = 0;
  for (int gi = model_.index_of(first); gi < static_cast<int>(model_.groups.size()); ++gi) {
    const Group& g = model_.group(gi);
    if (g.frozen) continue;
    if (g.update_state != Group::UpdateState::pending || !g.updated || !gathers_together(g)) break;
    const std::int64_t e = g.layout->padded_numel();
    if (!batch.empty() && elements + e > bucket) break;
    batch.push_back(gi);
    elements += e;
  }
  std::vector<GroupedPart> parts;
  parts.reserve(batch.size());
  for (int gi : batch) {
    Group& g = model_.group(gi);
    side_waits_for_update(g);
    parts.push_back({g.updated.data(), g.param_full.data(), static_cast<std::size_t>(g.layout->shard_numel())});
  }
  if (batch.size() == 1) {
    gather_update(first);  // alone: its own all-gather, as without neighbours
  } else {
    coll_.all_gather_grouped(parts, cx_.dtype, coll_.coalesced_tag(batch, CollectiveTag::Kind::params));
  }
  for (int gi : batch) {
    Group& g = model_.group(gi);
    cx_.frees.after_side(std::move(g.updated));
    if (&g != &first) cx_.device.record(*g.param_ready, *cx_.side);
  }
}

void Updater::gather_update(Group& g) {
  const std::int64_t S = g.layout->shard_numel();
  const auto [count, piece] = update_pieces(g);
  if (count == 1) {
    coll_.all_gather(g.updated.data(), g.param_full.data(), S, cx_.dtype, coll_.params_tag(g));
    return;
  }
  const std::size_t esz = dtype_size(cx_.dtype);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t begin = k * piece, n = k + 1 == count ? S - begin : piece;  // the last takes the rest
    DeviceBuffer recv = cx_.alloc(MemKind::buffer, cx_.dtype, n * cx_.world);
    coll_.all_gather(at(g.updated.data(), begin), recv.data(), n, cx_.dtype, coll_.params_tag(g));
    for (int r = 0; r < cx_.world; ++r)
      cx_.device.copy(at(g.param_full.data(), r * S + begin), at(recv.data(), r * n), static_cast<std::size_t>(n) * esz, *cx_.side);
    cx_.frees.after_side(std::move(recv));
  }
}

kernels::AdamCoeffs Updater::coeffs_for(const optim::AdamHyper& h, const UpdatePlan& plan) {
  // Groups mostly share their options: the last coefficients are reused (two pow() per run
  // otherwise, for thousands of small groups).
  CoeffMemo& m = coeff_memo_;
  const bool same = m.valid && m.step == plan.step && m.grad_scale == plan.grad_scale && m.hyper.lr == h.lr &&
                    m.hyper.beta1 == h.beta1 && m.hyper.beta2 == h.beta2 && m.hyper.eps == h.eps &&
                    m.hyper.weight_decay == h.weight_decay && m.hyper.decoupled == h.decoupled &&
                    m.hyper.bias_correction == h.bias_correction;
  if (!same)
    m = CoeffMemo{h, plan.step, plan.grad_scale,
                  kernels::adam_coeffs(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled, plan.step,
                                       plan.grad_scale, h.bias_correction),
                  true};
  return m.coeffs;
}

void Updater::consume_gradients(Group& g) {
  // Stages 0-1 zero the persistent gradient buffer for the next step.
  if (!cx_.policy.shards_grads && !cx_.config.zoe.delayed_update)
    cx_.device.fill(g.grad_full.data(), cx_.dtype, g.layout->padded_numel(), 0.0f, *update_stream_);
}

void Updater::update_on_device(Group& g, const UpdatePlan& plan, const void* grad_data, void* out_data) {
  const std::size_t esz = dtype_size(cx_.dtype);
  const DType gdt = update_grad_dtype();
  for (const SubGroup& sg : g.subgroups) {
    if (sg.offloaded()) continue;
    const auto n = static_cast<std::size_t>(sg.numel);
    float* master = sg.master();
    // Each run of equal per-parameter options (weight decay, lr_ factor) with its coefficients,
    // from the same double hyper-parameters the CPU optimizer gets (hyper_for): same bits.
    for (const OptimRun& r : sg.runs) {
      const kernels::AdamCoeffs c = coeffs_for(hyper_for(plan.hyper, r), plan);
      const std::int64_t at = sg.begin + r.begin;
      const auto b = static_cast<std::size_t>(r.begin);
      device_batch_.add(AdamTensor{c, master + b, master + n + b, master + 2 * n + b,
                                   static_cast<const char*>(grad_data) + at * dtype_size(gdt),
                                   static_cast<char*>(out_data) + at * esz, static_cast<std::size_t>(r.numel)});
    }
  }
}
std::shared_ptr<Event> Updater::accept_gradient(Group& g, const void* shard, bool first, bool last) {
  auto reduced = std::shared_ptr<Event>(cx_.device.create_event());
  cx_.device.record(*reduced, *cx_.side);
  std::shared_ptr<Event> read = reduced;
  const std::size_t esz = dtype_size(cx_.dtype);
  // The tier write waits for the group's previous update (it may still read the gradients:
  // delayed update).
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded())
      read = grad_sink_->add(sg.offload_id, static_cast<const char*>(shard) + sg.begin * esz, sg.numel, first, last,
                            *reduced, g.host_done);
  return read;
}
void Updater::zero_offloaded_gradients(Group& g) {
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded()) grad_sink_->zero(sg.offload_id, g.host_done);
}
std::uint8_t Updater::mix_of(const Group& g) {
  std::uint8_t mix = 0;
  for (const SubGroup& sg : g.subgroups) mix |= sg.offloaded() ? kSomeOffloaded : kSomeOnDevice;
  return mix;
}
std::uint8_t Updater::sub_group_mix(const Group& g) const {
  const auto gi = static_cast<std::size_t>(model_.index_of(g));
  return gi < sub_group_mix_.size() ? sub_group_mix_[gi] : mix_of(g);  // (not placed yet: from the group)
}
bool Updater::has_device_sub_groups(const Group& g) const {
  if (!tiers_.states) return true;  // no offload: everything is on the device, even an empty group
  return (sub_group_mix(g) & kSomeOnDevice) != 0;
}
bool Updater::has_offloaded_sub_groups(const Group& g) const { return (sub_group_mix(g) & kSomeOffloaded) != 0; }
}  // namespace zoe::core
