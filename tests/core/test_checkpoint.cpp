// Checkpoints: a run resumed from step 5 equals the uninterrupted run bitwise (with and
// without NVMe offload); a corrupt or mismatched checkpoint is a clear error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/crc32c.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"
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

// A checkpoint of format 1 (zoe before manifest.json: rank<R>.zoe of "ZOECKP1" with a 56-byte
// header and per group (count, CRC32C, [master | exp_avg | exp_avg_sq])) still loads and
// continues bitwise, also at another stage; written here from a format-2 checkpoint's values.
TEST(Checkpoint, Format1StillLoads) {
  const std::string dir = temp_dir("format1");
  // Format 1 was written with a group per module (before small modules shared groups); the
  // stage-3 load below shares them (zoe.small_module_threshold's default).
  Config c = config(2, OffloadDevice::none, dir);
  c.zoe.small_module_threshold = 0;
  const auto straight = run(c, 0, 10, "", "");
  run(c, 0, 5, "", dir + "/v2");
  std::ifstream min(dir + "/v2/manifest.json");
  std::stringstream text;
  text << min.rdbuf();
  ckpt::Manifest m = ckpt::parse_manifest(text.str(), "manifest.json");
  ckpt::CheckpointReader reader(dir + "/v2", m);
  std::filesystem::create_directories(dir + "/v1");
  for (int r = 0; r < m.world_size; ++r) {
    std::ofstream out(dir + "/v1/rank" + std::to_string(r) + ".zoe", std::ios::binary);
    struct {
      std::uint64_t magic = 0x31504b43454f5aull;
      std::int32_t world, stage, rank, groups;
      std::int64_t step;
      double lr, scale;
      std::int32_t good_steps, hysteresis_left;
    } h{0x31504b43454f5aull, m.world_size, m.stage, r, static_cast<std::int32_t>(m.groups.size()), m.step, m.lr,
        m.loss_scale, m.good_steps, m.hysteresis_left};
    static_assert(sizeof(h) == 56);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    for (std::size_t g = 0; g < m.groups.size(); ++g) {
      const ckpt::RankRange& rr = m.groups[g].ranks[static_cast<std::size_t>(r)];
      std::vector<float> all(3 * static_cast<std::size_t>(rr.numel));
      for (int s = 0; s < 3; ++s)
        reader.read(g, s, rr.begin, std::span<float>(all.data() + s * rr.numel, static_cast<std::size_t>(rr.numel)), r);
      const std::int64_t n = rr.numel;
      const std::uint32_t crc = io::crc32c(all.data(), all.size() * 4);
      out.write(reinterpret_cast<const char*>(&n), sizeof n);
      out.write(reinterpret_cast<const char*>(&crc), sizeof crc);
      out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
    }
  }
  EXPECT_TRUE(ckpt::is_legacy(dir + "/v1"));
  const auto resumed = run(c, 5, 10, dir + "/v1", "");
  zoe::test::expect_bitwise(straight, resumed, "format 1, same stage");
  const auto at_stage3 = run(config(3, OffloadDevice::none, dir), 5, 10, dir + "/v1", "");
  zoe::test::expect_bitwise(straight, at_stage3, "format 1, loaded at stage 3");
  std::filesystem::remove_all(dir);
}
