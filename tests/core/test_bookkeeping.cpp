// The per-call bookkeeping of stage 3 is O(1) amortised whatever the module count: the
// prefetch walk resumes where it stopped (TraceIndex), so over a step it visits each entry of
// the recorded order a bounded number of times. Counted, not timed: the entries the walk
// visited (test_hooks::prefetch_entries_visited) per begin_* call, at 100 and 4,000 modules,
// must stay below a small constant (measured: 1.0). A walk that restarts at the current
// position on every call (the old behaviour, tried by hand) visits 99.5 entries per call at 100
// modules and 3,999.5 at 4,000 with the default bucket, 81.6 and 3,250 with a bucket of four
// modules. And a persistent group keeps its gradient buffer from one step to the next (no
// allocation and free per module and step), counted in the bytes the rank holds.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/core/test_hooks.hpp"
#include "zoe/engine.hpp"

namespace {
using namespace zoe;

// `modules` modules of one parameter of 256 fp32 elements each.
std::vector<ModuleId> add_modules(Engine& e, int modules) {
  std::vector<ModuleId> ids;
  for (int i = 0; i < modules; ++i) {
    const ParamId p = e.add_parameter("w" + std::to_string(i), {256}, std::vector<float>(256, 0.5f));
    ids.push_back(e.add_module("m" + std::to_string(i), {p}));
  }
  return ids;
}

// Entries visited per begin_forward / begin_backward call over steps 2-3 (the order known).
double visits_per_call(int modules, std::int64_t prefetch_bucket) {
  Config c;
  c.zero_optimization.stage = 3;
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every module gathered and released
  c.zero_optimization.stage3_prefetch_bucket_size = prefetch_bucket;
  Engine e(c, make_local_ranks(1)[0]);
  const std::vector<ModuleId> ids = add_modules(e, modules);
  std::int64_t calls = 0, before = 0;
  for (int step = 0; step < 3; ++step) {
    if (step == 1) before = core::test_hooks::prefetch_entries_visited.load();
    for (ModuleId m : ids) ForwardScope f(e, m);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) BackwardScope b(e, *it);
    e.step();
    if (step >= 1) calls += 2 * modules;
  }
  return static_cast<double>(core::test_hooks::prefetch_entries_visited.load() - before) / static_cast<double>(calls);
}

TEST(Bookkeeping, PrefetchWalkIsConstantPerCallAtAnyModuleCount) {
  // Default prefetch bucket (the whole order fits in it) and a bucket of about four modules.
  for (std::int64_t bucket : {std::int64_t{50'000'000}, std::int64_t{1024}}) {
    const double small = visits_per_call(100, bucket), large = visits_per_call(4000, bucket);
    std::printf("prefetch bucket %lld: %.2f entries visited per call at 100 modules, %.2f at 4000\n",
                static_cast<long long>(bucket), small, large);
    EXPECT_LE(small, 4.0) << "bucket " << bucket;
    EXPECT_LE(large, 4.0) << "bucket " << bucket;
  }
}

// Device buffers held after each of three steps, `modules` modules of 256 fp32 elements,
// stage 3, one rank, the given persistence threshold.
std::vector<std::int64_t> buffers_after_steps(int modules, std::int64_t persistence_threshold, bool poison) {
  Config c;
  c.zero_optimization.stage = 3;
  c.zero_optimization.stage3_param_persistence_threshold = persistence_threshold;
  c.zoe.debug_poison = poison;
  Engine e(c, make_local_ranks(1)[0]);
  const std::vector<ModuleId> ids = add_modules(e, modules);
  std::vector<std::int64_t> held;
  for (int step = 0; step < 3; ++step) {
    for (ModuleId m : ids) ForwardScope f(e, m);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) BackwardScope b(e, *it);
    e.step();
    e.synchronize();
    held.push_back(e.memory_report().device_buffers);
  }
  return held;
}

TEST(Bookkeeping, PersistentGroupsKeepTheirGradientBuffers) {
  constexpr int kModules = 8;
  constexpr std::int64_t kBytes = kModules * 256 * 4;  // one fp32 buffer per module
  // Persistent (the default threshold, 100,000 elements): the gathered parameters and the
  // gradient buffers stay, the same bytes after every step.
  for (std::int64_t held : buffers_after_steps(kModules, 100'000, false)) EXPECT_EQ(held, 2 * kBytes);
  // Gathered and released per module (threshold 0): nothing held between steps.
  for (std::int64_t held : buffers_after_steps(kModules, 0, false)) EXPECT_EQ(held, 0);
  // zoe.debug_poison frees every released buffer, the persistent ones too.
  for (std::int64_t held : buffers_after_steps(kModules, 100'000, true)) EXPECT_EQ(held, 0);
}

}  // namespace
