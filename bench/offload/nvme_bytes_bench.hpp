// Part (e) of zoe-offload-bench: the NVMe bytes a ZeRO-3 step moves per parameter in each mode
// (everything on NVMe as ZeRO-Infinity; zoe.host_memory_budget keeping the parameter shards and
// the gradients in host memory; the update in backward, whose gradients wait in a few host
// buffers; that with the shards in host memory, and with bf16 optimizer states), measured by /proc/self/io against zoe-estimate's formula for the same config
// (RankEstimate::nvme_traffic), and each mode's step time against the first mode's, steps
// taken in turn in one run. See nvme_bytes_bench.cpp.
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
  /// zoe.host_memory_budget in bytes of the modes that have one (0: theirs, 2 bytes per
  /// parameter for the parameter shards, 4 for the shards and the gradients).
  std::int64_t host_memory_budget = 0;
  /// zoe.optimizer_threads (0 = all hardware threads).
  int threads = 0;
  std::string nvme_dir;
};

/// Runs the case on one host-device rank per mode, all alive at once, their steps taken in turn:
/// stage 3, bf16, optimizer states and parameters on NVMe under `nvme_dir`. Throws what the
/// Engine throws.
void run_nvme_bytes_case(const NvmeBytesBenchOptions& options, const Report& report);

}  // namespace zoe::bench
