// Part (e) of zoe-offload-bench: the NVMe bytes a ZeRO-3 step moves per parameter, measured by
// /proc/self/io, against zoe-estimate's formula for the same config (RankEstimate::nvme_traffic).
// See nvme_bytes_bench.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "bench/offload/report.hpp"

namespace zoe::bench {

struct NvmeBytesBenchOptions {
  /// Model elements, split evenly over `modules` modules of one parameter each.
  std::int64_t psi = 40'000'000;
  int modules = 8;
  std::int64_t sub_group_numel = 10'000'000;
  /// gradient_accumulation_steps.
  int gas = 1;
  /// Measured steps (after one unmeasured first step: construction and the first forward).
  int reps = 3;
  /// zoe.host_memory_budget in bytes (0: every gradient on NVMe).
  std::int64_t host_memory_budget = 0;
  /// zoe.optimizer_threads (0 = all hardware threads).
  int threads = 0;
  std::string nvme_dir;
};

/// Runs the case on one host-device rank: stage 3, bf16, optimizer states and parameters on
/// NVMe under `nvme_dir`. Throws what the Engine throws.
void run_nvme_bytes_case(const NvmeBytesBenchOptions& options, const Report& report);

}  // namespace zoe::bench
