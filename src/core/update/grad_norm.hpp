// The step's gradient statistics (see grad_norm.cpp).
#pragma once

#include "src/core/engine_context.hpp"
#include "src/core/model.hpp"
#include "src/core/offload_tiers.hpp"
#include "src/core/update/updater.hpp"

namespace zoe::core {

/// The global gradient statistics of a step, the same on every rank.
struct GradStats {
  double sum_squares = 0.0;  // of the reduced gradients, before any scaling (fp64)
  double nonfinite = 0.0;    // offloaded pieces holding an inf or NaN, over all ranks (the
                             // device's show in sum_squares: inf or NaN)
};

/// Sums of squares of every trainable group's reduced gradient, and the offloaded pieces' finite
/// flags; an inf or NaN anywhere makes sum_squares non-finite or nonfinite > 0 (waits for
/// the side stream and the gradient sink; one all-reduce at stages 1-3). Rethrows an error of
/// the side stream's work.
GradStats measure_gradients(EngineContext& cx, const Model& model, Updater& updater, OffloadTiers& tiers);

}  // namespace zoe::core
