// Where a checkpoint's values lie for this engine's groups, parameter by parameter.
//
// A checkpoint stores each group of the engine that saved it (manifest.json lists the groups,
// their parameters and offsets). Which modules share a group depends on the config
// (zoe.small_module_threshold, stage3_param_persistence_threshold) and a format-1 checkpoint
// was written with one group per module, so the loading engine's groups may cut the same
// parameters differently. ParamMap finds every parameter of the engine (by name) in the saved
// groups, and reads a range of an engine group's flat buffer from wherever its parameters were
// saved; padding reads as zero. A group saved exactly as the engine has it (the same
// parameters at the same offsets) is read in one piece, as before.
//
// Not thread-safe (one per load). Errors: UsageError when the checkpoint is of another model
// (a parameter missing there or here, another shape), naming the parameter.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"
#include "src/core/model.hpp"

namespace zoe::ckpt {

class ParamMap {
 public:
  /// Maps every parameter of `model` into `saved`'s groups; `what` starts the errors
  /// ("checkpoint '<path>'"). Throws UsageError for another model.
  ParamMap(const core::Model& model, const Manifest& saved, const std::string& what);

  /// Fills `out` with state `state` (as CheckpointReader::read) of flat elements [begin, begin +
  /// out.size()) of the engine's group `gi`, read through `reader` (of the mapped manifest).
  void read(CheckpointReader& reader, std::size_t gi, int state, std::int64_t begin, std::span<float> out, int prefer) const;
  /// The (saved group, rank file) pairs holding some of [begin, end) of the engine's group gi.
  std::set<std::pair<std::size_t, int>> sources(const CheckpointReader& reader, std::size_t gi, std::int64_t begin,
                                                std::int64_t end, int prefer) const;

 private:
  /// A parameter's elements: [begin, begin + numel) of the engine group, from `saved_begin` of
  /// saved group `saved_group`.
  struct Piece {
    std::int64_t begin, numel;
    std::size_t saved_group;
    std::int64_t saved_begin;
  };
  /// Per engine group: the saved group it equals (same parameters, same offsets), or -1 and
  /// its pieces in ascending order.
  struct GroupMap {
    long same_as = -1;
    std::vector<Piece> pieces;
  };
  std::vector<GroupMap> groups_;
};

}  // namespace zoe::ckpt
