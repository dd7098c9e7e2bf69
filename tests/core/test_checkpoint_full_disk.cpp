// A checkpoint on a full filesystem (a 1 MiB tmpfs filled up): every rank fails with ENOSPC
// and the bytes its file needs, the partial temp directory is removed, and the previous
// checkpoint still loads with its values.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/core/test_net.hpp"
#include "tests/io/scoped_mount.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::TestNet;

namespace {
const NetSpec kNet{{8, 16, 8}, true, 11};

Config config() {
  Config c;
  c.zero_optimization.stage = 2;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 64;
  return c;
}

// Writes `path` until the filesystem is full (64 KiB blocks, then pages, then bytes); returns
// the file's size.
std::uint64_t fill(const std::string& path) {
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(64 << 10, 'f');
    for (std::size_t chunk : {block.size(), std::size_t{4096}, std::size_t{1}}) {
      while (out.write(block.data(), static_cast<std::streamsize>(chunk)) && out.flush()) {
      }
      out.clear();
    }
  }
  return std::filesystem::file_size(path);
}
}  // namespace

TEST(CheckpointFullDisk, EnospcNamesTheBytesRemovesTheTempDirAndKeepsTheLastCheckpoint) {
  test::ScopedMount disk("tmpfs", "size=1M");
  if (!disk.mounted()) GTEST_SKIP() << disk.why();
  const std::string ckpt = disk.path() + "/ckpt";
  const Config c = config();

  // Step 2 saved, step 4 attempted on the full disk.
  std::vector<std::vector<float>> saved;
  std::vector<std::string> errors(2);
  std::vector<int> codes(2, 0);
  std::uint64_t file_bytes = 0;
  {
    auto ranks = make_local_ranks(2, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(c, ctx);
      TestNet net(e, kNet);
      for (int s = 0; s < 4; ++s) {
        if (s == 2) {
          e.save_checkpoint(ckpt);
          std::vector<std::vector<float>> p;
          for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
          if (ctx.rank == 0) {
            saved = p;
            file_bytes = std::filesystem::file_size(ckpt + "/rank0.zoe");
            fill(disk.path() + "/filler");
          }
        }
        net.micro_batch(s * 16 + ctx.rank * 8, 8);
        e.step();
      }
      try {
        e.save_checkpoint(ckpt);
      } catch (const SystemError& err) {
        errors[ctx.rank] = err.what();
        codes[ctx.rank] = err.error_code();
      } catch (const Error& err) {
        errors[ctx.rank] = std::string("other: ") + err.what();
      }
    });
  }
  ASSERT_GT(file_bytes, 0u);
  for (int r = 0; r < 2; ++r) {
    const std::string file = "ckpt.tmp/rank" + std::to_string(r) + ".zoe";
    EXPECT_EQ(codes[r], ENOSPC) << errors[r];
    EXPECT_NE(errors[r].find(file), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("No space left on device"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("needs " + std::to_string(file_bytes) + " bytes"), std::string::npos)
        << errors[r] << " (the file is " << file_bytes << " bytes)";
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt + ".tmp")) << "the partial checkpoint is removed";
  EXPECT_FALSE(std::filesystem::exists(ckpt + ".old"));
  EXPECT_EQ(std::filesystem::file_size(ckpt + "/rank0.zoe"), file_bytes) << "the last checkpoint is untouched";

  // The step-2 checkpoint loads, with the disk still full (loading writes nothing).
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    e.load_checkpoint(ckpt);
    EXPECT_EQ(e.global_step(), 2);
    const auto ids = net.params();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> p = e.gather_parameter(ids[i]);
      ASSERT_EQ(p.size(), saved[i].size());
      EXPECT_EQ(0, std::memcmp(p.data(), saved[i].data(), p.size() * sizeof(float))) << "param " << i;
    }
  });
}

// Room for one rank's file only: the rank that gets it succeeds, the other fails with ENOSPC,
// and both fail the save at once (no collective timeout), the healthy one naming the other.
TEST(CheckpointFullDisk, OneRankOutOfSpaceFailsEveryRankPromptly) {
  test::ScopedMount disk("tmpfs", "size=1M");
  if (!disk.mounted()) GTEST_SKIP() << disk.why();
  const std::string ckpt = disk.path() + "/ckpt";
  std::vector<std::string> errors(2);
  std::vector<int> codes(2, 0);
  auto ranks = make_local_ranks(2, 60.0);
  std::vector<std::chrono::steady_clock::duration> took(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(), ctx);
    TestNet net(e, kNet);
    net.micro_batch(ctx.rank * 8, 8);
    e.step();
    e.save_checkpoint(ckpt);
    if (ctx.rank == 0) {
      const std::uint64_t page = 4096;
      const std::uint64_t need = (std::filesystem::file_size(ckpt + "/rank0.zoe") + page - 1) / page * page;
      const std::uint64_t full = fill(disk.path() + "/filler");
      std::filesystem::resize_file(disk.path() + "/filler", full - need);  // frees one file's pages
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      e.save_checkpoint(ckpt);
    } catch (const SystemError& err) {
      errors[ctx.rank] = err.what();
      codes[ctx.rank] = err.error_code();
    } catch (const Error& err) {
      errors[ctx.rank] = err.what();
    }
    took[ctx.rank] = std::chrono::steady_clock::now() - start;
  });
  EXPECT_LT(std::max(took[0], took[1]), std::chrono::seconds(30)) << "a rank waited for the collective timeout";
  const int failed = codes[0] == ENOSPC ? 0 : 1;
  const int healthy = 1 - failed;
  EXPECT_EQ(codes[failed], ENOSPC) << errors[0] << " | " << errors[1];
  EXPECT_NE(errors[failed].find("No space left on device"), std::string::npos) << errors[failed];
  EXPECT_NE(errors[healthy].find("checkpoint '" + ckpt + "' was not saved: writing failed on rank(s) " +
                                 std::to_string(failed)),
            std::string::npos)
      << errors[healthy];
  // The healthy rank shows the failed rank's own error too.
  EXPECT_NE(errors[healthy].find("rank " + std::to_string(failed) + ": "), std::string::npos) << errors[healthy];
  EXPECT_NE(errors[healthy].find("No space left on device"), std::string::npos) << errors[healthy];
  EXPECT_FALSE(std::filesystem::exists(ckpt + ".tmp")) << "the partial checkpoint is removed";
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/rank0.zoe") && std::filesystem::exists(ckpt + "/rank1.zoe"));
}
