// Sub-groups: where each part of a rank's optimizer states lives (device memory for the
// device optimizer, or the offload tier for the CPU optimizer), and reading / writing them as
// host arrays (gather_parameter and checkpoints; not on the training path: they synchronize).
#include <algorithm>
#include <cmath>
#include <span>

#include "src/core/engine_impl.hpp"

namespace zoe::core {

int EngineImpl::device_sub_group_count() const {
  std::int64_t total = 0;
  for (const Group& g : groups) total += (g.opt_numel + sub_group_numel() - 1) / sub_group_numel();
  if (!states) return static_cast<int>(total);
  // offload_optimizer.ratio of the sub-groups (rounded up) go to the CPU optimizer: the last
  // ones in forward order, so the next forward's first modules wait only for the fast
  // device updates while the CPU works on the last modules.
  const auto host = static_cast<std::int64_t>(std::ceil(config.zero_optimization.offload_optimizer.ratio *
                                                        static_cast<double>(total)));
  return static_cast<int>(total - std::min(total, host));
}

void EngineImpl::place_sub_groups(Group& g, int& device_left) {
  const std::vector<OptimRun> flat = option_runs(g);  // over the whole flat buffer
  for (std::int64_t c = 0; c < g.opt_numel; c += sub_group_numel()) {
    SubGroup sg;
    sg.begin = c;
    sg.numel = std::min(sub_group_numel(), g.opt_numel - c);
    // The sub-group's part of each run, relative to its first element.
    const std::int64_t a = g.opt_begin + c, b = a + sg.numel;
    for (const OptimRun& r : flat) {
      const std::int64_t lo = std::max(a, r.begin), hi = std::min(b, r.begin + r.numel);
      if (lo < hi) sg.runs.push_back(OptimRun{lo - a, hi - lo, r.weight_decay, r.lr_scale});
    }
    if (device_left > 0) {
      --device_left;
      sg.device_states = alloc(MemKind::model_state, DType::f32, 3 * sg.numel);
    } else {
      sg.offload_id = states->add(sg.numel);
    }
    g.subgroups.push_back(std::move(sg));
  }
}

std::vector<float> EngineImpl::master_range(Group& g) {
  std::vector<float> range(static_cast<std::size_t>(g.opt_numel));
  for (const SubGroup& sg : g.subgroups) {
    if (sg.offloaded()) {
      states->read_master(sg.offload_id, range.data() + sg.begin);
    } else {
      device.copy(range.data() + sg.begin, sg.master(), static_cast<std::size_t>(sg.numel) * sizeof(float), *side);
    }
  }
  device.synchronize(*side);
  return range;
}

std::vector<float> EngineImpl::read_states(Group& g) {
  const std::size_t n = static_cast<std::size_t>(g.opt_numel);
  std::vector<float> all(3 * n), sub;
  for (const SubGroup& sg : g.subgroups) {
    const std::size_t len = static_cast<std::size_t>(sg.numel);
    sub.resize(3 * len);
    if (sg.offloaded()) {
      states->read_all(sg.offload_id, sub.data());
    } else {
      device.copy(sub.data(), sg.device_states.data(), 3 * len * sizeof(float), *side);
      device.synchronize(*side);
    }
    for (std::size_t a = 0; a < 3; ++a) std::copy_n(sub.data() + a * len, len, all.data() + a * n + sg.begin);
  }
  return all;
}

void EngineImpl::write_states(Group& g, const std::vector<float>& all) {
  const std::size_t n = static_cast<std::size_t>(g.opt_numel);
  std::vector<float> sub;
  for (const SubGroup& sg : g.subgroups) {
    const std::size_t len = static_cast<std::size_t>(sg.numel);
    sub.resize(3 * len);
    for (std::size_t a = 0; a < 3; ++a) std::copy_n(all.data() + a * n + sg.begin, len, sub.data() + a * len);
    if (sg.offloaded()) {
      states->write_all(sg.offload_id, sub.data());
    } else {
      device.copy(sg.device_states.data(), sub.data(), 3 * len * sizeof(float), *side);
      device.synchronize(*side);
    }
  }
}

}  // namespace zoe::core
