// zoe-module-count-bench: the engine's own bookkeeping per call as the module count grows.
// ZeRO-3, fp32, default config otherwise, modules of 256 elements, no compute: a pass is
// begin_forward/end_forward of every module, then begin_backward/end_backward in reverse, then
// step(). Reported per module count: microseconds per forward call pair and per backward call
// pair (median of the timed steps, at least 64,000 module calls per case, after one step that
// records the order prefetch follows),
// and the ratio to the smallest count (1.0 = flat: O(1) per call). A second case runs the same
// step at world 2 for n modules against one module holding all n x 256 elements.
// Usage: zoe-module-count-bench [--json] [--counts 100,1000,4000,16000] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "zoe/engine.hpp"

using namespace zoe;
using Clock = std::chrono::steady_clock;

namespace {

struct PassTimes {
  double forward_us = 0, backward_us = 0, step_ms = 0;  // per call pair (fw, bw), per step
};

Config bench_config(int world) {
  Config c;
  c.zero_optimization.stage = 3;
  c.train_batch_size = world;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = 1;
  c.zoe.optimizer_threads = 1;
  return c;
}

// Timed passes of a case: at least this many module calls per case, so a pass over 100
// modules (half a millisecond) is not one timer reading among the machine's noise.
constexpr int kMinModulesTimed = 64000;

// The timed passes for `modules` modules: at least `steps`, and at least kMinModulesTimed calls.
int passes_for(int modules, int steps) { return std::max(steps, (kMinModulesTimed + modules - 1) / modules); }

// Runs `steps` + 1 passes over `modules` modules of `elements` each on every rank; returns
// rank 0's median per-call times of all passes but the first.
PassTimes run(int world, int modules, std::int64_t elements, int steps) {
  std::vector<RankContext> ranks = make_local_ranks(world, 600.0);
  std::vector<PassTimes> per_rank(static_cast<std::size_t>(world));
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(bench_config(world), ctx);
    std::vector<ModuleId> ids;
    for (int m = 0; m < modules; ++m) {
      const std::string name = "m" + std::to_string(m);
      ParamId p = e.add_parameter(name + ".w", {elements}, [](std::int64_t, std::span<float> out) {
        std::fill(out.begin(), out.end(), 0.5f);
      });
      ids.push_back(e.add_module(name, {p}));
    }
    std::vector<double> fw, bw, st;
    for (int s = 0; s <= steps; ++s) {
      const auto t0 = Clock::now();
      for (ModuleId m : ids) {
        e.begin_forward(m);
        e.end_forward(m);
      }
      const auto t1 = Clock::now();
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        e.begin_backward(*it);
        e.end_backward(*it);
      }
      const auto t2 = Clock::now();
      e.step();
      const auto t3 = Clock::now();
      if (s == 0) continue;  // the first step records the order
      using us = std::chrono::duration<double, std::micro>;
      fw.push_back(us(t1 - t0).count() / modules);
      bw.push_back(us(t2 - t1).count() / modules);
      st.push_back(us(t3 - t0).count() / 1000.0);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    per_rank[static_cast<std::size_t>(ctx.rank)] = PassTimes{median(fw), median(bw), median(st)};
  });
  return per_rank[0];
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<int> counts = {100, 1000, 4000, 16000};
  int steps = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--counts") && i + 1 < argc) {
      counts.clear();
      std::stringstream in(argv[++i]);
      for (std::string item; std::getline(in, item, ',');) counts.push_back(std::stoi(item));
    } else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--counts N,N,...] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  constexpr std::int64_t kElements = 256;
  PassTimes first{};
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const PassTimes t = run(1, counts[k], kElements, passes_for(counts[k], steps));
    if (k == 0) first = t;
    const double rf = t.forward_us / first.forward_us, rb = t.backward_us / first.backward_us;
    if (json) {
      std::printf("{\"bench\":\"module_count\",\"case\":\"forward_per_module_%d\",\"value\":%.3f,\"unit\":\"us\","
                  "\"baseline\":%.3f,\"ratio\":%.3f}\n", counts[k], t.forward_us, first.forward_us, rf);
      std::printf("{\"bench\":\"module_count\",\"case\":\"backward_per_module_%d\",\"value\":%.3f,\"unit\":\"us\","
                  "\"baseline\":%.3f,\"ratio\":%.3f}\n", counts[k], t.backward_us, first.backward_us, rb);
    } else {
      std::printf("%6d modules: forward %.3f us, backward %.3f us per module (x%.2f, x%.2f of %d modules); step %.1f ms\n",
                  counts[k], t.forward_us, t.backward_us, rf, rb, counts.front(), t.step_ms);
    }
  }
  // World 2: many small modules against one module of the same elements.
  const int many = counts.size() > 2 ? counts[2] : counts.back();
  // Both with the passes of the many-module case (one module of all the elements is no
  // shorter a pass).
  const PassTimes small = run(2, many, kElements, passes_for(many, steps));
  const PassTimes one = run(2, 1, many * kElements, passes_for(many, steps));
  if (json) {
    std::printf("{\"bench\":\"module_count\",\"case\":\"world2_step_%d_modules\",\"value\":%.3f,\"unit\":\"ms\","
                "\"baseline\":%.3f,\"ratio\":%.3f}\n", many, small.step_ms, one.step_ms, small.step_ms / one.step_ms);
  } else {
    std::printf("world 2: %d modules of %lld elements: step %.2f ms (forward %.3f us, backward %.3f us per module); one module "
                "of %lld: %.2f ms; ratio %.2f\n", many, static_cast<long long>(kElements), small.step_ms, small.forward_us,
                small.backward_us, static_cast<long long>(many * kElements), one.step_ms, small.step_ms / one.step_ms);
  }
  return 0;
}
