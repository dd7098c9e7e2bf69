// zoe-adam-bench: CpuAdam::step (AdamW, fp32 grads, optional bf16 weight copy) for N = 16M and
// 128M elements on 1 and 2 threads. Next to each timed step (after it; before it on odd steps)
// the same process runs the STREAM-style bound of that access pattern (4 fp32 reads + 3 writes, both with ordinary and with
// non-temporal stores; the faster one is the bound) and a plain -O3 Adam loop. Prints the median
// over the steps of: params/s, GB/s, bound GB/s, achieved / bound, and speed-up over the plain loop.
// --json: one JSON object per line {"bench","case","value","unit","bound","ratio"}.
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/adam/bench_loops.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/optim/cpu_adam.hpp"

namespace {

using zoe::AlignedBuffer;
using zoe::DType;
using zoe::optim::AdamHyper;
using zoe::optim::CpuAdam;

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

struct Arrays {
  explicit Arrays(std::size_t n)
      : pb(n * 4), mb(n * 4), vb(n * 4), gb(n * 4), ob(n * 2),
        p(pb.as<float>().data()), m(mb.as<float>().data()), v(vb.as<float>().data()), g(gb.as<float>().data()),
        out(ob.as<std::uint16_t>().data()) {
    for (std::size_t i = 0; i < n; ++i) {  // first touch; moderate values, no denormals
      p[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
      m[i] = 0.0f;
      v[i] = 0.0f;
      g[i] = (static_cast<float>(i % 997) - 498.0f) * 1e-3f + 1e-4f;
      out[i] = 0;
    }
  }
  AlignedBuffer pb, mb, vb, gb, ob;  // >= 2 MiB: 2 MiB aligned, MADV_HUGEPAGE
  float *p, *m, *v, *g;
  std::uint16_t* out;
};

struct Options {
  std::vector<int> sizes_mi{16, 128};
  std::vector<int> threads{1, 2};
  int steps = 10;
  bool json = false;
};

void json_line(const std::string& case_name, double value, const std::string& unit, double bound, double ratio) {
  const nlohmann::json j{{"bench", "adam"}, {"case", case_name}, {"value", value}, {"unit", unit},
                         {"bound", bound},  {"ratio", ratio}};
  std::printf("%s\n", j.dump().c_str());
}

void run_case(const Options& o, Arrays& a, std::size_t n, int size_mi, int threads, bool bf16_out, std::int64_t& t) {
  CpuAdam adam(threads);
  tbb::task_arena arena(threads);
  AdamHyper h;
  h.weight_decay = 0.01;
  std::uint16_t* out = bf16_out ? a.out : nullptr;
  const double adam_bytes = static_cast<double>(n) * (28 + (bf16_out ? 2 : 0));
  const double bound_bytes = static_cast<double>(n) * 28;
  auto adam_step = [&] { adam.step(h, ++t, 1.0f, a.p, a.m, a.v, a.g, DType::f32, n, out, DType::bf16); };
  // Warm-up: starts the arena's threads and faults nothing new (arrays are touched).
  adam_step();
  zoe::bench::stream_bound_pass(arena, a.p, a.m, a.v, a.g, n, true);
  std::vector<double> gbps, bound_gbps, ratio, plain_speedup, plain_params;
  for (int s = 0; s < o.steps; ++s) {
    // Odd steps run the bound first, so neither side always inherits the other's cache state.
    auto bound_pass = [&](bool nt) {
      return seconds([&] { zoe::bench::stream_bound_pass(arena, a.p, a.m, a.v, a.g, n, nt); });
    };
    double ta, tb_reg, tb_nt;
    if (s % 2 == 0) {
      ta = seconds(adam_step);
      tb_reg = bound_pass(false);
      tb_nt = bound_pass(true);
    } else {
      tb_reg = bound_pass(false);
      tb_nt = bound_pass(true);
      ta = seconds(adam_step);
    }
    const double tp = seconds([&] { zoe::bench::plain_adam_pass(arena, ++t, a.p, a.m, a.v, a.g, out, n); });
    const double tb = std::min(tb_reg, tb_nt);
    gbps.push_back(adam_bytes / ta / 1e9);
    bound_gbps.push_back(bound_bytes / tb / 1e9);
    ratio.push_back(gbps.back() / bound_gbps.back());
    plain_speedup.push_back(tp / ta);
    plain_params.push_back(static_cast<double>(n) / tp);
  }
  const double bytes_per_param = adam_bytes / static_cast<double>(n);
  const double gb = median(gbps), bound = median(bound_gbps), r = median(ratio), sp = median(plain_speedup);
  const double params = gb * 1e9 / bytes_per_param, bound_params = bound * 1e9 / bytes_per_param;
  const std::string name = "N=" + std::to_string(size_mi) + "M threads=" + std::to_string(threads) +
                           (bf16_out ? " out=fp32+bf16" : " out=fp32") + " isa=" + std::string(zoe::optim::isa_name(adam.isa()));
  if (o.json) {
    // "ratio" is the median of the per-step ratios (not value / bound of the medians).
    json_line(name, gb, "GB/s", bound, r);
    json_line(name, params, "params/s", bound_params, r);
    // Against the plain loop: "bound" is its params/s, "ratio" the median per-step speed-up.
    json_line(name + " vs plain -O3 loop", params, "params/s", median(plain_params), sp);
  } else {
    std::printf("%-44s %9.3g params/s %7.2f GB/s  bound %7.2f GB/s  ratio %.3f  vs plain -O3 loop %.2fx\n",
                name.c_str(), params, gb, bound, r, sp);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zoe-adam-bench: CpuAdam throughput vs a STREAM-style bound measured in the same run"};
  app.add_option("--sizes", o.sizes_mi, "element counts in Mi elements (16 = 16 * 2^20)");
  app.add_option("--threads", o.threads, "thread counts (oneTBB arena sizes)");
  app.add_option("--steps", o.steps, "timed steps per case (medians over them; >= 10 for reported figures)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "one JSON object per line: {bench, case, value, unit, bound, ratio}");
  CLI11_PARSE(app, argc, argv);
  if (!o.json)
    std::printf("AdamW step, fp32 grads; bound: 4 fp32 reads + 3 writes per element, same arrays, run after each "
                "step; medians over %d steps\n", o.steps);
  std::int64_t t = 0;
  for (int size_mi : o.sizes_mi) {
    const std::size_t n = static_cast<std::size_t>(size_mi) << 20;
    Arrays a(n);
    for (int threads : o.threads)
      for (bool bf16_out : {false, true}) run_case(o, a, n, size_mi, threads, bf16_out, t);
  }
  return 0;
}
