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

std::vector<Model::OwnGroup> Model::own_groups() const {
  // Each module owns the parameters it lists first: its trainable ones, then (when it has
  // some) its frozen ones, "<module> (frozen)". Every module has a trainable entry, empty
  // when all its parameters are frozen or owned by an earlier module.
  std::vector<OwnGroup> out;
  std::vector<bool> owned(params.size(), false);
  for (std::size_t mi = 0; mi < modules.size(); ++mi) {
    const ModuleInfo& m = modules[mi];
    OwnGroup trainable{m.name, false, static_cast<int>(mi), {}}, frozen{m.name + " (frozen)", true, static_cast<int>(mi), {}};
    for (std::uint32_t pi : m.params) {
      if (owned[pi]) continue;
      owned[pi] = true;
      (params[pi].options.frozen ? frozen : trainable).params.push_back(pi);
    }
    out.push_back(std::move(trainable));
    if (!frozen.params.empty()) out.push_back(std::move(frozen));
  }
  return out;
}

void Model::build_groups(const StagePolicy& policy, int rank, int world, std::int64_t persistence_threshold,
                         std::int64_t share_below) {
  // The modules' own groups (own_groups), except that consecutive small ones share one: a run
  // of modules, in registration order, whose own trainable parameters are each fewer than
  // `share_below` elements shares one flat buffer while the total stays below it
  // (FSDP's size-based wrapping: small modules fold into one unit). Such a group is one unit
  // of every per-group cost (a gather, a reduction, a sub-group's update, a norm piece), so a
  // step over thousands of tiny modules costs about what one module of their size does; at
  // stage 3 it stays below the persistence threshold (share_below is not above it), so it is
  // persistent as each of its modules was.
  // The same at every stage, so stages agree bit for bit (the norm sums per group).
  const std::vector<OwnGroup> own = own_groups();
  // The run of small modules sharing the last trainable group, if that group is shared.
  struct SharingRun {
    int group = -1;  // -1: the last trainable group takes no more modules
    std::int64_t live = 0;
    int first_module = -1, last_module = -1, modules = 0;
  } run;
  auto close_run = [&] {
    if (run.modules > 1)
      groups[static_cast<std::size_t>(run.group)].name =
          detail::concat(modules[static_cast<std::size_t>(run.first_module)].name, " .. ",
                         modules[static_cast<std::size_t>(run.last_module)].name, " (", run.modules, " modules)");
    run = SharingRun{};
  };
  for (const OwnGroup& o : own) {
    std::int64_t live = 0;
    for (std::uint32_t pi : o.params) live += params[pi].numel;
    const bool small = !o.frozen && !o.params.empty() && live < share_below;
    if (!small || run.group < 0 || run.live + live >= share_below) {
      if (!o.frozen) close_run();  // (a frozen group between small modules does not end their run)
      Group g;
      g.name = o.name;
      g.frozen = o.frozen;
      groups.push_back(std::move(g));
      if (small) run = SharingRun{static_cast<int>(groups.size()) - 1, 0, o.module, o.module, 0};
    }
    const int gi = small ? run.group : static_cast<int>(groups.size()) - 1;
    if (small) {
      run.live += live;
      run.last_module = o.module;
      ++run.modules;
    }
    Group& g = groups[static_cast<std::size_t>(gi)];
    for (std::uint32_t pi : o.params) {
      params[pi].group = gi;
      params[pi].slot = g.params.size();
      g.params.push_back(pi);
    }
  }
  close_run();
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
