// Output of zoe-offload-bench: a table on stdout, or with --json one object per line
// {"bench":"offload","case","value","unit","bound","ratio"} like the other benches, plus "note"
// (what the bound is), "load_average" (at the figure's end), "cpu" (model) and "cpus" (online).
// Not thread-safe: one thread prints.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/machine.hpp"

namespace zoe::bench {

class Report {
 public:
  explicit Report(bool json) : json_(json) {}
  bool json() const { return json_; }

  /// One figure: `value` in `unit` next to the `bound` it is compared with and their `ratio`.
  void line(const std::string& case_name, double value, const std::string& unit, double bound, double ratio,
            const std::string& note = "") const {
    if (json_) {
      const nlohmann::json j{{"bench", "offload"}, {"case", case_name}, {"value", value},
                             {"unit", unit},       {"bound", bound},      {"ratio", ratio},
                             {"note", note},       {"load_average", load_average()}, {"cpu", cpu_model()},
                             {"cpus", online_cpus()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-46s %10.3f %-5s bound %10.3f  ratio %6.3f  %s\n", case_name.c_str(), value, unit.c_str(), bound,
                  ratio, note.c_str());
    }
    std::fflush(stdout);
  }
  /// Free text: on stdout in table mode, on stderr with --json (keeps stdout parseable).
  template <class... A>
  void text(const char* fmt, A... args) const {
    std::fprintf(json_ ? stderr : stdout, fmt, args...);
    std::fflush(json_ ? stderr : stdout);
  }

 private:
  bool json_;
};

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.empty() ? 0.0 : x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

}  // namespace zoe::bench
