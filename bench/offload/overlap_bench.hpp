// Part (b) of zoe-offload-bench: Engine::step() followed at once by the next forward, whose
// modules each wait only for their own groups' update (zoe.overlap_step), against step alone
// and forward alone. See overlap_bench.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "bench/offload/report.hpp"
#include "zoe/config.hpp"

namespace zoe::bench {

struct OverlapBenchOptions {
  /// Model elements, split evenly over `modules` modules of one parameter each.
  std::int64_t psi = 100'000'000;
  int modules = 16;
  /// zero_optimization.stage (1-3; world size 1).
  int stage = 3;
  std::int64_t sub_group_numel = 10'000'000;
  int buffer_count = 4;
  /// zoe.optimizer_threads (0 = all hardware threads).
  int threads = 0;
  int reps = 3;
  /// Length of the synthetic forward in ms; 0 = the measured step alone (the hardest case:
  /// equal lengths leave nothing to hide behind).
  double forward_ms = 0;
  std::string nvme_dir;
  /// One rank from the launcher's environment (RANK, WORLD_SIZE, ...: on a CUDA build with a
  /// GPU, the GPU) instead of one host-device rank in this process.
  bool launcher = false;
};

/// Runs one case on one rank (the host device, or the launcher's) with optimizer states on `tier`.
/// Throws what the Engine throws.
void run_overlap_case(const OverlapBenchOptions& options, OffloadDevice tier, const Report& report);

}  // namespace zoe::bench
