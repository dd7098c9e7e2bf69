// zoe-adam-bench: CpuAdam::step (AdamW, fp32 grads, optional bf16 weight copy) for N = 16M and
// 128M elements on 1 and 2 threads, with fp32 optimizer states (default) and/or bf16 ones
// (--state-dtype bf16: exp_avg and exp_avg_sq stored as bf16). Per case, in one process and
// interleaved (each repetition runs every pass once, the order rotated by one per repetition):
//  - CpuAdam forced to each store kind (ordinary, nontemporal, and with the bf16 copy
//    nontemporal-half) next to the STREAM-style bound of the same access pattern with the same
//    stores (fp32 states: 4 fp32 reads + 3 writes per element, 28 bytes; bf16 states: p and g
//    fp32, m and v 16-bit, 20 bytes; + one 16-bit write with the copy);
//  - CpuAdam with its own pick (StorePolicy::measure, its trials run before the timed
//    repetitions) against the best bound of any store kind in the same repetition: the headline;
//  - a plain -O3 Adam loop.
// Prints medians over the repetitions of GB/s and of the per-repetition ratios. --thread-cpu
// times one-thread cases by the thread's CPU clock (for a loaded shared machine).
// --json: one JSON object per line {"bench","case","value","unit","bound","ratio"} with what
// explains it: "explain" (what value, bound and ratio are), "elements", "threads", "output",
// "state_dtype", "bytes_per_element", "clock", "repetitions", "statistic", "cpu", "cpus" and "load_average"
// (at the line's end); the library's lines add "picked" (the store kind CpuAdam chose).
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/adam/bench_loops.hpp"
#include "bench/adam/pick_stability.hpp"
#include "bench/machine.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/optim/cpu_adam.hpp"

namespace {

using zoe::AlignedBuffer;
using zoe::DType;
using zoe::optim::AdamHyper;
using zoe::optim::CpuAdam;
using zoe::optim::OptimizerStateDType;

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using zoe::bench::thread_cpu_seconds;

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

// fp32 m, v only with fp32-state cases, bf16 m16, v16 only with bf16-state cases.
struct Arrays {
  Arrays(std::size_t n, bool fp32_states, bool bf16_states)
      : pb(n * 4), mb(fp32_states ? n * 4 : 0), vb(fp32_states ? n * 4 : 0), gb(n * 4), ob(n * 2),
        m16b(bf16_states ? n * 2 : 0), v16b(bf16_states ? n * 2 : 0),
        p(pb.as<float>().data()), m(mb.as<float>().data()), v(vb.as<float>().data()), g(gb.as<float>().data()),
        out(ob.as<std::uint16_t>().data()), m16(m16b.as<std::uint16_t>().data()), v16(v16b.as<std::uint16_t>().data()) {
    for (std::size_t i = 0; i < n; ++i) {  // first touch; moderate values, no denormals
      p[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
      if (fp32_states) m[i] = 0.0f, v[i] = 0.0f;
      if (bf16_states) m16[i] = 0, v16[i] = 0;
      g[i] = (static_cast<float>(i % 997) - 498.0f) * 1e-3f + 1e-4f;
      out[i] = 0;
    }
  }
  AlignedBuffer pb, mb, vb, gb, ob, m16b, v16b;  // >= 2 MiB: 2 MiB aligned, MADV_HUGEPAGE
  float *p, *m, *v, *g;
  std::uint16_t *out, *m16, *v16;
};

struct Options {
  std::vector<int> sizes_mi{16, 128};
  std::vector<int> threads{1, 2};
  std::vector<std::string> outputs{"fp32", "bf16"};
  std::vector<std::string> state_dtypes{"fp32"};
  int steps = 10;
  int pick_processes = 0;
  bool pick_only = false;
  bool thread_cpu = false;
  bool json = false;
};

// The facts a --json line carries besides its figure, so a file of results explains itself.
struct CaseFacts {
  std::size_t elements;
  int threads;
  bool bf16_out;
  OptimizerStateDType state_dtype;
  bool cpu_clock;
  int repetitions;
};

// Bytes one step moves per element with fp32 gradients: p 4 + 4, m and v (4 or 2) + (4 or 2)
// each, g 4, the bf16 copy 2: 28 / 30 with fp32 states, 20 / 22 with bf16 states.
int bytes_per_element(OptimizerStateDType sd, bool bf16_out) {
  return 8 + 4 * static_cast<int>(zoe::optim::optimizer_state_dtype_size(sd)) + 4 + (bf16_out ? 2 : 0);
}

void json_line(const std::string& case_name, double value, const std::string& unit, double bound, double ratio,
               const CaseFacts& f, const std::string& explain, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j{{"bench", "adam"},
                   {"case", case_name},
                   {"value", value},
                   {"unit", unit},
                   {"bound", bound},
                   {"ratio", ratio},
                   {"explain", explain},
                   {"elements", f.elements},
                   {"threads", f.threads},
                   {"output", f.bf16_out ? "fp32+bf16" : "fp32"},
                   {"state_dtype", zoe::optim::optimizer_state_dtype_name(f.state_dtype)},
                   {"bytes_per_element", bytes_per_element(f.state_dtype, f.bf16_out)},
                   {"clock", f.cpu_clock ? "thread-cpu" : "wall"},
                   {"repetitions", f.repetitions},
                   {"statistic", "median over repetitions (ratio: median of per-repetition ratios)"},
                   {"cpu", zoe::bench::cpu_model()},
                   {"cpus", zoe::bench::online_cpus()},
                   {"load_average", zoe::bench::load_average()}};
  j.update(extra);
  std::printf("%s\n", j.dump().c_str());
}

using zoe::optim::StoreKind;
using zoe::optim::StorePolicy;
using zoe::optim::Stores;

// The store kinds compared per case: CpuAdam forced to each, the bound loop with each.
struct Kind {
  StorePolicy policy;
  Stores stores;
};
const Kind kKinds[] = {
    {StorePolicy::ordinary, {StoreKind::ordinary, StoreKind::ordinary}},
    {StorePolicy::nontemporal, {StoreKind::nontemporal, StoreKind::nontemporal}},
    {StorePolicy::nontemporal_half, {StoreKind::ordinary, StoreKind::nontemporal}},
};

void run_case(const Options& o, Arrays& a, std::size_t n, int size_mi, int threads, bool bf16_out,
              OptimizerStateDType sd, std::int64_t& t) {
  const bool bf16_states = sd == OptimizerStateDType::bf16;
  const bool cpu_clock = o.thread_cpu && threads == 1;
  auto seconds = [cpu_clock](auto&& f) { return cpu_clock ? thread_cpu_seconds(f) : ::seconds(f); };
  CpuAdam forced(threads), library(threads);  // forced: one kind per call; library: its own pick
  library.set_store_policy(StorePolicy::measure);
  tbb::task_arena arena(threads);
  AdamHyper h;
  h.weight_decay = 0.01;
  std::uint16_t* out = bf16_out ? a.out : nullptr;
  const double bytes = static_cast<double>(n) * bytes_per_element(sd, bf16_out);
  const int kinds = bf16_out ? 3 : 2;  // nontemporal-half only differs with a half copy
  auto adam_step = [&](CpuAdam& adam) {
    if (bf16_states) adam.step(h, ++t, 1.0f, a.p, a.m16, a.v16, sd, a.g, DType::f32, n, out, DType::bf16);
    else adam.step(h, ++t, 1.0f, a.p, a.m, a.v, a.g, DType::f32, n, out, DType::bf16);
  };
  // The bound and the plain loop over the same arrays (bf16 states: the 16-bit m and v).
  auto bound_pass = [&](Stores stores) {
    if (bf16_states) zoe::bench::stream_bound_pass(arena, a.p, a.m16, a.v16, a.g, out, n, stores);
    else zoe::bench::stream_bound_pass(arena, a.p, a.m, a.v, a.g, out, n, stores);
  };
  auto plain_pass = [&] {
    if (bf16_states) zoe::bench::plain_adam_pass(arena, ++t, a.p, a.m16, a.v16, a.g, out, n);
    else zoe::bench::plain_adam_pass(arena, ++t, a.p, a.m, a.v, a.g, out, n);
  };
  // Warm-up (starts the arenas' threads; the arrays are touched), then the library's own trials
  // (StorePolicy::measure: warm-up call + kStoreTrialRounds rounds over its candidates).
  adam_step(forced);
  bound_pass(kKinds[0].stores);
  while (!library.store_choice(n, DType::f32, bf16_out, sd).decided) adam_step(library);
  const auto choice = library.store_choice(n, DType::f32, bf16_out, sd);
  // Per repetition: every pass once, in an order rotated by one each repetition, so no pass
  // always follows the same other pass (cache state, DRAM page state, turbo).
  // The bound runs with each store kind with and without the kernels' prefetch.
  enum Pass { kernel0, bound0 = 3, bound_prefetch0 = 6, lib = 9, plain = 10, passes = 11 };
  std::vector<std::vector<double>> secs(passes);
  std::vector<int> order;
  for (int k = 0; k < kinds; ++k)
    order.push_back(kernel0 + k), order.push_back(bound0 + k), order.push_back(bound_prefetch0 + k);
  order.push_back(lib);
  order.push_back(plain);
  for (int s = 0; s < o.steps; ++s) {
    std::rotate(order.begin(), order.begin() + 1, order.end());
    for (int p : order) {
      double dt;
      if (p == lib) {
        dt = seconds([&] { adam_step(library); });
      } else if (p == plain) {
        dt = seconds(plain_pass);
      } else if (p >= bound0) {
        const bool prefetch = p >= bound_prefetch0;
        Stores stores = kKinds[p - (prefetch ? bound_prefetch0 : bound0)].stores;
        stores.prefetch = prefetch;
        dt = seconds([&] { bound_pass(stores); });
      } else {
        forced.set_store_policy(kKinds[p].policy);
        dt = seconds([&] { adam_step(forced); });
      }
      secs[p].push_back(dt);
    }
  }
  // Medians over repetitions of GB/s and of per-repetition ratios.
  auto gbps = [&](int p) {
    std::vector<double> r;
    for (double x : secs[p]) r.push_back(bytes / x / 1e9);
    return median(r);
  };
  auto ratio = [&](int p, auto bound_secs) {
    std::vector<double> r;
    for (int s = 0; s < o.steps; ++s) r.push_back(bound_secs(s) / secs[p][s]);
    return median(r);
  };
  auto best_bound_secs = [&](int s) {
    double b = secs[bound0][s];
    for (int k = 0; k < kinds; ++k) b = std::min({b, secs[bound0 + k][s], secs[bound_prefetch0 + k][s]});
    return b;
  };
  // The bound variant that is fastest in the most repetitions (what "bound" mostly stands for).
  std::string best_variant;
  {
    std::vector<int> wins(passes, 0);
    for (int s = 0; s < o.steps; ++s)
      for (int p = bound0; p < bound_prefetch0 + kinds; ++p)
        if ((p < bound0 + kinds || p >= bound_prefetch0) && secs[p][s] == best_bound_secs(s)) {
          ++wins[p];
          break;
        }
    const int p = static_cast<int>(std::max_element(wins.begin(), wins.end()) - wins.begin());
    Stores st = kKinds[p - (p >= bound_prefetch0 ? bound_prefetch0 : bound0)].stores;
    st.prefetch = p >= bound_prefetch0;
    best_variant = zoe::optim::stores_name(st);
  }
  const std::string name = "N=" + std::to_string(size_mi) + "M threads=" + std::to_string(threads) +
                           (bf16_out ? " out=fp32+bf16" : " out=fp32") + (bf16_states ? " states=bf16" : "") +
                           " isa=" + std::string(zoe::optim::isa_name(library.isa())) +
                           (cpu_clock ? " clock=thread-cpu" : "");
  const std::string picked(zoe::optim::stores_name(choice.stores));
  std::vector<double> bound_best;
  for (int s = 0; s < o.steps; ++s) bound_best.push_back(bytes / best_bound_secs(s) / 1e9);
  const double lib_gbps = gbps(lib), lib_ratio = ratio(lib, best_bound_secs), best = median(bound_best);
  const double plain_speedup = ratio(lib, [&](int s) { return secs[plain][s]; });
  if (o.json) {
    const CaseFacts f{n, threads, bf16_out, sd, cpu_clock, o.steps};
    // Per store kind: CpuAdam forced to it against the bound loop with the same stores.
    for (int k = 0; k < kinds; ++k) {
      const std::string kind(zoe::optim::stores_name(kKinds[k].stores));
      json_line(name + " stores=" + kind, gbps(kernel0 + k), "GB/s", gbps(bound0 + k),
                ratio(kernel0 + k, [&](int s) { return secs[bound0 + k][s]; }), f,
                "value: CpuAdam::step forced to " + kind + " stores; bound: the STREAM-style loop of the same "
                "access pattern with the same stores; ratio: value / bound");
    }
    // The library's own pick against the best bound of any store kind: the headline figure.
    const std::string lib_explain =
        "value: CpuAdam::step with the store kind it measured and picked (\"picked\"); bound: the fastest "
        "STREAM-style loop in each repetition over every store kind, with and without the kernels' prefetch "
        "(\"bound_variant\": the one fastest most often); ratio: value / bound (the headline)";
    const nlohmann::json lib_extra = {{"picked", picked}, {"bound_variant", best_variant}};
    json_line(name + " library", lib_gbps, "GB/s", best, lib_ratio, f, lib_explain, lib_extra);
    json_line(name + " library", lib_gbps * 1e9 / (bytes / n), "params/s", best * 1e9 / (bytes / n), lib_ratio, f,
              lib_explain, lib_extra);
    // Against the plain loop: "bound" is its params/s, "ratio" the median per-step speed-up.
    json_line(name + " vs plain -O3 loop", lib_gbps * 1e9 / (bytes / n), "params/s", gbps(plain) * 1e9 / (bytes / n),
              plain_speedup, f,
              "value: CpuAdam::step (library pick); bound: a plain scalar -O3 Adam loop (not a bound); ratio: speed-up");
  } else {
    std::printf("%-40s", name.c_str());
    for (int k = 0; k < kinds; ++k)
      std::printf("  %s %.2f/%.2f=%.3f", std::string(zoe::optim::stores_name(kKinds[k].stores)).c_str(),
                  gbps(kernel0 + k), gbps(bound0 + k), ratio(kernel0 + k, [&](int s) { return secs[bound0 + k][s]; }));
    std::printf("  | library (%s) %.2f GB/s, best bound (%s) %.2f, ratio %.3f, vs plain %.2fx\n", picked.c_str(),
                lib_gbps, best_variant.c_str(), best, lib_ratio, plain_speedup);
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
  app.add_flag("--thread-cpu", o.thread_cpu,
               "one-thread cases: time by the thread's CPU clock (leaves out time the scheduler gave to other "
               "processes on a loaded machine; the bound and every variant alike); other cases stay on the wall clock");
  app.add_option("--outputs", o.outputs, "fp32 (no half copy) and/or bf16 (with a bf16 copy)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--state-dtype", o.state_dtypes,
                 "storage of exp_avg and exp_avg_sq: fp32 (default) and/or bf16; each case is measured against the "
                 "bound of its own access pattern (bf16: 20 bytes per element, 22 with the copy)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--pick-stability", o.pick_processes,
                 "instead of the throughput cases: run N fresh processes per case and count CpuAdam's store picks")
      ->check(CLI::Range(1, 100));
  app.add_flag("--pick-only", o.pick_only, "(used by --pick-stability) print CpuAdam's store pick per case, exit");
  app.add_flag("--json", o.json, "one JSON object per line: {bench, case, value, unit, bound, ratio}");
  CLI11_PARSE(app, argc, argv);
  auto has_output = [&](const char* name) { return std::find(o.outputs.begin(), o.outputs.end(), name) != o.outputs.end(); };
  std::vector<bool> bf16_outs;
  if (has_output("fp32")) bf16_outs.push_back(false);
  if (has_output("bf16")) bf16_outs.push_back(true);
  std::vector<OptimizerStateDType> state_dtypes;
  for (const auto& name : o.state_dtypes) {
    const OptimizerStateDType sd = zoe::optim::parse_optimizer_state_dtype(name, "--state-dtype");
    if (std::find(state_dtypes.begin(), state_dtypes.end(), sd) == state_dtypes.end()) state_dtypes.push_back(sd);
  }
  auto has_states = [&](OptimizerStateDType sd) {
    return std::find(state_dtypes.begin(), state_dtypes.end(), sd) != state_dtypes.end();
  };
  if (o.pick_only) {
    zoe::bench::print_store_picks({o.sizes_mi, o.threads, bf16_outs, state_dtypes});
    return 0;
  }
  if (o.pick_processes > 0) {
    std::vector<std::string> self{"/proc/self/exe"};
    self[0] = std::filesystem::read_symlink("/proc/self/exe").string();
    auto add_list = [&](const char* flag, const auto& values) {
      self.push_back(flag);
      for (const auto& v : values) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) self.push_back(v);
        else self.push_back(std::to_string(v));
      }
    };
    add_list("--sizes", o.sizes_mi);
    add_list("--threads", o.threads);
    add_list("--outputs", o.outputs);
    add_list("--state-dtype", o.state_dtypes);
    self.push_back("--pick-only");
    try {
      zoe::bench::report_pick_stability(self, o.pick_processes, o.json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zoe-adam-bench: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (!o.json)
    std::printf("AdamW step, fp32 grads; per store kind: CpuAdam GB/s / bound GB/s = ratio (bound: 4 reads + 3 "
                "writes per element [+ one 16-bit write], same arrays, dtypes and stores: fp32 states 28 [30] bytes, "
                "states=bf16 20 [22]); library: CpuAdam's own pick vs the best bound; medians over %d interleaved "
                "repetitions\n", o.steps);
  std::int64_t t = 0;
  for (int size_mi : o.sizes_mi) {
    const std::size_t n = static_cast<std::size_t>(size_mi) << 20;
    Arrays a(n, has_states(OptimizerStateDType::fp32), has_states(OptimizerStateDType::bf16));
    for (int threads : o.threads)
      for (bool bf16_out : bf16_outs)
        for (OptimizerStateDType sd : state_dtypes) run_case(o, a, n, size_mi, threads, bf16_out, sd, t);
  }
  return 0;
}
