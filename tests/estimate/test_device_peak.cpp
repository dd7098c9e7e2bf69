// zoe-estimate's device working buffers against the engine's measured allocated peak
// (MemoryReport::device_peak, torch's max_memory_allocated: live bytes, not the host device's
// block cache): model_states.device + buffers.device a bound on it, at most 10% above, for a GPT-shaped model
// trained as zoe-gpt trains it with activation checkpointing (an embedding tied to a head that
// computes inside its backward scope, blocks recomputed right before their backward), at
// ZeRO-3 with parameter offload (cpu, nvme), prefetch on and off, and at ZeRO-2. Also checked:
// the reserved peak (block cache included) is at least the allocated peak.
// The allocated peak does not depend on the side stream's pace: a released buffer is returned
// at a fixed point, the acquire after the next one (the Gatherer's rate limit: what was
// released before the previous module began is returned, waiting for the side stream if it
// fell behind), never earlier because the side stream happened to have passed it. (It once
// was, and a loaded CI machine measured 30.5 MiB where a quiet one measured 36.2.) So the band
// is 10% of the measured peak, on a quiet or a loaded machine alike.
// Ranks are threads on the host device; with ZOE_HOST_MEMORY=discrete (the _discrete entry)
// its modelled copy engines move every host <-> device byte.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "src/config/estimate.hpp"
#include "zoe/engine.hpp"

namespace {
using namespace zoe;

// The embedding (the largest module; wte tied to the head), kBlocks blocks, the head's own
// layer norm. Elements.
constexpr std::int64_t kEmbedding = 4'000'000, kBlock = 1'000'000, kHeadNorm = 1024;
constexpr int kBlocks = 6, kSteps = 2;

estimate::ModelShape shape(int blocks) {
  return estimate::ModelShape{kEmbedding + blocks * kBlock + kHeadNorm, kEmbedding, 0, kBlock};
}

// One rank's allocated and reserved device peaks over kSteps steps.
struct Peaks {
  std::int64_t allocated = 0, reserved = 0;
};

std::vector<Peaks> train(const Config& config, int world, int block_count) {
  std::vector<Peaks> peaks(static_cast<std::size_t>(world));
  run_ranks(make_local_ranks(world, 120.0), [&](RankContext& ctx) {
    Engine e(config, ctx);
    const ParamId wte = e.add_parameter("wte", {kEmbedding}, std::vector<float>(kEmbedding, 0.01f));
    const ModuleId embedding = e.add_module("embedding", {wte});
    std::vector<ModuleId> blocks;
    for (int i = 0; i < block_count; ++i) {
      const ParamId w = e.add_parameter("block" + std::to_string(i), {kBlock}, std::vector<float>(kBlock, 0.02f));
      blocks.push_back(e.add_module("block" + std::to_string(i), {w}));
    }
    const ParamId norm = e.add_parameter("ln_f", {kHeadNorm}, std::vector<float>(kHeadNorm, 1.0f));
    const ModuleId head = e.add_module("head", {norm, wte}, ForwardMode::in_backward);
    for (int step = 0; step < kSteps; ++step) {
      { ForwardScope f(e, embedding); }
      for (ModuleId b : blocks) ForwardScope f(e, b);
      { BackwardScope bw(e, head); }
      for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        { ForwardScope recompute(e, *it); }
        BackwardScope bw(e, *it);
      }
      { BackwardScope bw(e, embedding); }
      e.step();
    }
    e.synchronize();
    const MemoryReport m = e.memory_report();
    peaks[static_cast<std::size_t>(ctx.rank)] = Peaks{m.device_peak, m.device_reserved_peak};
  });
  return peaks;
}

class DevicePeak : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("zoe-device-peak-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Config config(int stage, OffloadDevice optimizer, OffloadDevice param) const {
    Config c;
    c.bf16.enabled = true;
    c.zero_optimization.stage = stage;
    c.zero_optimization.reduce_bucket_size = 0;  // each group reduced on its own, as the scale demo
    c.zero_optimization.offload_optimizer.device = optimizer;
    c.zero_optimization.offload_optimizer.nvme_path = dir_;
    c.zero_optimization.offload_param.device = param;
    c.zero_optimization.offload_param.nvme_path = dir_;
    c.zoe.optimizer_threads = 1;
    return c;
  }

  // The step's scalars (the gradient norm, the overflow flag, a few bytes each), which the
  // estimate does not model.
  static constexpr std::int64_t kUnmodelled = 64 * 1024;

  // The estimate's device bytes (model states + working buffers) are a bound on every rank's
  // allocated peak (never below it: a run the estimate says fits does fit) and at most `over`
  // above it.
  void expect_bound_on_measured(const Config& c, int world, const char* what, double over = 0.10,
                                int blocks = kBlocks) {
    SCOPED_TRACE(what);
    const estimate::RankEstimate est = estimate::estimate_rank(shape(blocks), world, c, estimate::Coalescing::in_place);  // ranks as threads
    const std::int64_t predicted = est.model_states.device + est.buffers.device;
    for (const Peaks& p : train(c, world, blocks)) {
      std::printf("%s (world %d): predicted %.2f MiB, allocated peak %.2f MiB (ratio %.3f), reserved peak %.2f MiB\n",
                  what, world, predicted / 1048576.0, p.allocated / 1048576.0,
                  static_cast<double>(predicted) / static_cast<double>(p.allocated), p.reserved / 1048576.0);
      EXPECT_GE(predicted + kUnmodelled, p.allocated);
      EXPECT_LE(static_cast<double>(predicted), (1.0 + over) * static_cast<double>(p.allocated));
      EXPECT_GE(p.reserved, p.allocated);
    }
  }
  std::string dir_;
};

TEST_F(DevicePeak, StageThreeWithParameterOffload) {
  expect_bound_on_measured(config(3, OffloadDevice::cpu, OffloadDevice::cpu), 1, "stage 3, cpu/cpu");
  expect_bound_on_measured(config(3, OffloadDevice::nvme, OffloadDevice::nvme), 1, "stage 3, nvme/nvme");
  // 12.9% over at world 2, as with prefetch off below: the in-place coalesced gathers of ranks
  // as threads stage nothing beyond the tier's shards (packed, they held 2.9 MiB more: 2.9% over).
  expect_bound_on_measured(config(3, OffloadDevice::nvme, OffloadDevice::nvme), 2, "stage 3, nvme/nvme", 0.15);
}

// Two blocks under a large embedding: the peak is in the first step (no recorded order, so
// nothing prefetched or kept), at the embedding's backward, with the block before it still held:
// its gather, its gradient and reduced shard and its shard staged from the parameter tier,
// freed but given back only at the next acquire. The estimate once left that staged shard out
// (a GPT-2 of 4 layers, width 1,024: 0.947 of the measured peak).
TEST_F(DevicePeak, StageThreeFirstStepPeak) {
  expect_bound_on_measured(config(3, OffloadDevice::nvme, OffloadDevice::nvme), 1, "stage 3, nvme/nvme, 2 blocks", 0.02, 2);
  expect_bound_on_measured(config(3, OffloadDevice::cpu, OffloadDevice::cpu), 1, "stage 3, cpu/cpu, 2 blocks", 0.02, 2);
}

TEST_F(DevicePeak, StageThreePrefetchOnAndOff) {
  Config c = config(3, OffloadDevice::nvme, OffloadDevice::nvme);
  c.zero_optimization.stage3_prefetch_bucket_size = 0;
  expect_bound_on_measured(c, 1, "stage 3, nvme/nvme, prefetch off");
  // 12.9% over at world 2: the estimate's later steps keep every module gathered for reuse
  // (stage3_max_reuse_distance's default); the measured peak, in the head's backward, holds
  // the tied embedding gathered, its gradient and reduced shard and one block, no others.
  expect_bound_on_measured(c, 2, "stage 3, nvme/nvme, prefetch off", 0.15);
  // Not asserted: with stage3_max_reuse_distance 0 every module is gathered again in backward
  // (the recompute, then the backward), and how many of those gathers and staged shards wait
  // to be freed depends on the side stream's pace: 36.2 MiB on the unified
  // device, 47.7 MiB on the discrete one with its modelled copies; with prefetch one block
  // 45.8 MiB (see RankEstimate::buffers).
}

TEST_F(DevicePeak, StageTwo) {
  expect_bound_on_measured(config(2, OffloadDevice::cpu, OffloadDevice::none), 1, "stage 2, cpu");
  expect_bound_on_measured(config(2, OffloadDevice::nvme, OffloadDevice::none), 2, "stage 2, nvme");
}
}  // namespace
