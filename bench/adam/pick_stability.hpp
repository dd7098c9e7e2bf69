// zoe-adam-bench --pick-stability N: is CpuAdam's store pick (StorePolicy::measure) the same
// from one fresh process to the next? The bench runs itself N times with --pick-only; each child
// makes one fresh CpuAdam per case, steps until its pick is decided and prints the pick; the
// parent counts the picks per case.
#pragma once

#include <string>
#include <vector>

#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {

struct PickCases {
  std::vector<int> sizes_mi;  // element counts in Mi elements
  std::vector<int> threads;   // arena sizes
  std::vector<bool> bf16_out; // without / with the bf16 copy
  std::vector<optim::OptimizerStateDType> state_dtypes;  // storage of exp_avg / exp_avg_sq
};

/// Child side (--pick-only): one line per case on stdout,
/// "pick<TAB>case<TAB>stores<TAB>margin<TAB>best GB/s of each candidate".
void print_store_picks(const PickCases& cases);

/// Parent side: runs `self_args` (this binary and its options, ending in --pick-only) `processes`
/// times one after the other, then prints per case one line (JSON with `json`): the count of the
/// most frequent pick out of `processes`, every pick's count and the noise margins. Throws
/// std::runtime_error if a child fails.
void report_pick_stability(const std::vector<std::string>& self_args, int processes, bool json);

}  // namespace zoe::bench
