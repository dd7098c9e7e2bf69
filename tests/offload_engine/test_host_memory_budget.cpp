// zoe.host_memory_budget: what the NVMe tiers keep in host memory instead (parameter shards,
// then gradients, then optimizer states; whole shards and sub-groups in order while they fit)
// changes no bit: the same parameters and losses as everything on NVMe, at stages 2-3, 1 and 2
// ranks, one and two micro-batches, with all of it or a part in host memory; the bytes move
// from the NVMe tier to host memory in the memory report, byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/common/host_memory.hpp"
#include "tests/common/log_capture.hpp"
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

// fp32 compute: the gradient on the tier is the fp32 reduced shard (4 bytes per element, one
// micro-batch or two) and the parameter shards are fp32 (4 bytes). Every gradient and some
// states in host memory, or the shards and some gradients, change no bit against budget 0:
// parameters, losses and norms; the bytes kept leave the NVMe tier, byte for byte.
TEST(HostMemoryBudget, Fp32ComputeChangesNoBit) {
  const std::string dir = zoe::test::temp_dir("host-budget-fp32");
  auto fp32 = [&](int stage, int gas, std::int64_t budget, bool params_on_nvme) {
    Config c = config(stage, gas, budget, dir);
    c.bf16.enabled = false;
    if (params_on_nvme) {
      c.zero_optimization.offload_param.device = OffloadDevice::nvme;
      c.zero_optimization.offload_param.nvme_path = dir;
      c.zero_optimization.offload_param.buffer_size = 4096;  // elements: the largest shard fits
      c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard on the tier
    }
    return c;
  };
  auto expect_same_run = [](const RunResult& r, const RunResult& ref) {
    EXPECT_TRUE(bitwise_equal(r, ref)) << "first difference: " << zoe::test::describe_first_difference(r.params, ref.params);
    EXPECT_EQ(r.losses, ref.losses);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (std::size_t s = 0; s < ref.steps.size(); ++s) EXPECT_EQ(r.steps[s].grad_norm, ref.steps[s].grad_norm) << "step " << s;
  };
  struct Case {
    int stage, world, gas;
    bool params_on_nvme;
  };
  for (const Case& k : {Case{2, 1, 1, false}, Case{2, 2, 1, false}, Case{3, 1, 1, false}, Case{3, 2, 1, false},
                        Case{3, 2, 2, false}, Case{3, 1, 1, true}, Case{3, 2, 1, true}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + " world " + std::to_string(k.world) + " gas " +
                 std::to_string(k.gas) + (k.params_on_nvme ? " params on nvme" : ""));
    const RunResult ref = train(fp32(k.stage, k.gas, 0, k.params_on_nvme), kNet, k.world, 8, 16);
    // Per element on NVMe: 12 bytes of states, the 4-byte gradient, and the 4-byte shard.
    const std::int64_t per_element = 16 + (k.params_on_nvme ? 4 : 0);
    ASSERT_EQ(ref.memory[0].nvme_model_states % per_element, 0);
    const std::int64_t elements = ref.memory[0].nvme_model_states / per_element;  // rank 0's; ranks alike
    // Without parameter offload: every gradient, then at most five sub-groups' states (64
    // elements of 12 bytes); with it: every shard, then at most three sub-groups' gradients.
    const std::int64_t first = 4 * elements, then = k.params_on_nvme ? 3 * 64 * 4 : 5 * 64 * 12;
    const RunResult some = train(fp32(k.stage, k.gas, first + then, k.params_on_nvme), kNet, k.world, 8, 16);
    const RunResult all = train(fp32(k.stage, k.gas, std::int64_t{1} << 30, k.params_on_nvme), kNet, k.world, 8, 16);
    expect_same_run(some, ref);
    expect_same_run(all, ref);
    for (int r = 0; r < k.world; ++r) {
      EXPECT_EQ(ref.memory[r].nvme_model_states, per_element * elements) << "rank " << r;
      EXPECT_EQ(all.memory[r].nvme_model_states, 0) << "rank " << r;
      EXPECT_EQ(all.memory[r].host_model_states - ref.memory[r].host_model_states, per_element * elements) << "rank " << r;
      const std::int64_t moved = some.memory[r].host_model_states - ref.memory[r].host_model_states;
      EXPECT_GT(moved, first) << "rank " << r << ": the first kind whole and some of the next";
      EXPECT_LE(moved, first + then) << "rank " << r;
      EXPECT_EQ((moved - first) % (k.params_on_nvme ? 4 : 12), 0) << "rank " << r << ": whole elements";
      EXPECT_EQ(ref.memory[r].nvme_model_states - some.memory[r].nvme_model_states, moved) << "rank " << r;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

// The placement is logged when the tiers are built, one line per tier and rank, naming what the
// budget kept in host memory (exact below 1 KiB, where the size prints in bytes). The layout,
// per rank of 2 with kTinyNet and sub-groups of 16: bf16 shards of 160, 160 and 32 bytes (80,
// 80, 16 elements: l0 with the tied head's weight, l1, head.bias), eleven sub-groups of 16
// elements (32 bytes of gradient, 192 of fp32 states each).
TEST(HostMemoryBudget, ThePlacementIsLoggedWithTheBytesKept) {
  const std::string dir = zoe::test::temp_dir("host-budget-log");
  const NetSpec kTinyNet{{8, 16, 8}, true, 11};
  struct Case {
    std::int64_t budget;
    std::string shards_on_nvme, shards_kept, states_kept;  // what each rank's two lines say
    std::int64_t host;                                     // memory_report().host_model_states
  };
  const std::vector<Case> cases{
      // The first shard (160); the second does not fit the 40 left, then one gradient (32).
      {200, "2 parameter shards on NVMe", "1 in host memory (160 B, zoe.host_memory_budget)",
       "in host memory (32 B, zoe.host_memory_budget): bf16 gradients of 1, the states of 0", 160 + 32},
      // Every shard (352), every gradient (352), three sub-groups' states (576; 100 left over).
      {352 + 352 + 3 * 192 + 100, "0 parameter shards on NVMe", "3 in host memory (352 B, zoe.host_memory_budget)",
       "in host memory (928 B, zoe.host_memory_budget): bf16 gradients of 11, the states of 3", 352 + 352 + 3 * 192},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE("budget " + std::to_string(k.budget));
    Config c = config(3, 1, k.budget, dir);
    c.zero_optimization.sub_group_size = 16;
    c.zero_optimization.offload_param.device = OffloadDevice::nvme;
    c.zero_optimization.offload_param.nvme_path = dir;
    c.zero_optimization.offload_param.buffer_size = 4096;  // elements: the largest shard fits
    c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard on the tier
    zoe::test::LogCapture log;
    const RunResult r = train(c, kTinyNet, 2, 1, 16);
    const std::vector<std::string> shards = log.lines_with("parameter shards on NVMe"),
                                   states = log.lines_with("optimizer states of");
    ASSERT_EQ(shards.size(), 2u) << log.text();
    ASSERT_EQ(states.size(), 2u) << log.text();
    for (int rank = 0; rank < 2; ++rank) {
      const std::string who = "rank " + std::to_string(rank) + ": ";
      // Each rank logs its own lines; the ranks' threads may log in either order.
      const std::string& s = shards[0].rfind(who, 0) == 0 ? shards[0] : shards[1];
      const std::string& o = states[0].rfind(who, 0) == 0 ? states[0] : states[1];
      EXPECT_EQ(s.rfind(who + k.shards_on_nvme, 0), 0u) << s;
      EXPECT_TRUE(s.ends_with(k.shards_kept)) << s;
      EXPECT_EQ(o.rfind(who + "optimizer states of 11 sub-groups (fp32 master", 0), 0u) << o;
      EXPECT_TRUE(o.ends_with(k.states_kept)) << o;
      // What the lines name is what the memory report counts.
      EXPECT_EQ(r.memory[rank].host_model_states, k.host) << "rank " << rank;
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
