// Part (d) of zoe-offload-bench: construction (the first begin_forward: the tiers opened and
// every initial value computed and streamed to its homes) with the optimizer states and the
// bf16 parameters on NVMe, against the larger of its two halves measured alone in the same
// run: computing the initial values, and writing the same bytes through an NvmeStore.
// See construction_bench.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "bench/offload/report.hpp"
#include "zoe/config.hpp"

namespace zoe::bench {

struct ConstructionBenchOptions {
  /// Model elements, split evenly over `modules` modules of one parameter each.
  std::int64_t psi = 200'000'000;
  int modules = 8;
  std::int64_t sub_group_numel = 10'000'000;
  /// offload_optimizer.buffer_count and offload_param.buffer_count.
  int buffer_count = 4;
  /// Timed constructions per initializer (medians printed).
  int reps = 1;
  /// Existing directory for the NVMe files.
  std::string nvme_dir;
};

/// Runs the case with two initializers: "cheap" (a counter pattern, well under a nanosecond
/// per element: the store side alone) and "normal" (GPT-2's Box-Muller in double on the
/// calling thread, the trainer's cost without its OpenMP). Writes 18 * psi bytes per
/// construction (fp32 master + exp_avg + exp_avg_sq + fp32 gradient + bf16 parameter) and as
/// many for the write-alone bound. Throws what the Engine and NvmeStore throw.
void run_construction_case(const ConstructionBenchOptions& options, const Report& report);

}  // namespace zoe::bench
