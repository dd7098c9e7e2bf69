// Checkpoints: a run resumed from step 5 equals the uninterrupted run bitwise (with and
// without NVMe offload); a corrupt or mismatched checkpoint is a clear error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::TestNet;

namespace {
using zoe::test::Params;
std::string temp_dir(const std::string& tag) { return zoe::test::temp_dir("ckpt-" + tag); }
Config config(int stage, OffloadDevice offload, const std::string& dir) {
  return zoe::test::checkpoint_config(stage, offload, dir);
}
Params run(const Config& c, int from, int to, const std::string& load, const std::string& save) {
  return zoe::test::checkpoint_run(c, 2, from, to, load, save);
}
}  // namespace

TEST(Checkpoint, ResumedRunEqualsUninterruptedBitwise) {
  for (int stage : {0, 2, 3}) {
    for (OffloadDevice d : {OffloadDevice::none, OffloadDevice::nvme}) {
      if (stage == 0 && d != OffloadDevice::none) continue;  // offload needs a sharded stage
      std::string dir = temp_dir("resume");
      Config c = config(stage, d, dir);
      auto straight = run(c, 0, 10, "", "");
      run(c, 0, 5, "", dir + "/ckpt");
      run(c, 0, 3, "", dir + "/ckpt-other");  // an unrelated checkpoint
      auto resumed = run(c, 5, 10, dir + "/ckpt", "");
      ASSERT_EQ(straight.size(), resumed.size());
      for (std::size_t i = 0; i < straight.size(); ++i)
        EXPECT_EQ(0, std::memcmp(straight[i].data(), resumed[i].data(), straight[i].size() * 4))
            << "stage " << stage << " param " << i;
      std::filesystem::remove_all(dir);
    }
  }
}

TEST(Checkpoint, ResumedRunWithParameterOffloadEqualsUninterrupted) {
  for (OffloadDevice p : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    std::string dir = temp_dir("resume-params");
    Config c = config(3, OffloadDevice::nvme, dir);
    c.zero_optimization.offload_param.device = p;
    c.zero_optimization.offload_param.nvme_path = dir + "/nvme";
    c.zero_optimization.stage3_param_persistence_threshold = 0;
    auto straight = run(c, 0, 10, "", "");
    run(c, 0, 5, "", dir + "/ckpt");
    auto resumed = run(c, 5, 10, dir + "/ckpt", "");
    ASSERT_EQ(straight.size(), resumed.size());
    for (std::size_t i = 0; i < straight.size(); ++i)
      EXPECT_EQ(0, std::memcmp(straight[i].data(), resumed[i].data(), straight[i].size() * 4)) << "param " << i;
    std::filesystem::remove_all(dir);
  }
}

TEST(Checkpoint, SavingAgainReplacesAtomically) {
  std::string dir = temp_dir("again");
  Config c = config(3, OffloadDevice::none, dir);
  run(c, 0, 2, "", dir + "/ckpt");
  run(c, 2, 4, dir + "/ckpt", dir + "/ckpt");  // overwrite in place
  auto a = run(c, 4, 5, dir + "/ckpt", "");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt.old"));
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, ClientStateAndCountersRoundTrip) {
  std::string dir = temp_dir("client");
  Config c = config(3, OffloadDevice::none, dir);
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, zoe::test::kCheckpointNet);
    for (int s = 0; s < 3; ++s) {
      net.micro_batch(s * 16 + ctx.rank * 8, 8);
      e.step();
    }
    e.save_checkpoint(dir + "/ckpt", "{\"trainer\": 3}");
  });
  auto ranks2 = make_local_ranks(2, 60.0);
  run_ranks(ranks2, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, zoe::test::kCheckpointNet);
    EXPECT_EQ(e.load_checkpoint(dir + "/ckpt"), "{\"trainer\": 3}");
    EXPECT_EQ(e.global_step(), 3);
  });
  std::ifstream in(dir + "/ckpt/manifest.json");
  std::stringstream text;
  text << in.rdbuf();
  for (const char* key : {"\"world_size\": 2", "\"stage\": 3", "\"step\": 3", "\"l0.weight\"", "\"shape\"",
                          "\"loss_scaler\"", "\"crc32c\"", "\"rank1.zoe\""})
    EXPECT_NE(text.str().find(key), std::string::npos) << key << " not in the manifest:\n" << text.str();
  std::filesystem::remove_all(dir);
}
