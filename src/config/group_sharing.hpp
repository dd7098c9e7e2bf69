// Which modules share a flat group, as the engine builds them (Model::build_groups) and the
// memory estimate sizes them (src/config/estimate.cpp): one rule, here, beside the Config it
// reads, so the two cannot drift apart.
#pragma once

#include <algorithm>
#include <cstdint>

#include "zoe/config.hpp"

namespace zoe {

/// Elements: consecutive modules each owning fewer trainable elements than this share a group
/// while their total stays below it. min(zoe.small_module_threshold,
/// stage3_param_persistence_threshold), so a shared group is persistent at stage 3 as its
/// modules were; 0 under zoe.debug_poison (a module's gradient view is poisoned only when its
/// whole group is reduced, so each module keeps a group of its own there). Pure; thread-safe.
inline std::int64_t small_module_share_below(const Config& c) {
  if (c.zoe.debug_poison) return 0;
  return std::min(c.zoe.small_module_threshold, c.zero_optimization.stage3_param_persistence_threshold);
}

}  // namespace zoe
