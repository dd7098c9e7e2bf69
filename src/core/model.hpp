// Model: the registry of one rank's engine: the parameters the trainer registered (by name),
// the optimizer parameter groups, the modules, and the flat-buffer groups the modules'
// parameters are partitioned into at build (each module owns the parameters it lists first;
// its frozen ones form a second group; consecutive small modules share one). The groups' buffers and states are filled in by the
// parts that own each concern (Gatherer, GradReducer, Updater); Model owns the containers.
// Not thread-safe: the thread that drives the Engine uses it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/group.hpp"
#include "src/config/stage_policy.hpp"
#include "zoe/engine.hpp"

namespace zoe::core {

struct Model {
  std::vector<ParamInfo> params;
  std::unordered_map<std::string, std::uint32_t> param_by_name;  // every registered name
  std::vector<std::string> param_groups;                          // add_param_group names, in order
  std::vector<ModuleInfo> modules;
  std::vector<Group> groups;  // empty until build

  /// Throws UsageError unless a build can start: some module registered, every parameter used
  /// by one. Changes nothing.
  void check_complete() const;
  /// The parameters each module owns (those it lists first), in registration order: its
  /// trainable ones (an entry for every module, maybe empty), then its frozen ones (an entry
  /// "<module> (frozen)" only when it has some). Before build_groups merges small ones, these
  /// are the groups; a checkpoint of format 1 was written in them.
  struct OwnGroup {
    std::string name;
    bool frozen = false;
    int module = -1;
    std::vector<std::uint32_t> params;
  };
  std::vector<OwnGroup> own_groups() const;
  /// Partitions the parameters into groups, the own_groups() except that a run of consecutive
  /// modules whose own trainable parameters are each under `share_below` elements shares one
  /// group while its total stays under it (named "<first> .. <last> (<k> modules)"; callers
  /// keep share_below <= persistence_threshold, so such a group is persistent at stage 3),
  /// and lays each out as a flat buffer padded for `world` ranks: sets every group's layout,
  /// users, persistence (stage 3, below `persistence_threshold` elements) and this rank's
  /// optimizer range. Buffers are not allocated here.
  void build_groups(const StagePolicy& policy, int rank, int world, std::int64_t persistence_threshold,
                    std::int64_t share_below);
  /// Throws UsageError for an unknown module id, naming `call` (the public call).
  void check_module(ModuleId m, const char* call) const;
  /// Builds the trainer's views of every module (shapes, `dtype`, where each parameter lies)
  /// once the groups are built; views() then only refreshes their data pointers.
  void build_views(DType dtype);
  /// The trainer's views of module `module`'s parameters (in the gathered full buffer) and,
  /// `with_grads`, of their gradient buffers (null for frozen parameters). Kept per module and
  /// direction and refreshed in place (only the data pointers change), so a call allocates
  /// nothing and the reference stays valid for the Model's life (its contents until the next
  /// call for the same module and direction). Needs build_views first.
  const ModuleTensors& views(int module, bool with_grads);
  /// Runs of equal optimizer options over the group's flat buffer [0, padded_numel): parameter
  /// i covers [offset(i), offset(i + 1)) (its padding with it), neighbours with equal options
  /// merged; an empty group is one run with the config's `default_weight_decay`.
  std::vector<OptimRun> option_runs(const Group& g, double default_weight_decay) const;
  int index_of(const Group& g) const { return static_cast<int>(&g - groups.data()); }
  Group& group(int gi) { return groups[static_cast<std::size_t>(gi)]; }
  const Group& group(int gi) const { return groups[static_cast<std::size_t>(gi)]; }

 private:
  // views()'s: the tensors handed out, per direction and module, and where each parameter of
  // each module lies (its group and element offset in it), so a refresh reads only the groups'
  // buffer pointers. The places are one array in module order (module m's from
  // source_begin_[m]): a pass walks it in order, which the hardware prefetcher follows (a
  // vector per module cost a cache miss per module and call at thousands of small modules).
  struct ViewSource {
    int group;
    std::int64_t offset;
  };
  std::vector<ModuleTensors> views_[2];  // [forward, backward][module]
  std::vector<ViewSource> sources_;
  std::vector<std::size_t> source_begin_;  // modules + 1 entries once built
};

}  // namespace zoe::core
