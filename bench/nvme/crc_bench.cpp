// CRC32C paths against a read pass over the same bytes (see crc_bench.hpp).
#include "bench/nvme/crc_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/machine.hpp"
#include "io/crc32c.hpp"
#include "src/common/aligned_buffer.hpp"

namespace zoe::bench {
namespace {

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

// Both sides are one thread on one core: timed by its CPU clock (thread_cpu_seconds).
template <class F>
double seconds(F&& f) {
  return thread_cpu_seconds(f);
}

}  // namespace

void report_crc32c(std::size_t bytes, int repetitions, bool json) {
  AlignedBuffer buffer(bytes);
  auto words = buffer.as<std::uint64_t>();
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = 0x9E3779B97F4A7C15ull * (i + 1);  // fault in
  std::vector<io::Crc32cPath> paths;
  for (auto p : {io::Crc32cPath::table, io::Crc32cPath::sse42, io::Crc32cPath::pclmul, io::Crc32cPath::vpclmul})
    if (io::crc32c_path_supported(p)) paths.push_back(p);
  volatile std::uint64_t sink = 0;
  auto read_pass = [&] {
    std::uint64_t x = 0;
    for (std::uint64_t w : words) x ^= w;
    sink = x;
  };
  // Passes: 0 = the read pass, 1 + k = paths[k]. Round r runs them in order, or reversed when
  // r is odd, so neither side always runs first (warm caches, turbo).
  std::vector<std::vector<double>> secs(1 + paths.size());
  std::vector<std::uint32_t> crcs(paths.size());
  read_pass();
  for (int r = 0; r < repetitions; ++r)
    for (std::size_t i = 0; i <= paths.size(); ++i) {
      const std::size_t k = r % 2 ? paths.size() - i : i;
      if (k == 0) secs[0].push_back(seconds(read_pass));
      else secs[k].push_back(seconds([&] { crcs[k - 1] = io::crc32c_via(paths[k - 1], buffer.data(), bytes); }));
    }
  const double read_gbs = static_cast<double>(bytes) / median(secs[0]) / 1e9;
  for (std::size_t k = 0; k < paths.size(); ++k) {
    std::vector<double> ratios;
    for (int r = 0; r < repetitions; ++r) ratios.push_back(secs[0][r] / secs[1 + k][r]);
    const double gbs = static_cast<double>(bytes) / median(secs[1 + k]) / 1e9, ratio = median(ratios);
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    const std::string path(io::crc32c_path_name(paths[k]));
    const bool active = paths[k] == io::crc32c_active_path();
    if (crcs[k] != crcs[0]) std::fprintf(stderr, "crc32c: path %s disagrees with %s\n", path.c_str(), "table");
    if (json) {
      nlohmann::json j{{"bench", "nvme"},
                       {"case", "crc32c (" + path + ") vs a read pass"},
                       {"value", gbs},
                       {"unit", "GB/s"},
                       {"bound", read_gbs},
                       {"ratio", ratio},
                       {"ratio_min", *lo},
                       {"ratio_max", *hi},
                       {"active", active},
                       {"bytes", bytes},
                       {"repetitions", repetitions},
                       {"explain", "value: CRC32C GB/s (median); bound: a plain read pass (64-bit XOR) over the same "
                                   "buffer (median); ratio: median of per-round read-pass time / CRC time, rounds "
                                   "interleaved, order alternating"},
                       {"clock", "thread-cpu"},
                       {"cpu", cpu_model()},
                       {"cpus", online_cpus()},
                       {"load_average", load_average()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("crc32c %-10s %6.2f GB/s, read pass %6.2f GB/s: ratio %.2f (%.2f-%.2f)%s\n", path.c_str(), gbs,
                  read_gbs, ratio, *lo, *hi, active ? "  <- used" : "");
    }
  }
  std::fflush(stdout);
}

}  // namespace zoe::bench
