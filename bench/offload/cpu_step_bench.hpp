// Part (c) of zoe-offload-bench: the whole CPU step of ZeRO-Offload with host-memory states,
// against the bound of the bytes it moves, measured in the same run. See cpu_step_bench.cpp.
#pragma once

#include <cstdint>

#include "bench/offload/report.hpp"

namespace zoe::bench {

struct CpuStepBenchOptions {
  /// Model elements (this rank's shard), cut into sub-groups of sub_group_numel (a multiple of 16).
  std::int64_t psi = 100'000'000;
  std::int64_t sub_group_numel = 10'000'000;
  /// CpuAdam threads (0 = all hardware threads).
  int threads = 0;
  /// Timed repetitions (each runs every variant and bound pass once, order rotated).
  int reps = 5;
  /// With threads == 1: time by the calling thread's CPU clock (every pass then runs on it),
  /// leaving out time a loaded machine gave to other processes. Else the wall clock.
  bool thread_cpu = false;
};

/// Runs the case. Allocates about 38 bytes per element of host memory (two copies of the fp32
/// states and gradient, one bf16 gradient and one bf16 weight copy), freed on return.
/// Throws what OptimizerStates / CpuAdam throw.
void run_cpu_step_case(const CpuStepBenchOptions& options, const Report& report);

}  // namespace zoe::bench
