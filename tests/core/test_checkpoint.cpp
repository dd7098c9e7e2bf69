// Checkpoints: a run resumed from step 5 equals the uninterrupted run bitwise (with and
// without NVMe offload); a corrupt or mismatched checkpoint is a clear error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::TestNet;

namespace {
const NetSpec kNet{{8, 16, 8}, true, 11};

std::string temp_dir(const std::string& tag) { return zoe::test::temp_dir("ckpt-" + tag); }

Config config(int stage, OffloadDevice offload, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 64;
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path = dir + "/nvme";
  return c;
}

// Trains steps [from, to) on 2 ranks; loads `load` first and saves `save` at the end if given.
std::vector<std::vector<float>> run(const Config& c, int from, int to, const std::string& load,
                                    const std::string& save) {
  auto ranks = make_local_ranks(2, 60.0);
  std::vector<std::vector<float>> out;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    if (!load.empty()) e.load_checkpoint(load);
    EXPECT_EQ(e.global_step(), from);
    for (int s = from; s < to; ++s) {
      net.micro_batch(s * 16 + ctx.rank * 8, 8);
      e.step();
    }
    if (!save.empty()) e.save_checkpoint(save);
    std::vector<std::vector<float>> p;
    for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
    if (ctx.rank == 0) out = p;
  });
  return out;
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

TEST(Checkpoint, CorruptOrMismatchedIsAClearError) {
  std::string dir = temp_dir("bad");
  Config c = config(2, OffloadDevice::none, dir);
  run(c, 0, 2, "", dir + "/ckpt");
  {
    std::fstream f(dir + "/ckpt/rank1.zoe", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char x = 0x5a;
    f.write(&x, 1);
  }
  // A long collective timeout: the healthy rank must fail at once, not wait for rank 1.
  auto ranks = make_local_ranks(2, 120.0);
  std::vector<std::string> errors(2);
  // One byte per rank: std::vector<bool> packs both ranks' flags into one word, and the
  // two rank threads writing it raced (ThreadSanitizer).
  std::vector<char> unchanged(2, 0);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    std::vector<std::vector<float>> before;
    for (ParamId id : net.params()) before.push_back(e.gather_parameter(id));
    try {
      e.load_checkpoint(dir + "/ckpt");
    } catch (const CorruptionError& err) {
      errors[ctx.rank] = err.what();
    } catch (const Error& err) {
      errors[ctx.rank] = std::string("other: ") + err.what();
    }
    std::vector<std::vector<float>> after;
    for (ParamId id : net.params()) after.push_back(e.gather_parameter(id));
    unchanged[ctx.rank] = before == after;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "a rank waited for a timeout";
  EXPECT_NE(errors[1].find("rank1.zoe"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("corrupt"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("could not be loaded on rank(s) 1"), std::string::npos) << errors[0];
  EXPECT_TRUE(unchanged[0] && unchanged[1]) << "a failed load changed the engine";

  Config other = config(3, OffloadDevice::none, dir);
  auto ranks2 = make_local_ranks(2, 10.0);
  run_ranks(ranks2, [&](RankContext& ctx) {
    Engine e(other, ctx);
    TestNet net(e, kNet);
    try {
      e.load_checkpoint(dir + "/ckpt");
      ADD_FAILURE() << "a stage-2 checkpoint loaded into a stage-3 engine";
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("stage 2"), std::string::npos) << err.what();
    }
  });
  std::filesystem::remove_all(dir);
}
