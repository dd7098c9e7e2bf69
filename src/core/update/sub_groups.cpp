// Sub-groups, the Updater's units of work: where each part of a rank's optimizer states lives
// (device memory for the device optimizer, or the offload tier for the CPU optimizer), the
// update paths built over them, and reading / writing their states as host arrays
// (gather_parameter and checkpoints; not on the training path: they synchronize).
#include <algorithm>
#include <cmath>
#include <span>

#include "src/common/check.hpp"
#include "src/core/update/updater.hpp"

namespace zoe::core {

int Updater::device_sub_group_count() const {
  std::int64_t total = 0;
  for (const Group& g : model_.groups) total += (g.opt_numel + cx_.sub_group_numel() - 1) / cx_.sub_group_numel();
  if (!tiers_.states) return static_cast<int>(total);
  // offload_optimizer.ratio of the sub-groups (rounded up) go to the CPU optimizer: the last
  // ones in forward order, so the next forward's first modules wait only for the fast
  // device updates while the CPU works on the last modules.
  const auto host = static_cast<std::int64_t>(std::ceil(cx_.config.zero_optimization.offload_optimizer.ratio *
                                                        static_cast<double>(total)));
  return static_cast<int>(total - std::min(total, host));
}

void Updater::place_sub_groups() {
  int device_left = device_sub_group_count();
  for (Group& g : model_.groups) place_sub_groups(g, device_left);
  // Asked per group and call (the reducer, the update): one contiguous byte per group, not a
  // walk over each group's own sub-group vector.
  sub_group_mix_.clear();
  for (const Group& g : model_.groups) sub_group_mix_.push_back(mix_of(g));
  // zoe.update_in_backward on NVMe: a group's gradients wait in host memory only until its
  // update, which starts in backward, so a few recycled buffers keep every gradient off NVMe.
  // A wave waits for all of its group's gradients: the most sub-groups of one group, plus one
  // so that the next group's first gradient need not wait for the update.
  // With several micro-batches every gradient lives across the whole step (they accumulate), so
  // host_memory_budget decides as at step().
  if (tiers_.states && cx_.config.zoe.update_in_backward && cx_.config.gradient_accumulation_steps == 1 &&
      cx_.config.zero_optimization.offload_optimizer.device == OffloadDevice::nvme) {
    int most = 0;
    for (const Group& g : model_.groups) {
      int offloaded = 0;
      for (const SubGroup& sg : g.subgroups) offloaded += sg.offloaded() ? 1 : 0;
      most = std::max(most, offloaded);
    }
    tiers_.states->recycle_gradient_slots(most + 1);
  }
}

void Updater::build_paths() {
  if (!tiers_.states && !tiers_.params) return;  // every update is device work on the update stream
  // Pinned staging of one sub-group each: the largest offloaded one.
  std::int64_t largest = 0;
  for (const Group& g : model_.groups)
    for (const SubGroup& sg : g.subgroups)
      if (sg.offloaded()) largest = std::max(largest, sg.numel);
  const auto& oo = cx_.config.zero_optimization.offload_optimizer;
  UpdatePipelineOptions po;
  po.out_dtype = cx_.dtype;
  // With parameter offload the outputs go into the parameter tier (host memory): no staging.
  po.staging_bytes = tiers_.params ? 0 : static_cast<std::size_t>(largest) * dtype_size(cx_.dtype);
  po.pin_memory = oo.pin_memory;
  po.pinned_budget = tiers_.pinned_budget;
  pipeline_ = std::make_unique<UpdatePipeline>(cx_.device, tiers_.states.get(), *tiers_.adam, po);
  cx_.ledger.add(Tier::host, MemKind::buffer, static_cast<std::int64_t>(pipeline_->staging_bytes()));
  if (tiers_.states && largest > 0) {
    GradientSinkOptions go;
    go.dtype = cx_.dtype;
    go.largest_numel = largest;
    go.pin_memory = oo.pin_memory;
    go.pinned_budget = tiers_.pinned_budget;
    grad_sink_ = std::make_unique<GradientSink>(cx_.device, *tiers_.states, go);
    cx_.ledger.add(Tier::host, MemKind::buffer, static_cast<std::int64_t>(grad_sink_->staging_bytes()));
  }
  // Split masters with the update in backward: the groups whose update reads its shard's
  // stored values (a sub-group with split masters) take them from the step's last read of the
  // shard instead of a second NVMe read (update/kept_shard_reads.hpp).
  keeps_reads_.assign(model_.groups.size(), 0);
  if (!tiers_.params || !tiers_.states || !cx_.config.zoe.update_in_backward) return;
  bool any = false;
  for (std::size_t gi = 0; gi < model_.groups.size(); ++gi)
    for (const SubGroup& sg : model_.groups[gi].subgroups)
      if (sg.offloaded() && tiers_.states->split_master(sg.offload_id)) {
        keeps_reads_[gi] = 1;
        any = true;
      }
  kept_reads_.enable(any);
}

void Updater::place_sub_groups(Group& g, int& device_left) {
  const std::vector<OptimRun> flat = model_.option_runs(g, cx_.config.optimizer.weight_decay);  // over the whole flat buffer
  for (std::int64_t c = 0; c < g.opt_numel; c += cx_.sub_group_numel()) {
    SubGroup sg;
    sg.begin = c;
    sg.numel = std::min(cx_.sub_group_numel(), g.opt_numel - c);
    // The sub-group's part of each run, relative to its first element.
    const std::int64_t a = g.opt_begin + c, b = a + sg.numel;
    for (const OptimRun& r : flat) {
      const std::int64_t lo = std::max(a, r.begin), hi = std::min(b, r.begin + r.numel);
      if (lo < hi) sg.runs.push_back(OptimRun{lo - a, hi - lo, r.weight_decay, r.lr_scale});
    }
    if (device_left > 0) {
      --device_left;
      sg.device_states = cx_.alloc(MemKind::model_state, DType::f32, 3 * sg.numel);
    } else {
      sg.offload_id = tiers_.states->add(sg.numel);
    }
    g.subgroups.push_back(std::move(sg));
  }
}

std::vector<std::uint16_t> Updater::master_high_halves(const Group& g) {
  if (!tiers_.states || !tiers_.states->split_master() || g.subgroups.empty()) return {};
  ZOE_CHECK(tiers_.params && cx_.dtype == DType::bf16 && tiers_.params->bytes(g.param_id) >=
                static_cast<std::size_t>(g.opt_numel) * sizeof(std::uint16_t),
            "split master weights: group ", g.name, " has no bf16 parameter shard of ", g.opt_numel, " elements");
  std::vector<std::uint16_t> shard((tiers_.params->bytes(g.param_id) + 1) / sizeof(std::uint16_t));
  tiers_.params->read(g.param_id, shard.data());
  return shard;
}

std::vector<float> Updater::master_range(Group& g) {
  std::vector<float> range(static_cast<std::size_t>(g.opt_numel));
  const std::vector<std::uint16_t> high = master_high_halves(g);
  for (const SubGroup& sg : g.subgroups) {
    if (sg.offloaded()) {
      tiers_.states->read_master(sg.offload_id, range.data() + sg.begin, high.empty() ? nullptr : high.data() + sg.begin);
    } else {
      cx_.device.copy(range.data() + sg.begin, sg.master(), static_cast<std::size_t>(sg.numel) * sizeof(float), *cx_.side);
    }
  }
  cx_.device.synchronize(*cx_.side);
  return range;
}

std::vector<float> Updater::read_states(Group& g) {
  const std::size_t n = static_cast<std::size_t>(g.opt_numel);
  std::vector<float> all(3 * n), sub;
  const std::vector<std::uint16_t> high = master_high_halves(g);
  for (const SubGroup& sg : g.subgroups) {
    const std::size_t len = static_cast<std::size_t>(sg.numel);
    sub.resize(3 * len);
    if (sg.offloaded()) {
      tiers_.states->read_all(sg.offload_id, sub.data(), high.empty() ? nullptr : high.data() + sg.begin);
    } else {
      cx_.device.copy(sub.data(), sg.device_states.data(), 3 * len * sizeof(float), *cx_.side);
      cx_.device.synchronize(*cx_.side);
    }
    for (std::size_t a = 0; a < 3; ++a) std::copy_n(sub.data() + a * len, len, all.data() + a * n + sg.begin);
  }
  return all;
}

void Updater::write_states(Group& g, const std::vector<float>& all) {
  const std::size_t n = static_cast<std::size_t>(g.opt_numel);
  std::vector<float> sub;
  for (const SubGroup& sg : g.subgroups) {
    const std::size_t len = static_cast<std::size_t>(sg.numel);
    sub.resize(3 * len);
    for (std::size_t a = 0; a < 3; ++a) std::copy_n(all.data() + a * n + sg.begin, len, sub.data() + a * len);
    if (sg.offloaded()) {
      tiers_.states->write_all(sg.offload_id, sub.data());
    } else {
      cx_.device.copy(sg.device_states.data(), sub.data(), 3 * len * sizeof(float), *cx_.side);
      cx_.device.synchronize(*cx_.side);
    }
  }
}

}  // namespace zoe::core
