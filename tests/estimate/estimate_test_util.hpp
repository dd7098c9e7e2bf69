// Shared helpers of the estimate tests.
#pragma once

#include "src/config/estimate.hpp"

namespace zoe::estimate::testing {

/// The paper's setting (bf16/fp16 compute) at `stage` with the given offload devices.
inline Config knobs(int stage, OffloadDevice optimizer = OffloadDevice::none,
                    OffloadDevice param = OffloadDevice::none) {
  Config c = mixed_precision_knobs();
  c.zero_optimization.stage = stage;
  c.zero_optimization.offload_optimizer.device = optimizer;
  c.zero_optimization.offload_param.device = param;
  return c;
}

}  // namespace zoe::estimate::testing
