// zoe-nvme-bench DIR: sequential read and write bandwidth of the io_uring engine on a
// preallocated file in DIR, swept over block size x queue depth x fixed (registered) buffers,
// each compared with fio (--ioengine=io_uring --direct=1) on the same file with the same block
// size, depth and buffer registration. The disk's speed drifts and whoever runs second may find
// a warm host-side cache, so per case and direction zoe (A) and fio (B) alternate in both orders,
// A B B A A B B A ... (--repeat rounds, >= 3), and each round gives one paired ratio; a case
// reports the median ratio and its spread (min, max). Headlines: zoe's best configuration
// against fio's best configuration (each the highest median GB/s over the cases: they need not
// be the same case), per direction and for the harmonic mean of read and write, and the
// geometric mean over the cases of the per-case median ratios. Also measures CRC32C (the NVMe
// store checks every extent with it) against a plain read pass over the same buffer
// (crc_bench.hpp; --crc-only runs only that). Ends with zoe's best settings as the config's
// `aio` section.
//
// Output: a table (or, with --json, one {"bench","case","value","unit","bound","ratio"}
// object per line with what explains it; the best read+write line also carries the "aio"
// snippet). Progress on stderr.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/machine.hpp"
#include "bench/nvme/crc_bench.hpp"
#include "bench/nvme/fio_runner.hpp"
#include "io/direct_file.hpp"
#include "io/engine.hpp"
#include "src/common/aligned_buffer.hpp"

using namespace zoe;

namespace {

struct Case {
  std::size_t block_size;
  unsigned queue_depth;
  bool fixed;
};

// GB/s of each round, zoe's and fio's, per direction.
struct Rounds {
  std::vector<double> zoe, fio;
};

struct Result {
  Case c;
  Rounds write, read;
  bool fixed_used = false;
};

double median(std::vector<double> x) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const std::size_t k = x.size() / 2;
  return x.size() % 2 ? x[k] : 0.5 * (x[k - 1] + x[k]);
}

// Per-round zoe / fio ratios (empty without fio).
std::vector<double> ratios(const Rounds& r) {
  std::vector<double> q;
  for (std::size_t k = 0; k < r.zoe.size() && k < r.fio.size(); ++k) q.push_back(r.zoe[k] / r.fio[k]);
  return q;
}

double harmonic(double a, double b) { return a > 0 && b > 0 ? 2 / (1 / a + 1 / b) : 0.0; }

class Progress {
 public:
  explicit Progress(std::size_t total) : total_(total) {}
  void step(const std::string& label) {
    ++done_;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * done_ / total_);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-40s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done_, total_, label.c_str());
    std::fflush(stderr);
  }
  void finish() { std::fprintf(stderr, "\r%*s\r", 90, ""); }

 private:
  std::size_t total_, done_ = 0;
};

std::string size_name(std::size_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "M";
  return std::to_string(bytes >> 10) + "K";
}

// Moves the whole file once with the engine; returns GB/s (1e9 bytes/s).
double run_engine(const io::DirectFile& file, io::Op op, const Case& c, AlignedBuffer& buffer,
                  std::uint64_t size, bool& fixed_used) {
  io::EngineOptions eo;
  eo.block_size = c.block_size;
  eo.queue_depth = c.queue_depth;
  eo.fixed_buffers = c.fixed;
  eo.fixed_files = c.fixed;
  std::vector<std::span<std::byte>> fixed;
  if (c.fixed) fixed.emplace_back(static_cast<std::byte*>(buffer.data()), buffer.size());
  io::Engine engine(eo, fixed);
  io::FileRef ref = engine.register_file(file);
  // The file is covered by buffer-sized transfers, all queued at once (they share the
  // buffer: the data is not looked at), so the engine keeps queue_depth requests in flight.
  std::vector<io::Handle> handles;
  auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t offset = 0; offset < size; offset += buffer.size()) {
    io::Segment s{buffer.data(), offset, static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), size - offset))};
    handles.push_back(engine.submit(op, ref, {&s, 1}));
  }
  for (auto& h : handles) h.wait();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fixed_used = engine.stats().fixed_requests > 0;
  engine.unregister_file(ref);
  return static_cast<double>(size) / seconds / 1e9;
}

void print_json(const std::string& name, double value, std::optional<double> bound, const nlohmann::json& extra = {}) {
  nlohmann::json j = {{"bench", "nvme"}, {"case", name}, {"value", value}, {"unit", "GB/s"}};
  j["bound"] = bound ? nlohmann::json(*bound) : nlohmann::json(nullptr);
  j["ratio"] = bound && *bound > 0 ? nlohmann::json(value / *bound) : nlohmann::json(nullptr);
  for (auto& [k, v] : extra.items()) j[k] = v;
  j["cpu"] = bench::cpu_model();
  j["cpus"] = bench::online_cpus();
  j["load_average"] = bench::load_average();
  std::printf("%s\n", j.dump().c_str());
}

std::string case_name(const Case& c) {
  return "bs=" + size_name(c.block_size) + " qd=" + std::to_string(c.queue_depth) + " fixed=" + std::to_string(c.fixed);
}

// "0.93 (0.85-1.02)": median ratio and its spread over the rounds; "-" without fio.
std::string ratio_text(const Rounds& r) {
  const auto q = ratios(r);
  if (q.empty()) return "        -         ";
  const auto [lo, hi] = std::minmax_element(q.begin(), q.end());
  char b[64];
  std::snprintf(b, sizeof b, "%5.2f (%4.2f-%4.2f)", median(q), *lo, *hi);
  return b;
}

std::string gbs_text(const std::vector<double>& v) {
  if (v.empty()) return "    -  ";
  char b[32];
  std::snprintf(b, sizeof b, "%7.2f", median(v));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zoe-nvme-bench: io_uring engine bandwidth vs fio on a file in DIR"};
  std::string dir;
  std::uint64_t size_mib = 1024;
  std::vector<std::size_t> block_kib = {256, 1024, 4096};
  std::vector<unsigned> depths = {8, 32};
  int repeat = 4, crc_repeat = 15;
  bool json = false, no_fio = false, crc_only = false;
  app.add_option("DIR", dir, "directory for the test file (on the disk to measure)");
  app.add_option("--size-mib", size_mib, "test file size in MiB")->check(CLI::Range(16, 1 << 20));
  app.add_option("--block-kib", block_kib, "block sizes in KiB (multiples of 4)")->delimiter(',');
  app.add_option("--depths", depths, "queue depths")->delimiter(',');
  app.add_option("--repeat", repeat, "rounds per case and direction, zoe and fio alternating A B B A ... (>= 3)")
      ->check(CLI::Range(3, 20));
  app.add_option("--crc-repeat", crc_repeat, "rounds of the CRC32C case")->check(CLI::Range(3, 101));
  app.add_flag("--json", json, "one JSON object per line");
  app.add_flag("--no-fio", no_fio, "do not run fio");
  app.add_flag("--crc-only", crc_only, "only the CRC32C case (no DIR needed)");
  CLI11_PARSE(app, argc, argv);

  try {
    constexpr std::size_t kCrcBytes = 64 << 20;
    if (crc_only) {
      bench::report_crc32c(kCrcBytes, crc_repeat, json);
      return 0;
    }
    if (dir.empty()) throw std::runtime_error("DIR is required (or --crc-only)");
    const std::uint64_t size = size_mib << 20;
    std::vector<Case> cases;
    for (auto kib : block_kib)
      for (auto qd : depths)
        for (bool fixed : {false, true}) {
          if (kib == 0 || kib % 4 != 0) throw std::runtime_error("--block-kib values must be multiples of 4");
          cases.push_back({kib << 10, qd, fixed});
        }

    io::FileOptions fo;
    fo.remove_on_close = true;
    std::string path = dir + "/zoe-nvme-bench-" + std::to_string(::getpid()) + ".dat";
    io::DirectFile file = io::DirectFile::create(path, size, fo);
    if (!file.direct()) std::fprintf(stderr, "warning: %s refuses O_DIRECT; figures are buffered I/O\n", dir.c_str());
    AlignedBuffer buffer(std::min<std::uint64_t>(size, 64 << 20));
    std::memset(buffer.data(), 0x5A, buffer.size());  // fault in (and give the disk non-zero data)

    Progress progress(1 + cases.size() * 2 * repeat * (no_fio ? 1 : 2));
    // Fill the file once so every pass writes in place (ext4 converts unwritten extents
    // on the first write, which would favour whoever writes second).
    bool unused;
    double fill = run_engine(file, io::Op::write, {1 << 20, 32, false}, buffer, size, unused);
    progress.step("fill");

    std::vector<Result> results;
    for (const Case& c : cases) {
      Result r{c};
      const std::string label = case_name(c);
      for (io::Op op : {io::Op::write, io::Op::read}) {
        const bool write = op == io::Op::write;
        Rounds& rounds = write ? r.write : r.read;
        auto run_zoe = [&] {
          rounds.zoe.push_back(run_engine(file, op, c, buffer, size, r.fixed_used));
          progress.step(label + (write ? " write" : " read"));
        };
        bool fio_ok = !no_fio;
        auto run_fio = [&] {
          if (!fio_ok) return;
          std::string error;
          auto v = bench::run_fio({path, size, c.block_size, c.queue_depth, write, c.fixed}, error);
          if (!v) {
            std::fprintf(stderr, "\nfio: %s\n", error.c_str());
            fio_ok = false;  // no pairs for this case and direction
            rounds.fio.clear();
          } else {
            rounds.fio.push_back(*v);
          }
          progress.step(label + (write ? " fio write" : " fio read"));
        };
        // A B B A A B B A ...: each round pairs one zoe and one fio pass; who runs first
        // alternates, so neither profits from the other's warm-up or cache every time.
        for (int k = 0; k < repeat; ++k) {
          if (k % 2 == 0) run_zoe(), run_fio();
          else run_fio(), run_zoe();
        }
        if (!fio_ok) rounds.fio.clear();
      }
      results.push_back(r);
    }
    progress.finish();

    // Headlines: zoe's best configuration against fio's best, per direction and for the
    // harmonic mean of read and write (a sub-group swap does both), on per-case medians.
    struct Best {
      const Result* zoe = nullptr;
      const Result* fio = nullptr;
      double zoe_gbs = 0, fio_gbs = 0;
    };
    auto best_by = [&](auto zoe_score, auto fio_score) {
      Best b;
      for (const auto& r : results) {
        if (zoe_score(r) > b.zoe_gbs) b.zoe = &r, b.zoe_gbs = zoe_score(r);
        if (fio_score(r) > b.fio_gbs) b.fio = &r, b.fio_gbs = fio_score(r);
      }
      return b;
    };
    const Best best_write = best_by([](const Result& r) { return median(r.write.zoe); },
                                    [](const Result& r) { return median(r.write.fio); });
    const Best best_read = best_by([](const Result& r) { return median(r.read.zoe); },
                                   [](const Result& r) { return median(r.read.fio); });
    const Best best_both = best_by([](const Result& r) { return harmonic(median(r.write.zoe), median(r.read.zoe)); },
                                   [](const Result& r) { return harmonic(median(r.write.fio), median(r.read.fio)); });
    // Geometric means over the cases of the per-case median ratios (cases with fio pairs).
    auto geomean = [&](bool write) -> std::optional<double> {
      double log_sum = 0;
      int n = 0;
      for (const auto& r : results) {
        const auto q = ratios(write ? r.write : r.read);
        if (q.empty()) continue;
        log_sum += std::log(median(q));
        ++n;
      }
      if (n == 0) return std::nullopt;
      return std::exp(log_sum / n);
    };
    const auto geo_write = geomean(true), geo_read = geomean(false);
    nlohmann::json aio = {{"aio", {{"block_size", best_both.zoe->c.block_size}, {"queue_depth", best_both.zoe->c.queue_depth}}}};
    auto opt = [](double v) { return v > 0 ? std::optional<double>(v) : std::nullopt; };

    if (json) {
      print_json("fill write bs=1M qd=32", fill, std::nullopt);
      for (const auto& r : results) {
        const std::string name = case_name(r.c) + (r.c.fixed && !r.fixed_used ? " (fixed refused)" : "");
        for (bool write : {true, false}) {
          const Rounds& rounds = write ? r.write : r.read;
          const auto q = ratios(rounds);
          nlohmann::json extra = {{"repetitions", repeat}, {"order", "zoe/fio alternating A B B A"},
                                  {"statistic", "value, bound: median GB/s; ratio: median of per-round zoe/fio"}};
          if (!q.empty()) {
            const auto [lo, hi] = std::minmax_element(q.begin(), q.end());
            extra["ratio_min"] = *lo;
            extra["ratio_max"] = *hi;
          }
          const double value = median(rounds.zoe);
          nlohmann::json j = {{"bench", "nvme"}, {"case", (write ? "write " : "read ") + name}, {"value", value},
                              {"unit", "GB/s"}};
          j["bound"] = q.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(rounds.fio));
          j["ratio"] = q.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(q));
          j.update(extra);
          j["cpu"] = bench::cpu_model();
          j["cpus"] = bench::online_cpus();
          j["load_average"] = bench::load_average();
          std::printf("%s\n", j.dump().c_str());
        }
      }
      auto best_line = [&](const std::string& what, const Best& b, nlohmann::json extra) {
        extra["zoe_config"] = case_name(b.zoe->c);
        if (b.fio) extra["fio_config"] = case_name(b.fio->c);
        extra["explain"] = "value: zoe's best configuration (median GB/s); bound: fio's best configuration (median "
                           "GB/s), each over all cases; ratio: value / bound";
        print_json("best " + what + ": zoe's best vs fio's best", b.zoe_gbs, opt(b.fio_gbs), extra);
      };
      best_line("write", best_write, {});
      best_line("read", best_read, {});
      best_line("read+write (harmonic mean)", best_both, aio);
      for (bool write : {true, false}) {
        const auto g = write ? geo_write : geo_read;
        nlohmann::json j = {{"bench", "nvme"},
                            {"case", std::string("geometric mean over cases, ") + (write ? "write" : "read")},
                            {"value", g ? nlohmann::json(*g) : nlohmann::json(nullptr)},
                            {"unit", "ratio"},
                            {"bound", 1.0},
                            {"ratio", g ? nlohmann::json(*g) : nlohmann::json(nullptr)},
                            {"cases", results.size()},
                            {"explain", "geometric mean over the cases of each case's median zoe/fio ratio"},
                            {"cpu", bench::cpu_model()},
                            {"cpus", bench::online_cpus()},
                            {"load_average", bench::load_average()}};
        std::printf("%s\n", j.dump().c_str());
      }
      std::fflush(stdout);
      bench::report_crc32c(kCrcBytes, crc_repeat, true);
    } else {
      std::printf("zoe-nvme-bench: %s, %llu MiB file, %s I/O, GB/s = 1e9 bytes/s; fio = fio %s on the same file\n",
                  path.c_str(), static_cast<unsigned long long>(size_mib), file.direct() ? "direct" : "buffered",
                  "--ioengine=io_uring --direct=1");
      std::printf("per case: medians over %d rounds, zoe and fio alternating A B B A ...; ratio = median of the "
                  "per-round zoe/fio (min-max)\n",
                  repeat);
      std::printf("fill (first write, bs=1M qd=32): %.2f GB/s\n\n", fill);
      std::printf("%6s %4s %5s | %7s %7s %-18s | %7s %7s %-18s\n", "bs", "qd", "fixed", "write", "fio", "ratio",
                  "read", "fio", "ratio");
      for (const auto& r : results)
        std::printf("%6s %4u %5s | %s %s %s | %s %s %s\n", size_name(r.c.block_size).c_str(), r.c.queue_depth,
                    r.c.fixed ? (r.fixed_used ? "yes" : "refused") : "no", gbs_text(r.write.zoe).c_str(),
                    gbs_text(r.write.fio).c_str(), ratio_text(r.write).c_str(), gbs_text(r.read.zoe).c_str(),
                    gbs_text(r.read.fio).c_str(), ratio_text(r.read).c_str());
      std::printf("\n");
      auto best_text = [&](const char* what, const Best& b) {
        std::printf("best %-27s zoe %s %.2f GB/s", what, case_name(b.zoe->c).c_str(), b.zoe_gbs);
        if (b.fio) std::printf(" vs fio %s %.2f GB/s: ratio %.2f", case_name(b.fio->c).c_str(), b.fio_gbs, b.zoe_gbs / b.fio_gbs);
        std::printf("\n");
      };
      best_text("write:", best_write);
      best_text("read:", best_read);
      best_text("read+write (harmonic mean):", best_both);
      if (geo_write && geo_read)
        std::printf("geometric mean over %zu cases of the median ratios: write %.2f, read %.2f\n", results.size(),
                    *geo_write, *geo_read);
      std::printf("\n");
      std::fflush(stdout);
      bench::report_crc32c(kCrcBytes, crc_repeat, false);
      std::printf("\n%s\n", aio.dump().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nzoe-nvme-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
