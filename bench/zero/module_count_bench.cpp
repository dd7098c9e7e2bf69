// zoe-module-count-bench: the engine's own bookkeeping per call as the module count grows.
// ZeRO-3, fp32, default config otherwise, modules of 256 elements, no compute: a pass is
// begin_forward/end_forward of every module, then begin_backward/end_backward in reverse, then
// step(). Reported per module count: microseconds per forward call pair and per backward call
// pair (median of the timed steps, at least 64,000 module calls per case, after one step that
// records the order prefetch follows),
// and the ratio to the smallest count (1.0 = flat: O(1) per call). A second case runs the same
// step at world 2 for n modules against one module holding all n x 256 elements: with the
// default config (the small modules share groups, zoe.small_module_threshold) and with a group
// per module ("_own_groups": threshold 0).
// Each figure is taken in --rounds rounds (default 5), every case once per round, and reported
// as the median value and the median (least, greatest) of its per-round ratios. The world-2
// case reports the step's wall time and its CPU time (every thread of the process: both ranks'
// engine and stream threads), whose ratio the machine's other load moves less.
// Usage: zoe-module-count-bench [--json] [--counts 100,1000,4000,16000] [--steps N] [--rounds N]
#include <time.h>

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
  double step_cpu_ms = 0;  // the process's CPU time per step (all threads)
};

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

// share_below: zoe.small_module_threshold (the default: small modules share groups; 0: a group
// per module).
Config bench_config(int world, std::int64_t share_below) {
  Config c;
  c.zoe.small_module_threshold = share_below;
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

// Timed world-2 steps per case and round, at least (see main).
constexpr int kWorld2Steps = 100;

// The timed passes for `modules` modules: at least `steps`, and at least kMinModulesTimed calls.
int passes_for(int modules, int steps) { return std::max(steps, (kMinModulesTimed + modules - 1) / modules); }

// Median of `v` (v not empty).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `steps` + 1 passes over `modules` modules of `elements` each on every rank; returns
// rank 0's median per-call times of all passes but the first.
PassTimes run(int world, int modules, std::int64_t elements, int steps, std::int64_t share_below = ZoeConfig{}.small_module_threshold) {
  std::vector<RankContext> ranks = make_local_ranks(world, 600.0);
  std::vector<PassTimes> per_rank(static_cast<std::size_t>(world));
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(bench_config(world, share_below), ctx);
    std::vector<ModuleId> ids;
    for (int m = 0; m < modules; ++m) {
      const std::string name = "m" + std::to_string(m);
      ParamId p = e.add_parameter(name + ".w", {elements}, [](std::int64_t, std::span<float> out) {
        std::fill(out.begin(), out.end(), 0.5f);
      });
      ids.push_back(e.add_module(name, {p}));
    }
    std::vector<double> fw, bw, st, cpu;
    for (int s = 0; s <= steps; ++s) {
      const double c0 = process_cpu_ms();
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
      const double c3 = process_cpu_ms();
      if (s == 0) continue;  // the first step records the order
      using us = std::chrono::duration<double, std::micro>;
      fw.push_back(us(t1 - t0).count() / modules);
      bw.push_back(us(t2 - t1).count() / modules);
      st.push_back(us(t3 - t0).count() / 1000.0);
      cpu.push_back(c3 - c0);
    }
    per_rank[static_cast<std::size_t>(ctx.rank)] = PassTimes{median(fw), median(bw), median(st), median(cpu)};
  });
  return per_rank[0];
}

// One figure over the rounds: the median value and, against the baseline of the same round,
// the median, least and greatest ratio.
struct Paired {
  std::vector<double> values, baselines, ratios;
  void add(double value, double baseline) {
    values.push_back(value);
    baselines.push_back(baseline);
    ratios.push_back(value / baseline);
  }
};

void print(bool json, const char* name, const char* unit, const Paired& p) {
  const auto [lo, hi] = std::minmax_element(p.ratios.begin(), p.ratios.end());
  if (json) {
    std::printf("{\"bench\":\"module_count\",\"case\":\"%s\",\"value\":%.3f,\"unit\":\"%s\",\"baseline\":%.3f,"
                "\"ratio\":%.3f,\"ratio_min\":%.3f,\"ratio_max\":%.3f,\"rounds\":%zu}\n",
                name, median(p.values), unit, median(p.baselines), median(p.ratios), *lo, *hi, p.ratios.size());
  } else {
    std::printf("%-39s %9.3f %s (baseline %.3f): ratio x%.2f (x%.2f-%.2f over %zu rounds)\n", name, median(p.values), unit,
                median(p.baselines), median(p.ratios), *lo, *hi, p.ratios.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<int> counts = {100, 1000, 4000, 16000};
  int steps = 3, rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--counts") && i + 1 < argc) {
      counts.clear();
      std::stringstream in(argv[++i]);
      for (std::string item; std::getline(in, item, ',');) counts.push_back(std::stoi(item));
    } else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::max(1, std::stoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--counts N,N,...] [--steps N] [--rounds N]\n", argv[0]);
      return 2;
    }
  }
  constexpr std::int64_t kElements = 256;
  // World 2: many small modules against one module of the same elements, both with the passes
  // of the many-module case (one module of all the elements is no shorter a pass).
  const int many = counts.size() > 2 ? counts[2] : counts.back();
  // Rounds: every case once per round, each ratio against its baseline of the same round (the
  // machine's speed drifts between rounds; a ratio of neighbours holds), medians reported.
  std::vector<Paired> forward(counts.size()), backward(counts.size());
  // A world-2 step takes 1-4 ms: at least kWorld2Steps of them per case and round, so a round's
  // median is not a handful of steps that a burst of the machine's other load can move.
  const int world2_steps = std::max(passes_for(many, steps), kWorld2Steps);
  Paired world2, world2_cpu, world2_own, world2_own_cpu;
  for (int r = 0; r < rounds; ++r) {
    std::vector<PassTimes> t;
    for (int c : counts) t.push_back(run(1, c, kElements, passes_for(c, steps)));
    for (std::size_t k = 0; k < counts.size(); ++k) {
      forward[k].add(t[k].forward_us, t[0].forward_us);
      backward[k].add(t[k].backward_us, t[0].backward_us);
    }
    const PassTimes small = run(2, many, kElements, world2_steps);
    const PassTimes one = run(2, 1, many * kElements, world2_steps);
    world2.add(small.step_ms, one.step_ms);
    world2_cpu.add(small.step_cpu_ms, one.step_cpu_ms);
    const PassTimes own = run(2, many, kElements, world2_steps, 0);
    world2_own.add(own.step_ms, one.step_ms);
    world2_own_cpu.add(own.step_cpu_ms, one.step_cpu_ms);
  }
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const std::string f = "forward_per_module_" + std::to_string(counts[k]);
    const std::string b = "backward_per_module_" + std::to_string(counts[k]);
    print(json, f.c_str(), "us", forward[k]);
    print(json, b.c_str(), "us", backward[k]);
  }
  const std::string w = "world2_step_" + std::to_string(many) + "_modules";
  print(json, w.c_str(), "ms", world2);
  const std::string wc = "world2_step_cpu_" + std::to_string(many) + "_modules";
  print(json, wc.c_str(), "ms", world2_cpu);
  print(json, (w + "_own_groups").c_str(), "ms", world2_own);
  print(json, (wc + "_own_groups").c_str(), "ms", world2_own_cpu);
  return 0;
}
