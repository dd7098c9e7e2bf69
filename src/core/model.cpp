#include "src/core/model.hpp"

#include <algorithm>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::core {

void Model::check_complete() const {
  ZOE_CHECK_USAGE(!modules.empty(), "no modules registered: add_module before the first forward");
  std::vector<bool> used(params.size(), false);
  for (const ModuleInfo& m : modules)
    for (std::uint32_t pi : m.params) used[pi] = true;
  for (std::size_t pi = 0; pi < params.size(); ++pi)
    ZOE_CHECK_USAGE(used[pi], "parameter ", detail::quoted(params[pi].name), " is not used by any module");
}

void Model::build_groups(const StagePolicy& policy, int rank, int world, std::int64_t persistence_threshold) {
  // Each module owns the parameters it lists first; its group is their flat buffer. Its
  // frozen parameters form a second group (compute-dtype values only), made only when it has
  // some, so a model without frozen parameters has exactly one group per module.
  for (const ModuleInfo& m : modules) {
    Group trainable, frozen;
    trainable.name = m.name;
    frozen.name = m.name + " (frozen)";
    frozen.frozen = true;
    const int at = static_cast<int>(groups.size());
    for (std::uint32_t pi : m.params) {
      if (params[pi].group >= 0) continue;
      Group& g = params[pi].options.frozen ? frozen : trainable;
      params[pi].group = params[pi].options.frozen ? at + 1 : at;
      params[pi].slot = g.params.size();
      g.params.push_back(pi);
    }
    groups.push_back(std::move(trainable));
    if (!frozen.params.empty()) groups.push_back(std::move(frozen));
  }
  for (std::size_t mi = 0; mi < modules.size(); ++mi) {
    auto& gs = modules[mi].groups;
    for (std::uint32_t pi : modules[mi].params) gs.push_back(params[pi].group);
    std::sort(gs.begin(), gs.end());
    gs.erase(std::unique(gs.begin(), gs.end()), gs.end());
    for (int g : gs) groups[static_cast<std::size_t>(g)].users.push_back(static_cast<int>(mi));
  }
  for (Group& g : groups) {
    std::vector<std::int64_t> numels;
    for (std::uint32_t pi : g.params) numels.push_back(params[pi].numel);
    g.layout.emplace(numels, world);
    const FlatLayout& L = *g.layout;
    g.pending_users = static_cast<int>(g.users.size());
    g.persistent = policy.shards_params && L.live_numel() < persistence_threshold;
    g.opt_begin = policy.shards_optimizer ? L.shard_begin(rank) : 0;
    g.opt_numel = g.frozen ? 0 : policy.shards_optimizer ? L.shard_numel() : L.padded_numel();
  }
}

void Model::check_module(ModuleId m, const char* call) const {
  ZOE_CHECK_USAGE(m.index < modules.size(), call, ": unknown module id ", m.index, " (", modules.size(),
                  " modules registered)");
}

void Model::build_views(DType dtype) {
  for (int w = 0; w < 2; ++w) views_[w].assign(modules.size(), ModuleTensors{});
  sources_.clear();
  source_begin_.clear();
  source_begin_.reserve(modules.size() + 1);
  for (std::size_t mi = 0; mi < modules.size(); ++mi) {
    source_begin_.push_back(sources_.size());
    for (std::uint32_t pi : modules[mi].params) {
      const ParamInfo& p = params[pi];
      sources_.push_back(ViewSource{p.group, groups[static_cast<std::size_t>(p.group)].layout->offset(p.slot)});
      views_[0][mi].params.push_back(TensorView{nullptr, dtype, p.shape});
      views_[1][mi].params.push_back(TensorView{nullptr, dtype, p.shape});
      views_[1][mi].grads.push_back(TensorView{nullptr, dtype, p.shape});
    }
  }
  source_begin_.push_back(sources_.size());
}

const ModuleTensors& Model::views(int module, bool with_grads) {
  const auto m = static_cast<std::size_t>(module);
  ModuleTensors& t = views_[with_grads ? 1 : 0][m];
  const ViewSource* src = sources_.data() + source_begin_[m];
  for (std::size_t i = 0; i < t.params.size(); ++i) {
    const Group& g = groups[static_cast<std::size_t>(src[i].group)];
    t.params[i].data = g.param_full.at(src[i].offset);
    if (with_grads) t.grads[i].data = g.frozen ? nullptr : g.grad_full.at(src[i].offset);
  }
  return t;
}

std::vector<OptimRun> Model::option_runs(const Group& g, double default_weight_decay) const {
  const FlatLayout& L = *g.layout;
  std::vector<OptimRun> runs;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const ParamOptions& o = params[g.params[i]].options;
    const std::int64_t begin = i == 0 ? 0 : L.offset(i);
    const std::int64_t end = i + 1 < g.params.size() ? L.offset(i + 1) : L.padded_numel();
    OptimRun r{begin, end - begin, *o.weight_decay, o.lr_scale};
    if (!runs.empty() && runs.back().same_options(r)) {
      runs.back().numel += r.numel;
    } else if (r.numel > 0) {
      runs.push_back(r);
    }
  }
  // A group with no elements of its own still has its padding (zeros): the config's options.
  if (runs.empty()) runs.push_back(OptimRun{0, L.padded_numel(), default_weight_decay, 1.0});
  return runs;
}

}  // namespace zoe::core
