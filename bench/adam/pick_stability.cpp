// Store pick stability over fresh processes (see pick_stability.hpp).
#include "bench/adam/pick_stability.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "bench/machine.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {
namespace {

std::string case_name(int size_mi, int threads, bool bf16_out, optim::OptimizerStateDType sd) {
  return "N=" + std::to_string(size_mi) + "M threads=" + std::to_string(threads) +
         (bf16_out ? " out=fp32+bf16" : " out=fp32") + (sd == optim::OptimizerStateDType::bf16 ? " states=bf16" : "") +
         " isa=" + std::string(optim::isa_name(optim::active_isa()));
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

}  // namespace

void print_store_picks(const PickCases& cases) {
  for (int size_mi : cases.sizes_mi) {
    const std::size_t n = static_cast<std::size_t>(size_mi) << 20;
    // m, v: fp32 states (n floats each), or bf16 states in their first halves (n uint16 each).
    AlignedBuffer pb(n * 4), mb(n * 4), vb(n * 4), gb(n * 4), ob(n * 2);
    float *p = pb.as<float>().data(), *g = gb.as<float>().data();
    for (std::size_t i = 0; i < n; ++i) {  // first touch, moderate values as in the bench
      p[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
      g[i] = (static_cast<float>(i % 997) - 498.0f) * 1e-3f + 1e-4f;
    }
    std::uint16_t* out = ob.as<std::uint16_t>().data();
    for (int threads : cases.threads)
      for (bool bf16_out : cases.bf16_out)
        for (optim::OptimizerStateDType sd : cases.state_dtypes) {
          std::fill_n(static_cast<char*>(mb.data()), n * 4, 0);  // 0.0f and bf16 0 alike
          std::fill_n(static_cast<char*>(vb.data()), n * 4, 0);
          optim::CpuAdam adam(threads);
          adam.set_store_policy(optim::StorePolicy::measure);
          optim::AdamHyper h;
          h.weight_decay = 0.01;
          std::int64_t t = 0;
          while (!adam.store_choice(n, DType::f32, bf16_out, sd).decided)
            adam.step(h, ++t, 1.0f, p, mb.data(), vb.data(), sd, g, DType::f32, n, bf16_out ? out : nullptr,
                      DType::bf16);
          const auto choice = adam.store_choice(n, DType::f32, bf16_out, sd);
          std::printf("pick\t%s\t%s\t%.4f\t", case_name(size_mi, threads, bf16_out, sd).c_str(),
                      optim::stores_name(choice.stores).c_str(), choice.margin);
          for (double r : choice.gbps) std::printf(" %.2f", r);  // each candidate's best GB/s
          std::printf("\n");
          std::fflush(stdout);
        }
  }
}

void report_pick_stability(const std::vector<std::string>& self_args, int processes, bool json) {
  std::string command;
  for (const auto& a : self_args) command += shell_quote(a) + " ";
  std::map<std::string, std::map<std::string, int>> picks;  // case -> pick -> processes
  std::map<std::string, std::vector<double>> margins;
  std::vector<std::string> order;
  for (int k = 0; k < processes; ++k) {
    std::FILE* child = ::popen(command.c_str(), "r");
    if (!child) throw std::runtime_error("cannot start " + command);
    char line[512];
    while (std::fgets(line, sizeof line, child)) {
      std::istringstream in(line);
      std::string tag, name, stores;
      double margin = 0;
      if (!std::getline(in, tag, '\t') || tag != "pick" || !std::getline(in, name, '\t') ||
          !std::getline(in, stores, '\t') || !(in >> margin))
        continue;
      if (!picks.count(name)) order.push_back(name);
      ++picks[name][stores];
      margins[name].push_back(margin);
    }
    if (::pclose(child) != 0) throw std::runtime_error("a --pick-only child failed: " + command);
    std::fprintf(stderr, "\rpick stability: %d/%d processes", k + 1, processes);
  }
  std::fprintf(stderr, "\n");
  for (const auto& name : order) {
    std::string top;
    int top_count = 0;
    for (const auto& [stores, count] : picks[name])
      if (count > top_count) top = stores, top_count = count;
    if (json) {
      nlohmann::json j{{"bench", "adam"},
                       {"case", name + " store pick over fresh processes"},
                       {"value", top_count},
                       {"unit", "processes"},
                       {"bound", processes},
                       {"ratio", static_cast<double>(top_count) / processes},
                       {"explain", "value: processes (each a fresh CpuAdam after its own trials) that picked the most "
                                   "frequent store kind (\"most_frequent\"); bound: processes run; \"picks\": every "
                                   "pick's count; \"margins\": each process's noise margin"},
                       {"most_frequent", top},
                       {"picks", picks[name]},
                       {"margins", margins[name]},
                       {"cpu", cpu_model()},
                       {"cpus", online_cpus()},
                       {"load_average", load_average()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-40s store pick: %s in %d of %d fresh processes (", name.c_str(), top.c_str(), top_count, processes);
      const char* sep = "";
      for (const auto& [stores, count] : picks[name]) std::printf("%s%s %d", sep, stores.c_str(), count), sep = ", ";
      std::printf(")\n");
    }
  }
}

}  // namespace zoe::bench
