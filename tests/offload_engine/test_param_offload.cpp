// Parameter offload (stage 3, ZeRO-Infinity): parameter shards in host memory or on NVMe,
// combined with optimizer offload none / cpu / nvme, at world sizes 1, 2 and 4, give the
// same parameters bit for bit as the run with everything on the device; the shards are
// accounted on their tier and leave the device; one pinned read buffer is enough.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "src/device/device.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::bitwise_equal;
using zoe::test::train;

namespace {

std::string temp_dir(const std::string& tag) { return zoe::test::temp_dir("poff-" + tag); }

Config config(OffloadDevice params, OffloadDevice optimizer, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 64;
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every group is gathered and freed
  c.zero_optimization.offload_optimizer.device = optimizer;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zero_optimization.offload_param.device = params;
  c.zero_optimization.offload_param.nvme_path = dir;
  c.zero_optimization.offload_param.buffer_count = 3;
  c.zero_optimization.offload_param.buffer_size = 2048;  // elements: the largest shard fits
  return c;
}

const char* name(OffloadDevice d) { return d == OffloadDevice::none ? "none" : d == OffloadDevice::cpu ? "cpu" : "nvme"; }

const NetSpec kNet{{16, 32, 32, 8}, true, 5};

}  // namespace

class ParamOffload : public ::testing::TestWithParam<int> {};

TEST_P(ParamOffload, TwentyStepsBitwiseEqualToNoOffload) {
  const int world = GetParam();
  std::string dir = temp_dir("eq");
  RunResult ref = train(config(OffloadDevice::none, OffloadDevice::none, dir), kNet, world, 20, 16);
  for (OffloadDevice p : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (OffloadDevice o : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
      RunResult r = train(config(p, o, dir), kNet, world, 20, 16);
      EXPECT_TRUE(bitwise_equal(r, ref)) << "params " << name(p) << ", optimizer " << name(o) << ", world " << world;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Engine, ParamOffload, ::testing::Values(1, 2, 4));

TEST(ParamOffloadEdge, OneReadBufferRatioAndMicroBatches) {
  std::string dir = temp_dir("edge");
  Config none = config(OffloadDevice::none, OffloadDevice::none, dir);
  none.gradient_accumulation_steps = 2;
  RunResult ref = train(none, kNet, 2, 8, 32);
  Config c = config(OffloadDevice::nvme, OffloadDevice::nvme, dir);
  c.gradient_accumulation_steps = 2;
  c.zero_optimization.offload_param.buffer_count = 2;      // one read buffer, one for write-back
  c.zero_optimization.offload_optimizer.ratio = 0.5;       // device sub-groups write back too
  c.zero_optimization.stage3_prefetch_bucket_size = 1 << 20;  // prefetch wants more than one buffer
  EXPECT_TRUE(bitwise_equal(train(c, kNet, 2, 8, 32), ref));
  c.zoe.overlap_step = false;
  EXPECT_TRUE(bitwise_equal(train(c, kNet, 2, 8, 32), ref));
  std::filesystem::remove_all(dir);
}

TEST(ParamOffloadEdge, ShardsAreAccountedOnTheirTier) {
  std::string dir = temp_dir("acct");
  const int world = 2;
  RunResult none = train(config(OffloadDevice::none, OffloadDevice::cpu, dir), kNet, world, 1, 16);
  RunResult cpu = train(config(OffloadDevice::cpu, OffloadDevice::cpu, dir), kNet, world, 1, 16);
  RunResult nvme = train(config(OffloadDevice::nvme, OffloadDevice::cpu, dir), kNet, world, 1, 16);
  for (int r = 0; r < world; ++r) {
    // The bf16 shards (2 bytes per element of this rank's shard) leave the device.
    const std::int64_t shards = none.memory[r].device_model_states - cpu.memory[r].device_model_states;
    EXPECT_GT(shards, 0);
    EXPECT_EQ(shards % 32, 0);  // whole 16-element-aligned shards of 2 bytes
    EXPECT_EQ(cpu.memory[r].host_model_states - none.memory[r].host_model_states, shards);
    EXPECT_EQ(nvme.memory[r].nvme_model_states, shards);
    EXPECT_EQ(nvme.memory[r].host_model_states, none.memory[r].host_model_states);
    EXPECT_EQ(nvme.memory[r].device_model_states, cpu.memory[r].device_model_states);
    // Pinned buffers: buffer_count x buffer_size elements x 2 bytes, rounded up to 4 KiB each;
    // without parameter offload the update pipeline stages the new parameters bound for the
    // device in two pages of its own (64 x 2 bytes each), which the parameter tier replaces.
    EXPECT_EQ(nvme.memory[r].host_buffers - none.memory[r].host_buffers, 3 * 4096 - 2 * 4096);
    EXPECT_EQ(nvme.memory[r].host_pinned_peak - none.memory[r].host_pinned_peak, 3 * 4096 - 2 * 4096);
    EXPECT_EQ(cpu.memory[r].host_buffers, none.memory[r].host_buffers - 2 * 4096);
  }
  std::filesystem::remove_all(dir);
}

TEST(ParamOffloadEdge, ShardLargerThanTheBufferIsAConfigError) {
  std::string dir = temp_dir("big");
  Config c = config(OffloadDevice::nvme, OffloadDevice::none, dir);
  c.zero_optimization.offload_param.buffer_size = 16;
  try {
    train(c, kNet, 1, 1, 16);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.buffer_size"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The hot path moves data between device and host only through registered (pinned) memory:
// a stage-3 step with optimizer states on NVMe (parameters on the device, in host memory or on
// NVMe; every sub-group offloaded, or half of them) makes no pageable copy
// (Device::pageable_copy_count, which the discrete host device and CUDA count).
TEST(ParamOffloadEdge, StageThreeNvmeStepMakesNoPageableCopy) {
  std::string dir = temp_dir("pageable");
  for (OffloadDevice params : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (double ratio : {1.0, 0.5}) {
      Config c = config(params, OffloadDevice::nvme, dir);
      c.zero_optimization.offload_optimizer.ratio = ratio;
      auto ranks = make_local_ranks(2, 60.0);
      std::vector<std::int64_t> copies(2, -1);
      run_ranks(ranks, [&](RankContext& ctx) {
        Engine e(c, ctx);
        zoe::test::TestNet net(e, kNet);
        net.micro_batch(ctx.rank * 8, 8);  // the first step also writes the initial values
        e.step();
        const std::int64_t before = ctx.device->pageable_copy_count();
        net.micro_batch(16 + ctx.rank * 8, 8);  // forward after the update, backward, step
        e.step();
        net.micro_batch(32 + ctx.rank * 8, 8);
        e.synchronize();
        copies[ctx.rank] = ctx.device->pageable_copy_count() - before;
      });
      for (int r = 0; r < 2; ++r)
        EXPECT_EQ(copies[r], 0) << "params " << name(params) << ", ratio " << ratio << ", rank " << r;
    }
  }
  std::filesystem::remove_all(dir);
}
