// zoe-ckpt's work offline: verify finds what a load would refuse, reshard writes a checkpoint
// for another world size that loads exactly as the original does there, and the CLI's
// inspect / verify / reshard / export commands print and exit as documented.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/core/checkpoint_reshard.hpp"
#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {
// Runs a command; returns its exit status and output (stdout and stderr).
std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
}  // namespace

TEST(CheckpointTool, ReshardOfflineLoadsAsTheOriginalDoes) {
  const std::string dir = test::temp_dir("ckpt-tool");
  const Config c = test::checkpoint_config(3, OffloadDevice::none, dir);
  test::checkpoint_run(c, 2, 0, 3, "", dir + "/ckpt");
  const ckpt::Manifest m = ckpt::read_manifest_file(dir + "/ckpt");
  ckpt::verify_checkpoint(dir + "/ckpt", m);
  for (const auto& [world, stage, chunk] : {std::tuple{4, 3, 7}, std::tuple{1, 0, 64}, std::tuple{3, 2, 1000}}) {
    const std::string out = dir + "/w" + std::to_string(world);
    ckpt::reshard_checkpoint(dir + "/ckpt", m, out, world, stage, chunk);
    const ckpt::Manifest n = ckpt::read_manifest_file(out);
    EXPECT_EQ(n.world_size, world);
    EXPECT_EQ(n.stage, stage);
    EXPECT_EQ(n.step, 3);
    ckpt::verify_checkpoint(out, n);
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    Config at = test::checkpoint_config(stage, OffloadDevice::none, dir);
    if (16 % world != 0) continue;  // the helper's batch split needs 16 / world samples per rank
    const test::Params direct = test::checkpoint_run(at, world, 3, 6, dir + "/ckpt", "");
    const test::Params offline = test::checkpoint_run(at, world, 3, 6, out, "");
    test::expect_bitwise(direct, offline, "resharded offline to world " + std::to_string(world));
  }
  fs::remove_all(dir);
}

TEST(CheckpointTool, CommandLine) {
  const std::string bin = ZOE_CKPT_BIN;
  const std::string dir = test::temp_dir("ckpt-cli");
  test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, dir), 2, 0, 2, "", dir + "/ckpt");

  auto [rc, out] = shell(bin + " inspect --params " + dir + "/ckpt");
  EXPECT_EQ(rc, 0) << out;
  for (const char* s : {"world size 2, ZeRO stage 2", "step 2", "l0.weight [8, 16]", "2 rank files"})
    EXPECT_NE(out.find(s), std::string::npos) << s << " not in:\n" << out;

  std::tie(rc, out) = shell(bin + " verify " + dir + "/ckpt");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("every checksum matches"), std::string::npos) << out;

  std::tie(rc, out) = shell(bin + " reshard " + dir + "/ckpt " + dir + "/four -n 4 --stage 3");
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = shell(bin + " inspect " + dir + "/four");
  EXPECT_NE(out.find("world size 4, ZeRO stage 3"), std::string::npos) << out;

  {
    std::fstream f(dir + "/four/rank2.zoe", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  std::tie(rc, out) = shell(bin + " verify " + dir + "/four");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("rank2.zoe"), std::string::npos) << out;
  EXPECT_NE(out.find("do not match their checksum"), std::string::npos) << out;

  fs::remove(dir + "/ckpt/rank1.zoe");
  std::tie(rc, out) = shell(bin + " verify " + dir + "/ckpt");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("rank1.zoe"), std::string::npos) << out;
  EXPECT_NE(out.find("missing"), std::string::npos) << out;

  std::tie(rc, out) = shell(bin + " reshard " + dir + "/four " + dir + "/x -n 0");
  EXPECT_EQ(rc, 2) << out;  // CLI11's range check
  std::tie(rc, out) = shell(bin + " export " + dir + "/four " + dir + "/m.safetensors");
  EXPECT_EQ(rc, 1) << out;
  fs::remove_all(dir);
}
