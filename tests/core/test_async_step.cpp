// The optimizer update overlaps the next forward (zoe.overlap_step) without changing the
// math: results equal the synchronous step bitwise, and with the update slowed by a test
// hook, the next forward of module 0 starts before the last group's update ends.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "src/core/test_hooks.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::bitwise_equal;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::TestNet;
using zoe::test::train;
using Clock = std::chrono::steady_clock;

namespace {
const NetSpec kNet{{16, 16, 16, 16, 8}, true, 21};

Config config(int stage, bool overlap, OffloadDevice offload) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zoe.small_module_threshold = 0;  // a group per module: these tests follow the update group by group
  c.zoe.overlap_step = overlap;
  c.zero_optimization.sub_group_size = 128;
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path =
      (std::filesystem::temp_directory_path() / ("zoe-async-" + std::to_string(getpid()))).string();
  return c;
}

}  // namespace

TEST(AsyncStep, OverlappedUpdateEqualsSynchronousBitwise) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice d : {OffloadDevice::none, OffloadDevice::nvme}) {
      if (stage == 0 && d != OffloadDevice::none) continue;
      RunResult sync = train(config(stage, false, d), kNet, 2, 10, 16);
      RunResult async = train(config(stage, true, d), kNet, 2, 10, 16);
      EXPECT_TRUE(bitwise_equal(async, sync)) << "stage " << stage;
    }
  }
}

TEST(AsyncStep, NextForwardStartsBeforeTheLastGroupIsUpdated) {
  std::atomic<long long> last_group_done{0}, forward0_started{0};
  const int groups = 5;  // four layers and the tied head
  core::test_hooks::after_group_update = [&](int g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g == groups - 1) last_group_done = Clock::now().time_since_epoch().count();
  };
  auto ranks = make_local_ranks(1, 60.0);
  Config c = config(3, true, OffloadDevice::nvme);
  std::vector<std::vector<float>> async_params;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    net.micro_batch(0, 8);
    e.step();  // returns while the update runs
    net.on_forward = [&](int layer) {
      if (layer == 0 && forward0_started == 0) forward0_started = Clock::now().time_since_epoch().count();
    };
    net.micro_batch(8, 8);
    e.step();
    e.synchronize();
    for (ParamId p : net.params()) async_params.push_back(e.gather_parameter(p));
  });
  core::test_hooks::after_group_update = nullptr;
  ASSERT_GT(forward0_started.load(), 0);
  EXPECT_LT(forward0_started.load(), last_group_done.load())
      << "the forward of module 0 waited for the whole optimizer update";

  // The same two steps, synchronously: identical parameters.
  Config sync = c;
  sync.zoe.overlap_step = false;
  std::vector<std::vector<float>> sync_params;
  run_ranks(make_local_ranks(1, 60.0), [&](RankContext& ctx) {
    Engine e(sync, ctx);
    TestNet net(e, kNet);
    net.micro_batch(0, 8);
    e.step();
    net.micro_batch(8, 8);
    e.step();
    for (ParamId p : net.params()) sync_params.push_back(e.gather_parameter(p));
  });
  ASSERT_EQ(async_params.size(), sync_params.size());
  for (std::size_t i = 0; i < sync_params.size(); ++i) EXPECT_EQ(async_params[i], sync_params[i]);
}
