// The model the engine-level cases of zoe-offload-bench train: `count` modules of one
// parameter of `per_module` fp32 elements each ("m<i>.w" in module "m<i>"), every parameter
// starting from the same deterministic values. Not thread-safe: the thread that drives `e`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zoe/engine.hpp"

namespace zoe::bench {

/// Registers the modules; returns their ids in order.
inline std::vector<ModuleId> add_bench_modules(Engine& e, std::int64_t per_module, int count) {
  std::vector<float> initial(static_cast<std::size_t>(per_module));
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
  std::vector<ModuleId> modules;
  for (int m = 0; m < count; ++m) {
    ParamId p = e.add_parameter("m" + std::to_string(m) + ".w", {per_module}, initial);
    modules.push_back(e.add_module("m" + std::to_string(m), {p}));
  }
  return modules;
}

}  // namespace zoe::bench
