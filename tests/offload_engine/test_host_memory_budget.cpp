// zoe.host_memory_budget: what the NVMe tiers keep in host memory instead (parameter shards,
// then gradients, then optimizer states; whole shards and sub-groups in order while they fit)
// changes no bit: the same parameters and losses as everything on NVMe, at stages 2-3, 1 and 2
// ranks, one and two micro-batches, with all of it or a part in host memory; the bytes move
// from the NVMe tier to host memory in the memory report, byte for byte.
#include <gtest/gtest.h>

#include <filesystem>

#include "src/common/host_memory.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::bitwise_equal;
using zoe::test::train;

namespace {

Config config(int stage, int gas, std::int64_t budget, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.gradient_accumulation_steps = gas;
  c.zero_optimization.sub_group_size = 64;  // several sub-groups per group
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zoe.host_memory_budget = budget;
  return c;
}

const NetSpec kNet{{16, 32, 32, 8}, true, 5};

}  // namespace

TEST(HostMemoryBudget, GradientsInHostMemoryChangeNoBit) {
  const std::string dir = zoe::test::temp_dir("host-budget");
  for (int stage : {2, 3})
    for (int world : {1, 2})
      for (int gas : {1, 2}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + " world " + std::to_string(world) + " gas " + std::to_string(gas));
        const RunResult ref = train(config(stage, gas, 0, dir), kNet, world, 8, 16);
        const RunResult all = train(config(stage, gas, std::int64_t{1} << 30, dir), kNet, world, 8, 16);
        // The tier's gradient: bf16 as reduced with one micro-batch per step, else fp32.
        const std::int64_t g = gas == 1 ? 2 : 4;
        const RunResult few = train(config(stage, gas, 3 * 64 * g, dir), kNet, world, 8, 16);  // 3 sub-groups
        EXPECT_TRUE(bitwise_equal(all, ref)) << "every gradient and state in host memory";
        EXPECT_TRUE(bitwise_equal(few, ref)) << "three sub-groups' gradients in host memory";
        for (int k = 0; k < world; ++k) {
          // Everything: the NVMe tier keeps nothing; the 12 + g bytes per element of states and
          // gradient are in host memory.
          const std::int64_t elements = ref.memory[k].nvme_model_states / (12 + g);
          EXPECT_EQ(ref.memory[k].nvme_model_states % (12 + g), 0);
          EXPECT_EQ(all.memory[k].nvme_model_states, 0) << "rank " << k;
          EXPECT_EQ(all.memory[k].host_model_states - ref.memory[k].host_model_states, (12 + g) * elements) << "rank " << k;
          // Three sub-groups of at most 64 elements.
          const std::int64_t moved = few.memory[k].host_model_states - ref.memory[k].host_model_states;
          EXPECT_GT(moved, 0) << "rank " << k;
          EXPECT_LE(moved, 3 * 64 * g) << "rank " << k;
          EXPECT_EQ(ref.memory[k].nvme_model_states - few.memory[k].nvme_model_states, moved) << "rank " << k;
        }
      }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

// After every gradient, what is left of the budget keeps the first sub-groups' states in host
// memory (12 bytes per element, updated in place): the same bits, and the bytes leave NVMe.
TEST(HostMemoryBudget, StatesAfterTheGradientsChangeNoBit) {
  const std::string dir = zoe::test::temp_dir("host-budget-states");
  for (int stage : {2, 3})
    for (int gas : {1, 2}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " gas " + std::to_string(gas));
      const RunResult ref = train(config(stage, gas, 0, dir), kNet, 1, 8, 16);
      const std::int64_t g = gas == 1 ? 2 : 4;
      const std::int64_t elements = ref.memory[0].nvme_model_states / (12 + g);
      // Every gradient, then five sub-groups' states of at most 64 elements.
      const std::int64_t states_budget = 5 * 64 * 12;
      const RunResult some = train(config(stage, gas, g * elements + states_budget, dir), kNet, 1, 8, 16);
      EXPECT_TRUE(bitwise_equal(some, ref));
      EXPECT_EQ(some.losses, ref.losses);
      const std::int64_t moved = some.memory[0].host_model_states - ref.memory[0].host_model_states;
      EXPECT_GT(moved, g * elements) << "some states in host memory";
      EXPECT_LE(moved, g * elements + states_budget);
      EXPECT_EQ((moved - g * elements) % 12, 0) << "whole elements of fp32 states";
      EXPECT_EQ(ref.memory[0].nvme_model_states - some.memory[0].nvme_model_states, moved);
      // A gradient left on NVMe keeps every state there (the order: gradients first).
      const RunResult short_of_gradients = train(config(stage, gas, g * elements - 1, dir), kNet, 1, 8, 16);
      EXPECT_TRUE(bitwise_equal(short_of_gradients, ref));
      EXPECT_LT(short_of_gradients.memory[0].host_model_states - ref.memory[0].host_model_states, g * elements);
    }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

// The budget goes to an NVMe parameter tier's shards first (each read twice a step and written
// once), then to the gradients: the same bits as everything on NVMe, the bytes moved from the
// NVMe tier to host memory in the memory report, at 1 and 2 ranks, 1 and 2 micro-batches.
TEST(HostMemoryBudget, ParameterShardsFirstChangeNoBit) {
  const std::string dir = zoe::test::temp_dir("host-budget-params");
  for (int world : {1, 2})
    for (int gas : {1, 2}) {
      SCOPED_TRACE("world " + std::to_string(world) + " gas " + std::to_string(gas));
      auto cfg = [&](std::int64_t budget) {
        Config c = config(3, gas, budget, dir);
        c.zero_optimization.offload_param.device = OffloadDevice::nvme;
        c.zero_optimization.offload_param.nvme_path = dir;
        c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard on the tier
        return c;
      };
      const RunResult ref = train(cfg(0), kNet, world, 6, 16);
      const RunResult all = train(cfg(std::int64_t{1} << 30), kNet, world, 6, 16);
      const RunResult first = train(cfg(2048), kNet, world, 6, 16);  // the first shard or two, no gradient
      EXPECT_TRUE(bitwise_equal(all, ref)) << "every shard and gradient in host memory";
      EXPECT_TRUE(bitwise_equal(first, ref)) << "the first shards in host memory";
      EXPECT_EQ(all.losses, ref.losses);
      for (int k = 0; k < world; ++k) {
        // Everything the budget keeps leaves the NVMe tier for host memory, byte for byte; with
        // all of it kept, nothing is on NVMe: the bf16 shard, the gradient and the 12 bytes of
        // states per element are in host memory.
        const std::int64_t to_host = all.memory[k].host_model_states - ref.memory[k].host_model_states;
        EXPECT_EQ(ref.memory[k].nvme_model_states - all.memory[k].nvme_model_states, to_host) << "rank " << k;
        EXPECT_EQ(all.memory[k].nvme_model_states, 0) << "rank " << k;
        const std::int64_t g = gas == 1 ? 2 : 4;
        EXPECT_EQ(ref.memory[k].nvme_model_states % (14 + g), 0) << "rank " << k;
        const std::int64_t elements = ref.memory[k].nvme_model_states / (14 + g);
        EXPECT_EQ(to_host, (14 + g) * elements) << "rank " << k << ": the bf16 shard, the gradient and the states";
        const std::int64_t kept = first.memory[k].host_model_states - ref.memory[k].host_model_states;
        EXPECT_GT(kept, 0) << "rank " << k;
        EXPECT_LE(kept, 2048) << "rank " << k;
        EXPECT_EQ(ref.memory[k].nvme_model_states - first.memory[k].nvme_model_states, kept) << "rank " << k;
      }
    }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

TEST(HostMemoryBudget, NeedsTheNvmeTier) {
  Config c;
  c.zero_optimization.stage = 2;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  c.zoe.host_memory_budget = 1 << 20;
  try {
    Engine e(c, make_local_ranks(1)[0]);
    ADD_FAILURE() << "zoe.host_memory_budget was accepted without an NVMe tier";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zoe.host_memory_budget"), std::string::npos) << e.what();
  }
  // An NVMe parameter tier alone has bytes to spare too.
  c.zero_optimization.stage = 3;
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.nvme_path = zoe::test::temp_dir("host-budget-valid");
  EXPECT_NO_THROW(Engine(c, make_local_ranks(1)[0]));
  std::filesystem::remove_all(c.zero_optimization.offload_param.nvme_path);
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zoe.host_memory_budget = -2;  // (-1 is kHostMemoryBudgetAuto)
  EXPECT_THROW(Engine(c, make_local_ranks(1)[0]), ConfigError);
  // "auto" needs an NVMe tier as a byte count does.
  c.zero_optimization.stage = 2;
  c.zero_optimization.offload_param.device = OffloadDevice::none;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  c.zoe.host_memory_budget = ZoeConfig::kHostMemoryBudgetAuto;
  try {
    Engine e(c, make_local_ranks(1)[0]);
    ADD_FAILURE() << "zoe.host_memory_budget \"auto\" was accepted without an NVMe tier";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"auto\" needs an NVMe tier"), std::string::npos) << e.what();
  }
}

// "auto": what this machine can spare, divided by the ranks on it (here in-process ranks, all
// local), resolved at construction. The tiny net's states and gradients fit in it on any
// machine with a few MiB to spare: none on NVMe, and the same bits as everything on NVMe.
TEST(HostMemoryBudget, AutoTakesWhatTheMachineCanSpare) {
  const std::string dir = zoe::test::temp_dir("host-budget-auto");
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const RunResult ref = train(config(3, 1, 0, dir), kNet, world, 8, 16);
    const RunResult all = train(config(3, 1, std::int64_t{1} << 30, dir), kNet, world, 8, 16);
    const RunResult automatic = train(config(3, 1, ZoeConfig::kHostMemoryBudgetAuto, dir), kNet, world, 8, 16);
    EXPECT_TRUE(bitwise_equal(automatic, ref));
    EXPECT_EQ(automatic.losses, ref.losses);
    const std::int64_t spare = spare_host_memory_per_rank(read_host_memory(), world);
    for (int k = 0; k < world; ++k) {
      const std::int64_t needed = ref.memory[k].nvme_model_states;
      ASSERT_GT(needed, 0);
      if (spare >= 2 * needed) {  // (two readings of MemAvailable differ a little)
        EXPECT_EQ(automatic.memory[k].nvme_model_states, 0) << "rank " << k << ", " << spare << " bytes to spare";
        EXPECT_EQ(automatic.memory[k].host_model_states, all.memory[k].host_model_states) << "rank " << k;
      } else {
        EXPECT_LE(automatic.memory[k].host_model_states - ref.memory[k].host_model_states, spare + needed) << "rank " << k;
      }
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}
