// zoe-nvme-bench DIR: sequential read and write bandwidth of the io_uring engine on a
// preallocated file in DIR, swept over block size × queue depth × fixed (registered)
// buffers, each compared with fio (--ioengine=io_uring --direct=1) on the same file with
// the same block size, depth and buffer registration, run next to ours (the disk's speed
// drifts, so only same-run ratios mean anything; the order alternates between cases). Also
// measures CRC32C (the NVMe store checks every extent with it) against a plain read pass
// over the same buffer. Ends with the best settings as the config's `aio` section.
//
// Output: a table (or, with --json, one {"bench","case","value","unit","bound","ratio"}
// object per line; the last line also carries the "aio" snippet). Progress on stderr.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/nvme/fio_runner.hpp"
#include "io/crc32c.hpp"
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

struct Result {
  Case c;
  double write_gbs = 0, read_gbs = 0;
  std::optional<double> fio_write, fio_read;
  bool fixed_used = false;
};

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

// CRC32C rate over `buffer` (GB/s, best of 5) and, as its bound, the rate of a plain
// read pass over the same bytes (64-bit XOR, which the compiler vectorises).
std::pair<double, double> crc_rate(const AlignedBuffer& buffer) {
  auto time = [](auto&& fn) {
    double best = 1e30;
    for (int k = 0; k < 5; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  volatile std::uint32_t sink_crc = 0;
  volatile std::uint64_t sink_xor = 0;
  double crc_s = time([&] { sink_crc = io::crc32c(buffer.data(), buffer.size()); });
  auto words = buffer.as<const std::uint64_t>();
  double read_s = time([&] {
    std::uint64_t x = 0;
    for (std::uint64_t w : words) x ^= w;
    sink_xor = x;
  });
  (void)sink_crc;
  (void)sink_xor;
  return {static_cast<double>(buffer.size()) / crc_s / 1e9, static_cast<double>(buffer.size()) / read_s / 1e9};
}

void print_json(const std::string& name, double value, std::optional<double> bound, const nlohmann::json& extra = {}) {
  nlohmann::json j = {{"bench", "nvme"}, {"case", name}, {"value", value}, {"unit", "GB/s"}};
  j["bound"] = bound ? nlohmann::json(*bound) : nlohmann::json(nullptr);
  j["ratio"] = bound && *bound > 0 ? nlohmann::json(value / *bound) : nlohmann::json(nullptr);
  for (auto& [k, v] : extra.items()) j[k] = v;
  std::printf("%s\n", j.dump().c_str());
}

std::string ratio_text(double ours, std::optional<double> fio) {
  if (!fio || *fio <= 0) return "   -  ";
  char b[32];
  std::snprintf(b, sizeof b, "%6.2f", ours / *fio);
  return b;
}

std::string gbs_text(std::optional<double> v) {
  if (!v) return "    -  ";
  char b[32];
  std::snprintf(b, sizeof b, "%7.2f", *v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zoe-nvme-bench: io_uring engine bandwidth vs fio on a file in DIR"};
  std::string dir;
  std::uint64_t size_mib = 1024;
  std::vector<std::size_t> block_kib = {256, 1024, 4096};
  std::vector<unsigned> depths = {8, 32};
  int repeat = 1;
  bool json = false, no_fio = false;
  app.add_option("DIR", dir, "directory for the test file (on the disk to measure)")->required();
  app.add_option("--size-mib", size_mib, "test file size in MiB")->check(CLI::Range(16, 1 << 20));
  app.add_option("--block-kib", block_kib, "block sizes in KiB (multiples of 4)")->delimiter(',');
  app.add_option("--depths", depths, "queue depths")->delimiter(',');
  app.add_option("--repeat", repeat, "runs of each measurement (best kept)")->check(CLI::Range(1, 10));
  app.add_flag("--json", json, "one JSON object per line");
  app.add_flag("--no-fio", no_fio, "do not run fio");
  CLI11_PARSE(app, argc, argv);

  try {
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

    Progress progress(1 + cases.size() * (no_fio ? 2 : 4));
    // Fill the file once so every pass writes in place (ext4 converts unwritten extents
    // on the first write, which would favour whoever writes second).
    bool unused;
    double fill = run_engine(file, io::Op::write, {1 << 20, 32, false}, buffer, size, unused);
    progress.step("fill");

    std::vector<Result> results;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      Result r{c};
      std::string label = "bs=" + size_name(c.block_size) + " qd=" + std::to_string(c.queue_depth) +
                          " fixed=" + std::to_string(c.fixed);
      // Each op runs `repeat` times for both, keeping the best, and the order alternates
      // between cases: whoever runs second may find the data warm in a host-side cache.
      for (io::Op op : {io::Op::write, io::Op::read}) {
        bool write = op == io::Op::write;
        double& ours = write ? r.write_gbs : r.read_gbs;
        std::optional<double>& fio = write ? r.fio_write : r.fio_read;
        auto run_ours = [&] {
          for (int k = 0; k < repeat; ++k) ours = std::max(ours, run_engine(file, op, c, buffer, size, r.fixed_used));
          progress.step(label + (write ? " write" : " read"));
        };
        auto run_bound = [&] {
          if (no_fio) return;
          for (int k = 0; k < repeat; ++k) {
            std::string error;
            auto v = bench::run_fio({path, size, c.block_size, c.queue_depth, write, c.fixed}, error);
            if (!v) std::fprintf(stderr, "\nfio: %s\n", error.c_str());
            else fio = std::max(fio.value_or(0.0), *v);
          }
          progress.step(label + (write ? " fio write" : " fio read"));
        };
        if (i % 2 == 0) {
          run_ours();
          run_bound();
        } else {
          run_bound();
          run_ours();
        }
      }
      results.push_back(r);
    }
    progress.finish();
    auto [crc_gbs, read_pass_gbs] = crc_rate(buffer);

    // Best: the highest harmonic mean of read and write (a sub-group swap does both).
    auto score = [](const Result& r) { return 2 / (1 / r.write_gbs + 1 / r.read_gbs); };
    const Result* best = &results.front();
    for (const auto& r : results)
      if (score(r) > score(*best)) best = &r;
    nlohmann::json aio = {{"aio", {{"block_size", best->c.block_size}, {"queue_depth", best->c.queue_depth}}}};

    if (json) {
      print_json("fill write bs=1M qd=32", fill, std::nullopt);
      for (const auto& r : results) {
        std::string name = "bs=" + std::to_string(r.c.block_size) + " qd=" + std::to_string(r.c.queue_depth) +
                           " fixed=" + std::to_string(r.c.fixed && r.fixed_used);
        print_json("write " + name, r.write_gbs, r.fio_write);
        print_json("read " + name, r.read_gbs, r.fio_read);
      }
      std::optional<double> best_fio;
      if (best->fio_read && best->fio_write) best_fio = 2 / (1 / *best->fio_write + 1 / *best->fio_read);
      print_json("crc32c (" + std::string(io::crc32c_path()) + ") vs a read pass", crc_gbs, read_pass_gbs);
      print_json("best read+write (harmonic mean)", score(*best), best_fio, aio);
    } else {
      std::printf("zoe-nvme-bench: %s, %llu MiB file, %s I/O, GB/s = 1e9 bytes/s; fio = fio %s on the same file\n",
                  path.c_str(), static_cast<unsigned long long>(size_mib), file.direct() ? "direct" : "buffered",
                  "--ioengine=io_uring --direct=1");
      std::printf("fill (first write, bs=1M qd=32): %.2f GB/s\n\n", fill);
      std::printf("%6s %4s %5s | %7s %7s %6s | %7s %7s %6s\n", "bs", "qd", "fixed", "write", "fio", "ratio",
                  "read", "fio", "ratio");
      for (const auto& r : results)
        std::printf("%6s %4u %5s | %7.2f %s %s | %7.2f %s %s\n", size_name(r.c.block_size).c_str(),
                    r.c.queue_depth, r.c.fixed ? (r.fixed_used ? "yes" : "refused") : "no", r.write_gbs,
                    gbs_text(r.fio_write).c_str(), ratio_text(r.write_gbs, r.fio_write).c_str(), r.read_gbs,
                    gbs_text(r.fio_read).c_str(), ratio_text(r.read_gbs, r.fio_read).c_str());
      std::printf("\ncrc32c (%s): %.2f GB/s; a plain read pass over the same %zu MiB: %.2f GB/s (ratio %.2f)\n",
                  std::string(io::crc32c_path()).c_str(), crc_gbs, buffer.size() >> 20, read_pass_gbs,
                  crc_gbs / read_pass_gbs);
      std::printf("\nbest (harmonic mean of read and write): bs=%s qd=%u fixed buffers %s: write %.2f, read %.2f GB/s\n",
                  size_name(best->c.block_size).c_str(), best->c.queue_depth, best->c.fixed ? "on" : "off",
                  best->write_gbs, best->read_gbs);
      std::printf("%s\n", aio.dump().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nzoe-nvme-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
