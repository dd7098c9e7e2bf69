// zoe-comm-bench: bus bandwidth of the host backends' all_gather and reduce_scatter (fp32
// sum), ranks as threads of this process, for buffers of 1 MiB ... 256 MiB, printed next
// to the memcpy bandwidth of the same size measured in the same run. Both backends run in
// the same process: "local" (LocalCommunicator, what make_local_ranks builds: peers'
// buffers read directly) and "gloo" (HostCommunicator over TCP loopback, what
// multi-process runs use); a "local_vs_gloo" line per case gives local's busbw with
// gloo's as the bound, so its ratio is the speedup.
//
// Definitions (nccl-tests, doc/PERFORMANCE.md): S = bytes of the full buffer (all ranks'
// data: all_gather's output, reduce_scatter's input), t = time of one collective (slowest
// rank, best of --iters), algbw = S / t, busbw = algbw * (N-1)/N. The bound is memcpy of S
// bytes between two warm buffers (S / t_memcpy) on one thread: the loopback transport
// moves every byte through at least one such copy (local: exactly one), so ratio =
// busbw / memcpy says how close the collective gets to the memory system.
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
#include "src/comm/gloo_local_ranks.hpp"
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
    for (int i = 0; i < iters + 1; ++i) {  // first pass warms pages and the transport's buffers
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

  HostCommOptions gloo_options;
  gloo_options.timeout = std::chrono::seconds(600);
  struct Backend {
    const char* name;
    std::vector<RankContext> ranks;
  };
  Backend backends[] = {{"local", make_local_ranks(world, 600.0)}, {"gloo", make_gloo_local_ranks(world, gloo_options)}};
  auto print = [&](const std::string& name, std::size_t mib, double value, double bound) {
    if (json) {
      nlohmann::json j = {{"bench", "comm"},
                          {"case", name + "/world" + std::to_string(world) + "/" + std::to_string(mib) + "MiB"},
                          {"value", value / 1e9},
                          {"unit", "GB/s"},
                          {"bound", bound / 1e9},
                          {"ratio", value / bound}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-32s %7zu MiB %12.2f %12.2f %8.3f\n", name.c_str(), mib, value / 1e9, bound / 1e9, value / bound);
    }
    std::fflush(stdout);
  };
  if (!json)
    std::printf("%-32s %10s %12s %12s %8s   (world %d, best of %d; local_vs_gloo: bound = gloo busbw)\n", "case",
                "size", "busbw GB/s", "bound GB/s", "ratio", world, iters);
  for (std::size_t mib = min_mib; mib <= max_mib; mib *= 2) {
    std::size_t bytes = mib << 20;
    double bound = memcpy_bandwidth(bytes, iters);
    for (Op op : {Op::all_gather, Op::reduce_scatter}) {
      const std::string name = op == Op::all_gather ? "all_gather" : "reduce_scatter";
      double busbw[2];
      for (int b = 0; b < 2; ++b) {
        double t = collective_seconds(backends[b].ranks, op, bytes, iters);
        busbw[b] = double(bytes) / t * double(world - 1) / double(world);
        print(std::string(backends[b].name) + "/" + name, mib, busbw[b], bound);
      }
      print("local_vs_gloo/" + name, mib, busbw[0], busbw[1]);
    }
  }
  return 0;
}
