// zoe.split_master_weights: the fp32 master weights on the NVMe optimizer tier stored as their
// low 16 bits and a rounded-up bit (in the sign of their exp_avg_sq, never negative), the high
// halves being the bf16 parameter shards.
//  - Split and join give back every non-NaN fp32 value bit for bit, ties included (where the
//    low half alone cannot tell which way the rounding went), and a NaN as a NaN; the moments
//    holding the bits come back unchanged, fp32 and bf16.
//  - Training is bitwise that of fp32 masters: parameters and losses, stage 3 at 1-2 ranks,
//    1-2 micro-batches, the parameter tier in host memory or on NVMe, shards, gradients and
//    states in host memory by zoe.host_memory_budget (those keep fp32 masters), the update in
//    backward, bf16 optimizer states; the NVMe tier holds 2 bytes of master per element instead
//    of 4, and nothing in host memory changes.
//  - With the update in backward each group's update takes the step's last read of its shard
//    (KeptShardReads) instead of reading it again, every time while the prefetch stays within
//    the read buffers, and when it does not (the reads given up are read again) the bits are
//    the same.
//  - Checkpoints and the safetensors export hold fp32 masters: a split-master checkpoint loads
//    into fp32 masters and back, each continuing as the unbroken run.
//  - The key is refused where it cannot be honoured, naming the key that stops it.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/half.hpp"
#include "src/core/test_hooks.hpp"
#include "src/optim/cpu_adam.hpp"
#include "src/optim/split_master.hpp"
#include "tests/common/log_capture.hpp"
#include "tests/core/config_refusal.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::bitwise_equal;
using zoe::test::train;

namespace {

// Moments as exp_avg_sq holds them: never negative (+0 included), fp32 or bf16 bit patterns.
std::vector<std::uint32_t> moments32(std::size_t n) {
  std::mt19937 rng(3);
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i % 5 == 0 ? 0u : std::bit_cast<std::uint32_t>(std::uniform_real_distribution<float>(0.0f, 2.0f)(rng));
  return v;
}
std::vector<std::uint16_t> moments16(std::size_t n) {
  std::vector<std::uint16_t> v(n);
  const std::vector<std::uint32_t> w = moments32(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = kernels::f32_to_bf16(std::bit_cast<float>(w[i]));
  return v;
}

// Splits `w` against its bf16 rounding (the bits into a copy of the moments of `bf16` states)
// and joins it back for an update; the moments must come back unchanged too.
std::vector<float> round_trip(const std::vector<float>& w, bool bf16 = false) {
  const std::size_t n = w.size();
  std::vector<std::uint16_t> high(n), low(n);
  for (std::size_t i = 0; i < n; ++i) high[i] = kernels::f32_to_bf16(w[i]);
  std::vector<float> back(n);
  if (bf16) {
    const std::vector<std::uint16_t> v0 = moments16(n);
    std::vector<std::uint16_t> v = v0;
    optim::split_master(w.data(), high.data(), low.data(), v.data(), true, n);
    optim::join_master_for_update(high.data(), low.data(), v.data(), true, back.data(), n);
    EXPECT_EQ(v, v0) << "bf16 exp_avg_sq changed";
  } else {
    const std::vector<std::uint32_t> v0 = moments32(n);
    std::vector<std::uint32_t> v = v0;
    optim::split_master(w.data(), high.data(), low.data(), v.data(), false, n);
    std::vector<float> read_only(n);
    optim::join_master(high.data(), low.data(), v.data(), false, read_only.data(), n);
    optim::join_master_for_update(high.data(), low.data(), v.data(), false, back.data(), n);
    EXPECT_EQ(std::memcmp(read_only.data(), back.data(), n * sizeof(float)), 0) << "join_master and join_master_for_update";
    EXPECT_EQ(v, v0) << "fp32 exp_avg_sq changed";
  }
  return back;
}

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

TEST(SplitMasterWeights, SplitAndJoinGiveBackEveryValue) {
  std::vector<float> w;
  // Ties: low half 0x8000 with an even and an odd high half (one rounds down, one up), of both
  // signs, and the same bf16 value reached both ways.
  for (std::uint32_t hi : {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u, 0x0000u, 0x8000u, 0x7f7fu, 0xff7fu, 0x0001u})
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) w.push_back(from_bits(hi << 16 | lo));
  // Zeros, subnormals, the largest finite value (rounds up to inf), infinities.
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    w.push_back(f);
  // Random bit patterns (NaNs excluded) and ordinary weights.
  std::mt19937 rng(7);
  while (w.size() < 100003) {
    const float f = from_bits(static_cast<std::uint32_t>(rng()));
    if (!std::isnan(f)) w.push_back(f);
    w.push_back(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
  }
  const std::vector<float> back = round_trip(w);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (std::bit_cast<std::uint32_t>(back[i]) != std::bit_cast<std::uint32_t>(w[i]) && ++differ < 5)
      ADD_FAILURE() << "element " << i << ": 0x" << std::hex << std::bit_cast<std::uint32_t>(w[i]) << " came back as 0x"
                    << std::bit_cast<std::uint32_t>(back[i]);
  EXPECT_EQ(differ, 0u);
  // bf16 optimizer states hold the bits in their bf16 exp_avg_sq the same way.
  EXPECT_EQ(std::memcmp(round_trip(w, true).data(), w.data(), w.size() * sizeof(float)), 0);
  // The CpuAdam's threaded version, in chunks: the same bytes.
  for (bool bf16 : {false, true}) {
    const std::size_t n = w.size();
    std::vector<std::uint16_t> high(n), low(n), low2(n);
    for (std::size_t i = 0; i < n; ++i) high[i] = kernels::f32_to_bf16(w[i]);
    std::vector<std::uint32_t> v32 = moments32(n), v32b = v32;
    std::vector<std::uint16_t> v16 = moments16(n), v16b = v16;
    void* v = bf16 ? static_cast<void*>(v16.data()) : v32.data();
    void* v2 = bf16 ? static_cast<void*>(v16b.data()) : v32b.data();
    optim::split_master(w.data(), high.data(), low.data(), v, bf16, n);
    optim::CpuAdam adam(2);
    adam.split_master(w.data(), high.data(), low2.data(), v2, bf16, n);
    EXPECT_EQ(low2, low);
    EXPECT_EQ(v32b, v32);
    EXPECT_EQ(v16b, v16);
    std::vector<float> joined(n);
    adam.join_master_for_update(high.data(), low.data(), v, bf16, joined.data(), n);
    EXPECT_EQ(std::memcmp(joined.data(), back.data(), n * sizeof(float)), 0);
  }
  // The tie the bit settles: 0x3f808000 rounds down to 0x3f80 (even) and 0x3f7f8000 up to it.
  const std::vector<float> tie = round_trip({from_bits(0x3f808000u), from_bits(0x3f7f8000u)});
  EXPECT_EQ(std::bit_cast<std::uint32_t>(tie[0]), 0x3f808000u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(tie[1]), 0x3f7f8000u);
  // A NaN stays a NaN of its sign.
  const std::vector<float> nan = round_trip({from_bits(0x7f800001u), from_bits(0xffc12345u)});
  EXPECT_TRUE(std::isnan(nan[0]) && !std::signbit(nan[0]));
  EXPECT_TRUE(std::isnan(nan[1]) && std::signbit(nan[1]));
}

namespace {

const NetSpec kNet{{16, 32, 32, 8}, true, 5};

struct Mode {
  int world = 1, gas = 1;
  OffloadDevice params = OffloadDevice::nvme;
  std::int64_t budget = 0;  // zoe.host_memory_budget: the first shards, then gradients, then states
  bool in_backward = false;
  OptimizerStateDType states = OptimizerStateDType::fp32;
  std::string name() const {
    return "world " + std::to_string(world) + " gas " + std::to_string(gas) + " params " +
           (params == OffloadDevice::nvme ? "nvme" : "cpu") + (budget ? " host budget " + std::to_string(budget) : "") +
           (in_backward ? " update in backward" : "") + (states == OptimizerStateDType::bf16 ? " bf16 states" : "");
  }
};

Config config_of(const Mode& m, bool split, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zoe.optimizer_threads = 1;
  c.gradient_accumulation_steps = m.gas;
  c.zero_optimization.sub_group_size = 64;  // several sub-groups per group
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard on the tier
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zero_optimization.offload_param.device = m.params;
  c.zero_optimization.offload_param.nvme_path = dir;
  c.zoe.host_memory_budget = m.budget;
  c.zoe.update_in_backward = m.in_backward;
  c.zoe.optimizer_state_dtype = m.states;
  c.zoe.split_master_weights = split;
  return c;
}

}  // namespace

TEST(SplitMasterWeights, TrainBitwiseAsFp32MastersWithFewerNvmeBytes) {
  const std::string dir = zoe::test::temp_dir("split-master");
  std::vector<Mode> modes;
  for (int world : {1, 2})
    for (int gas : {1, 2}) {
      modes.push_back(Mode{world, gas, OffloadDevice::nvme});
      modes.push_back(Mode{world, gas, OffloadDevice::cpu});
    }
  modes.push_back(Mode{2, 1, OffloadDevice::nvme, 2048});  // every shard, some gradients
  modes.push_back(Mode{2, 1, OffloadDevice::nvme, 0, true});
  modes.push_back(Mode{2, 2, OffloadDevice::nvme, 0, false, OptimizerStateDType::bf16});
  // Every shard, then most states in host memory (fp32 masters there, split on NVMe).
  modes.push_back(Mode{1, 1, OffloadDevice::nvme, 16384, true, OptimizerStateDType::bf16});
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name());
    const RunResult ref = train(config_of(m, false, dir), kNet, m.world, 6, 16);
    const RunResult split = train(config_of(m, true, dir), kNet, m.world, 6, 16);
    EXPECT_TRUE(bitwise_equal(split, ref));
    EXPECT_EQ(split.losses, ref.losses);
    ASSERT_EQ(split.steps.size(), ref.steps.size());
    for (std::size_t s = 0; s < ref.steps.size(); ++s) EXPECT_EQ(split.steps[s].grad_norm, ref.steps[s].grad_norm);
    for (int k = 0; k < m.world; ++k) {
      // The master: 4 bytes per element on NVMe against 2 (its bit rides in exp_avg_sq's
      // sign); nothing else moves: an even number of bytes saved, 2 per element split.
      const std::int64_t saved = ref.memory[k].nvme_model_states - split.memory[k].nvme_model_states;
      EXPECT_GT(saved, 0) << "rank " << k;
      EXPECT_EQ(saved % 2, 0) << "rank " << k;
      EXPECT_EQ(split.memory[k].host_model_states, ref.memory[k].host_model_states) << "rank " << k;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

TEST(SplitMasterWeights, TheUpdateInBackwardTakesTheStepsReadOfTheShard) {
  namespace hooks = zoe::core::test_hooks;
  const std::string dir = zoe::test::temp_dir("split-master-kept");
  std::atomic<std::int64_t> updates{0};
  hooks::after_group_update = [&](int) { updates.fetch_add(1); };
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Config c = config_of(Mode{world, 1, OffloadDevice::nvme, 0, true}, true, dir);
    const RunResult ref = train(config_of(Mode{world, 1, OffloadDevice::nvme, 0, true}, false, dir), kNet, world, 6, 16);
    // Each module gathered again in backward, one module prefetched: every update finds its read.
    c.zero_optimization.stage3_max_reuse_distance = 0;
    c.zero_optimization.stage3_prefetch_bucket_size = 1;
    // An update that reads its shard again says so, once per engine (each rank its own).
    const std::string again = "split-master updates read their parameter shard from NVMe again";
    updates = 0;
    hooks::kept_shard_reads_taken = 0;
    zoe::test::LogCapture kept_log;
    const RunResult kept = train(c, kNet, world, 6, 16);
    EXPECT_GT(updates.load(), 0);
    EXPECT_EQ(hooks::kept_shard_reads_taken.load(), updates.load()) << "an update read its shard from NVMe again";
    EXPECT_TRUE(kept_log.lines_with(again).empty()) << kept_log.text();
    EXPECT_TRUE(bitwise_equal(kept, ref));
    EXPECT_EQ(kept.losses, ref.losses);
    // The default prefetch reads this small model whole ahead, here more than its two read
    // buffers hold: some reads are given up (and their shards read again), the same bits.
    c.zero_optimization.stage3_prefetch_bucket_size = Config{}.zero_optimization.stage3_prefetch_bucket_size;
    c.zero_optimization.offload_param.buffer_count = 3;
    updates = 0;
    hooks::kept_shard_reads_taken = 0;
    hooks::kept_shard_reads_dropped = 0;
    zoe::test::LogCapture deep_log;
    const RunResult deep = train(c, kNet, world, 6, 16);
    EXPECT_LT(hooks::kept_shard_reads_taken.load(), updates.load());
    EXPECT_GT(hooks::kept_shard_reads_dropped.load(), 0);
    const std::vector<std::string> said = deep_log.lines_with(again);
    EXPECT_EQ(said.size(), static_cast<std::size_t>(world)) << deep_log.text();
    for (const std::string& line : said) EXPECT_NE(line.find("offload_param.buffer_count = 3"), std::string::npos) << line;
    EXPECT_TRUE(bitwise_equal(deep, ref));
    EXPECT_EQ(deep.losses, ref.losses);
  }
  hooks::after_group_update = nullptr;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

namespace {

constexpr std::int64_t kN = 1000;  // one parameter, sub-groups of 64

/// Runs steps first+1 .. first+steps of a one-parameter model (the trainer's gradient of step t
/// is hashed from t), loading `load` first and saving to `save` and exporting to `exported`
/// after, if given. Returns the final fp32 masters (rank 0's gather).
std::vector<float> run(bool split, const std::string& nvme, std::int64_t first, int steps, const std::string& load = {},
                       const std::string& save = {}, const std::string& exported = {}) {
  std::vector<float> result;
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config_of(Mode{2, 1, OffloadDevice::nvme}, split, nvme), ctx);
    std::vector<float> init(kN);
    for (std::int64_t i = 0; i < kN; ++i) init[static_cast<std::size_t>(i)] = zoe::test::hashed_uniform(99, i, 1.0f);
    const ParamId p = e.add_parameter("w", {kN}, init);
    const ModuleId mod = e.add_module("m", {p});
    if (!load.empty()) e.load_checkpoint(load);
    for (int s = 0; s < steps; ++s) {
      { ForwardScope f(e, mod); }
      {
        BackwardScope b(e, mod);
        const TensorView& g = b.tensors().grads[0];
        for (std::int64_t i = 0; i < kN; ++i)
          zoe::test::add(g, i, zoe::test::hashed_uniform(static_cast<std::uint64_t>(first + s + 1), i, 0.5f));
      }
      e.step();
    }
    e.synchronize();
    if (!save.empty()) e.save_checkpoint(save);
    if (!exported.empty()) e.export_safetensors(exported);
    std::vector<float> w = e.gather_parameter(p);
    if (ctx.rank == 0) result = std::move(w);
  });
  return result;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(SplitMasterWeights, CheckpointsAndExportHoldFp32Masters) {
  const std::string dir = zoe::test::temp_dir("split-master-ckpt");
  const std::string nvme = dir + "/nvme";
  std::filesystem::create_directories(nvme);
  const std::vector<float> unbroken = run(false, nvme, 0, 6, {}, {}, dir + "/fp32.safetensors");
  EXPECT_TRUE(same_bits(run(true, nvme, 0, 6, {}, {}, dir + "/split.safetensors"), unbroken)) << "split masters";
  EXPECT_EQ(file_bytes(dir + "/split.safetensors"), file_bytes(dir + "/fp32.safetensors")) << "the fp32 export";
  // Half way in one mode, then on in the other: the unbroken run's bits either way.
  (void)run(true, nvme, 0, 3, {}, dir + "/split-3");
  (void)run(false, nvme, 0, 3, {}, dir + "/fp32-3");
  EXPECT_TRUE(same_bits(run(false, nvme, 3, 3, dir + "/split-3"), unbroken)) << "split checkpoint into fp32 masters";
  EXPECT_TRUE(same_bits(run(true, nvme, 3, 3, dir + "/fp32-3"), unbroken)) << "fp32 checkpoint into split masters";
  EXPECT_TRUE(same_bits(run(true, nvme, 3, 3, dir + "/split-3"), unbroken)) << "split checkpoint into split masters";
  EXPECT_TRUE(std::filesystem::is_empty(nvme)) << "NVMe files left behind in " << nvme;
  std::filesystem::remove_all(dir);
}

TEST(SplitMasterWeights, RefusedWhereItCannotBeHonoured) {
  const std::string dir = zoe::test::temp_dir("split-master-refused");
  auto refused = [](const Config& c, const std::string& needle) {
    zoe::test::expect_config_refused(c, "zoe.split_master_weights", needle);
  };
  const Config good = config_of(Mode{}, true, dir);
  EXPECT_NO_THROW(Engine(good, make_local_ranks(1)[0]));
  Config c = good;
  c.zero_optimization.offload_param.device = OffloadDevice::none;
  refused(c, "offload_param.device");
  c = good;
  c.zero_optimization.stage = 2;
  c.zero_optimization.offload_param.device = OffloadDevice::none;
  refused(c, "stage 2");
  c = good;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  refused(c, "offload_optimizer.device");
  c = good;
  c.bf16.enabled = false;
  refused(c, "bf16");
  c.fp16.enabled = true;
  refused(c, "f16");
  const Config parsed = Config::from_json(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}, "offload_param": {"device": "cpu"}},
      "zoe": {"split_master_weights": true}})");
  EXPECT_TRUE(parsed.zoe.split_master_weights);
  EXPECT_NE(parsed.to_json().find("\"split_master_weights\": true"), std::string::npos);
  std::filesystem::remove_all(dir);
}
