// zoe-comm-bench: bus bandwidth of the host (Gloo) backend's all_gather and reduce_scatter
// (fp32 sum), ranks as threads of this process, for buffers of 1 MiB ... 256 MiB, printed
// next to the memcpy bandwidth of the same size measured in the same run.
//
// Definitions (nccl-tests, doc/PERFORMANCE.md): S = bytes of the full buffer (all ranks'
// data: all_gather's output, reduce_scatter's input), t = time of one collective (slowest
// rank, best of --iters), algbw = S / t, busbw = algbw * (N-1)/N. The bound is memcpy of S
// bytes between two warm buffers (S / t_memcpy) on one thread: the loopback transport
// moves every byte through at least one such copy, so ratio = busbw / memcpy says how
// close the collective gets to the memory system.
// --json prints one object per line: {"bench","case","value","unit","bound","ratio"}.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/device/device.hpp"
#include "zoe/engine.hpp"

using namespace zoe;
using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best-of-iters memcpy bandwidth for `bytes`, in bytes/s.
double memcpy_bandwidth(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < iters + 1; ++i) {  // first pass warms the pages
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double t = seconds_since(t0);
    if (i > 0) best = std::min(best, t);
    std::swap(a, b);
  }
  return double(bytes) / best;
}

enum class Op { all_gather, reduce_scatter };

// Best-of-iters time of one collective over a full buffer of `full_bytes` (slowest rank:
// every rank synchronizes, then a barrier-free max over ranks via their own timers).
double collective_seconds(std::vector<RankContext>& ranks, Op op, std::size_t full_bytes, int iters) {
  int n = static_cast<int>(ranks.size());
  std::size_t count = full_bytes / sizeof(float) / n;
  std::vector<std::vector<double>> times(n);
  run_ranks(ranks, [&](RankContext& ctx) {
    Device& dev = *ctx.device;
    Stream& s = dev.compute_stream();
    std::size_t in_elems = op == Op::all_gather ? count : count * n;
    std::size_t out_elems = op == Op::all_gather ? count * n : count;
    auto* in = static_cast<float*>(dev.allocate(in_elems * sizeof(float)));
    auto* out = static_cast<float*>(dev.allocate(out_elems * sizeof(float)));
    dev.fill(in, DType::f32, in_elems, 1.0f + ctx.rank, s);
    dev.fill(out, DType::f32, out_elems, 0.0f, s);
    for (int i = 0; i < iters + 1; ++i) {  // first pass warms pages and Gloo's buffers
      ctx.comm->barrier(s);
      dev.synchronize(s);
      auto t0 = Clock::now();
      if (op == Op::all_gather) {
        ctx.comm->all_gather(in, out, count, DType::f32, s);
      } else {
        ctx.comm->reduce_scatter(in, out, count, DType::f32, ReduceOp::sum, s);
      }
      dev.synchronize(s);
      if (i > 0) times[ctx.rank].push_back(seconds_since(t0));
    }
    dev.deallocate(in);
    dev.deallocate(out);
  });
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    double slowest = 0;
    for (int r = 0; r < n; ++r) slowest = std::max(slowest, times[r][i]);
    best = std::min(best, slowest);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zoe-comm-bench: host-backend all-gather / reduce-scatter bus bandwidth vs memcpy"};
  int world = 2, iters = 3;
  std::size_t min_mib = 1, max_mib = 256;
  bool json = false;
  app.add_option("--world", world, "ranks (threads of this process)")->check(CLI::Range(2, 64));
  app.add_option("--min-mib", min_mib, "smallest full-buffer size, MiB")->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-mib", max_mib, "largest full-buffer size, MiB (sizes double from min)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--iters", iters, "timed iterations per case (best is reported)")->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);

  auto ranks = make_local_ranks(world, 600.0);
  if (!json)
    std::printf("%-16s %10s %12s %12s %8s   (world %d, best of %d)\n", "case", "size", "busbw GB/s", "memcpy GB/s",
                "ratio", world, iters);
  for (std::size_t mib = min_mib; mib <= max_mib; mib *= 2) {
    std::size_t bytes = mib << 20;
    double bound = memcpy_bandwidth(bytes, iters);
    for (Op op : {Op::all_gather, Op::reduce_scatter}) {
      double t = collective_seconds(ranks, op, bytes, iters);
      double busbw = double(bytes) / t * double(world - 1) / double(world);
      const char* name = op == Op::all_gather ? "all_gather" : "reduce_scatter";
      if (json) {
        nlohmann::json j = {{"bench", "comm"},
                            {"case", std::string(name) + "/world" + std::to_string(world) + "/" + std::to_string(mib) + "MiB"},
                            {"value", busbw / 1e9},
                            {"unit", "GB/s"},
                            {"bound", bound / 1e9},
                            {"ratio", busbw / bound}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-16s %7zu MiB %12.2f %12.2f %8.3f\n", name, mib, busbw / 1e9, bound / 1e9, busbw / bound);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
