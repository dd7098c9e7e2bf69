// ParamInitializer: how a parameter's initial value reaches the Engine (see
// Engine::add_parameter), and what a SafetensorsFile hands out. Its own header so that code
// producing initial values needs nothing of the Engine; zoe/engine.hpp includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

namespace zoe {

/// Produces part of a parameter's initial value: fills `out` with elements
/// [offset, offset + out.size()) of the parameter's flattened row-major fp32 value (offset in
/// elements, 0 <= offset, offset + out.size() <= numel; out is host memory). It must give the
/// same values for the same elements whatever the chunking and on every rank (a pure function
/// of the element index, e.g. a counter-based hash or a seeded generator skipped to `offset`).
/// The Engine calls it only during its first forward (or the first call that needs the
/// parameters: begin_backward, step, gather_parameter, checkpoints), only from the thread
/// driving the Engine, with at most zero_optimization.sub_group_size elements per call, and
/// only for the elements this rank keeps (DeepSpeed's zero.Init): with stage 3 exactly the
/// live elements of its shard, with stages 0-2 the whole parameter (those stages keep full
/// compute-dtype parameters). It may throw; see Engine::add_parameter.
using ParamInitializer = std::function<void(std::int64_t offset, std::span<float> out)>;

}  // namespace zoe
