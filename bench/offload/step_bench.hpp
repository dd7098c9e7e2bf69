// Part (a) of zoe-offload-bench: the optimizer step over states in host memory or on NVMe,
// next to its parts measured alone in the same run. See step_bench.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "bench/offload/report.hpp"
#include "zoe/config.hpp"

namespace zoe::bench {

struct StepBenchOptions {
  /// Elements per group (one module's shard: the engine pipelines sub-groups within a group).
  std::int64_t group_numel = 100'000'000;
  /// Elements per sub-group (zero_optimization.sub_group_size; a multiple of 16).
  std::int64_t sub_group_numel = 10'000'000;
  /// offload_optimizer.buffer_count (pinned staging buffers of one sub-group: 16 bytes/element).
  int buffer_count = 4;
  /// CpuAdam threads (0 = all hardware threads, the engine's default).
  int threads = 0;
  /// Timed repetitions of (step, NVMe read+write alone, AdamW alone); medians are printed.
  int reps = 3;
  /// Existing directory for the NVMe tier's file (removed with the states).
  std::string nvme_dir;
  AioConfig aio;
};

/// Runs one case: `psi` elements of optimizer states on `tier` (cpu or nvme). Allocates
/// 16 * psi bytes of host memory for the cpu tier (master, exp_avg, exp_avg_sq, fp32
/// gradient; the nvme tier holds only its staging buffers), all freed on return.
/// Throws what OptimizerStates / CpuAdam throw (IoError, OutOfMemoryError, ...).
void run_step_case(const StepBenchOptions& options, OffloadDevice tier, std::int64_t psi, const Report& report);

}  // namespace zoe::bench
