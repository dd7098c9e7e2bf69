// Construction against max(initializer alone, writes alone). One rank on the host device, ZeRO
// stage 3, bf16, offload_optimizer and offload_param on NVMe (the scale demo's tiers), `modules`
// modules of one parameter each. Per repetition and initializer:
//  - initializer alone: the initializer over every element into one sub-group's buffer;
//  - writes alone: 18 * psi bytes (what construction writes) through an NvmeStore on the same
//    directory, one tensor per sub-group of states and one per module's bf16 shard, from
//    buffer_count pinned buffers kept in flight (swap_out computes the CRC, as the tiers do);
//  - construction: a fresh Engine's first begin_forward (tiers opened, values streamed).
// Ideal pipelining gives construction = max(initializer, writes) plus one chunk's compute and
// the tiers' opening; the ratio to that max is the figure (target <= 1.1).
#include "bench/offload/construction_bench.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "src/offload/nvme_store.hpp"
#include "src/offload/pinned_pool.hpp"
#include "zoe/engine.hpp"

namespace zoe::bench {
namespace {

using Init = std::function<void(std::int64_t param, std::int64_t offset, std::span<float> out)>;

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// GPT-2's normal init as examples/gpt/model_spec.cpp computes it (pair j from draws 2j, 2j+1
// of a counter-based splitmix64 stream, Box-Muller in double), on one thread.
void normal_init(std::int64_t param, std::int64_t offset, std::span<float> out) {
  const auto n = static_cast<std::int64_t>(out.size());
  const std::uint64_t state0 = 0x1234567ull + static_cast<std::uint64_t>(param) * 0x9E3779B97F4A7C15ull;
  for (std::int64_t j = offset / 2; j < (offset + n + 1) / 2; ++j) {
    std::uint64_t state = state0 + static_cast<std::uint64_t>(2 * j) * 0x9E3779B97F4A7C15ull;
    auto uniform = [&] { return (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53; };
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 2.0 * M_PI * uniform();
    const std::int64_t e0 = 2 * j - offset, e1 = e0 + 1;
    if (e0 >= 0 && e0 < n) out[static_cast<std::size_t>(e0)] = static_cast<float>(0.02 * r * std::cos(a));
    if (e1 >= 0 && e1 < n) out[static_cast<std::size_t>(e1)] = static_cast<float>(0.02 * r * std::sin(a));
  }
}

void cheap_init(std::int64_t param, std::int64_t offset, std::span<float> out) {
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = 1e-3f * static_cast<float>((offset + static_cast<std::int64_t>(i) + param) % 1021);
}

double init_alone(const ConstructionBenchOptions& o, std::int64_t per_module, const Init& init) {
  std::vector<float> chunk(static_cast<std::size_t>(std::min(o.sub_group_numel, per_module)));
  return seconds([&] {
    for (int m = 0; m < o.modules; ++m)
      for (std::int64_t a = 0; a < per_module; a += static_cast<std::int64_t>(chunk.size())) {
        const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(chunk.size()), per_module - a);
        init(m, a, std::span<float>(chunk.data(), static_cast<std::size_t>(n)));
      }
  });
}

// The construction's bytes written alone: per module its sub-groups' 16 B/element states
// (12 B states + 4 B gradient, as two tensors like the optimizer tier) and its 2 B/element shard.
double writes_alone(const ConstructionBenchOptions& o, std::int64_t per_module) {
  std::vector<std::size_t> sizes;
  for (int m = 0; m < o.modules; ++m) {
    for (std::int64_t a = 0; a < per_module; a += o.sub_group_numel) {
      const auto n = static_cast<std::size_t>(std::min(o.sub_group_numel, per_module - a));
      sizes.push_back(12 * n);
      sizes.push_back(4 * n);
    }
    sizes.push_back(2 * static_cast<std::size_t>(per_module));
  }
  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
  offload::PinnedPoolOptions po;
  po.buffer_count = static_cast<std::size_t>(o.buffer_count);
  po.buffer_bytes = (largest + 4095) / 4096 * 4096;
  po.holder = "construction bench writes";
  offload::PinnedPool pool(po);
  offload::NvmeStoreOptions so = offload::NvmeStoreOptions::from_aio(AioConfig{}, false, o.nvme_dir, 0);
  so.fixed_buffers = pool.buffers();
  offload::NvmeStore store(so);
  for (std::size_t i = 0; i < sizes.size(); ++i) store.register_tensor("t" + std::to_string(i), sizes[i]);
  std::vector<offload::PinnedBuffer> buffers;
  for (int b = 0; b < o.buffer_count; ++b) {
    buffers.push_back(pool.acquire());
    std::fill_n(static_cast<char*>(buffers.back().data()), po.buffer_bytes, 1);
  }
  return seconds([&] {
    std::deque<offload::SwapHandle> in_flight;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (in_flight.size() == buffers.size()) {
        in_flight.front().wait();
        in_flight.pop_front();
      }
      in_flight.push_back(store.swap_out("t" + std::to_string(i), buffers[i % buffers.size()].data(), sizes[i]));
    }
    for (auto& h : in_flight) h.wait();
  });
}

// Returns the first begin_forward's seconds; `in_init`: of which inside the initializer (on the
// engine's thread, beside the writer's stores).
double construction(const ConstructionBenchOptions& o, std::int64_t per_module, const Init& init, double& in_init) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.zero_optimization.sub_group_size = o.sub_group_numel;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = o.nvme_dir;
  c.zero_optimization.offload_optimizer.buffer_count = o.buffer_count;
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.nvme_path = o.nvme_dir;
  c.zero_optimization.offload_param.buffer_count = o.buffer_count;
  c.zero_optimization.offload_param.buffer_size = per_module + 4096;
  std::vector<RankContext> ranks = make_local_ranks(1);
  Engine e(c, ranks[0]);
  std::vector<ModuleId> modules;
  in_init = 0;
  for (int m = 0; m < o.modules; ++m) {
    ParamId p = e.add_parameter("m" + std::to_string(m) + ".w", {per_module},
                                [&init, &in_init, m](std::int64_t offset, std::span<float> out) {
                                  in_init += seconds([&] { init(m, offset, out); });
                                });
    modules.push_back(e.add_module("m" + std::to_string(m), {p}));
  }
  const double t = seconds([&] { e.begin_forward(modules[0]); });
  e.end_forward(modules[0]);
  return t;
}

}  // namespace

void run_construction_case(const ConstructionBenchOptions& o, const Report& report) {
  const std::int64_t per_module = o.psi / o.modules / 16 * 16;
  const double bytes = 18.0 * static_cast<double>(per_module) * o.modules;
  const std::string size = "psi=" + std::to_string(per_module * o.modules / 1'000'000) + "M";
  for (const auto& [name, init] : {std::pair<std::string, Init>{"cheap", cheap_init}, {"normal", normal_init}}) {
    std::vector<double> inits, writes, builds, ratios;
    for (int r = 0; r < o.reps; ++r) {
      inits.push_back(init_alone(o, per_module, init));
      writes.push_back(writes_alone(o, per_module));
      double in_init = 0;
      builds.push_back(construction(o, per_module, init, in_init));
      ratios.push_back(builds.back() / std::max(inits.back(), writes.back()));
      report.text("#   construction %s %s rep %d: %.2f s (%.2f s of it in the initializer); initializer alone %.2f s, "
                  "writes alone %.2f s (%.3f GB/s)\n",
                  size.c_str(), name.c_str(), r, builds.back(), in_init, inits.back(), writes.back(),
                  bytes / writes.back() / 1e9);
    }
    const double tb = median(builds), ti = median(inits), tw = median(writes);
    report.line("nvme construction " + size + " " + name + " init vs max", tb, "s", std::max(ti, tw), median(ratios),
                "(max of initializer alone and writes alone)");
    report.line("nvme construction " + size + " " + name + " write rate vs writes alone", bytes / tb / 1e9, "GB/s",
                bytes / tw / 1e9, tw / tb);
  }
}

}  // namespace zoe::bench
