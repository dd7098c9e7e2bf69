// zoe-ckpt's work offline: verify finds what a load would refuse, reshard writes a checkpoint
// for another world size that loads exactly as the original does there, export writes the
// bytes Engine::export_safetensors writes for the same state (fp32, bf16, fp16; whatever world
// size saved it) and refuses a corrupt checkpoint leaving nothing behind, and the CLI's
// inspect / verify / reshard / export commands print and exit as documented.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>

#include "src/core/checkpoint/checkpoint_export.hpp"
#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "tests/core/checkpoint_runs.hpp"
#include "tests/core/shell.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {
using test::shell;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::map<std::string, std::string> kMetadata{{"format", "pt"}, {"run", "ckpt-export"}};
constexpr std::array<std::pair<DType, const char*>, 3> kDtypes{
    {{DType::f32, "fp32"}, {DType::bf16, "bf16"}, {DType::f16, "fp16"}}};

// Trains steps [0, steps) of the checkpoint net on `world` ranks, saves the checkpoint `ckpt`
// and exports the same state live to `live`.<dtype> for every export dtype.
void save_and_export_live(const Config& c, int world, int steps, const std::string& ckpt, const std::string& live) {
  auto ranks = make_local_ranks(world, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    test::TestNet net(e, test::kCheckpointNet);
    const int per_rank = 16 / world;
    for (int s = 0; s < steps; ++s) {
      net.micro_batch(s * 16 + ctx.rank * per_rank, per_rank);
      e.step();
    }
    e.save_checkpoint(ckpt);
    for (const auto& [dtype, name] : kDtypes) e.export_safetensors(live + "." + name, dtype, kMetadata);
  });
}

// The message of what `fn` throws as zoe::Error ("" if nothing).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
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

// The offline export of a checkpoint is the live export of the engine that saved it, byte for
// byte, at stage 3 on 2 ranks with the optimizer states on NVMe and at stage 0 on 1 rank; the
// piece size (a few elements here, straddling parameters' ends) changes nothing.
TEST(CheckpointTool, ExportOfflineIsTheLiveExport) {
  const std::string dir = test::temp_dir("ckpt-export");
  for (const auto& [stage, world, offload] :
       {std::tuple{3, 2, OffloadDevice::nvme}, std::tuple{0, 1, OffloadDevice::none}}) {
    const std::string what = "stage " + std::to_string(stage) + " world " + std::to_string(world);
    const std::string ckpt = dir + "/ckpt" + std::to_string(stage), live = dir + "/live" + std::to_string(stage);
    save_and_export_live(test::checkpoint_config(stage, offload, dir), world, 3, ckpt, live);
    const ckpt::Manifest m = ckpt::read_manifest_file(ckpt);
    std::uint64_t numel = 0;
    for (const ckpt::GroupEntry& g : m.groups)
      for (const ckpt::ParamEntry& p : g.params) numel += static_cast<std::uint64_t>(p.numel);
    ASSERT_GT(numel, 100u) << what;
    for (const auto& [dtype, name] : kDtypes)
      for (std::int64_t piece : {std::int64_t{7}, ckpt::kExportPieceElements}) {
        const std::string out = dir + "/offline." + name;
        ckpt::export_safetensors(ckpt, m, out, dtype, kMetadata, piece);
        const std::string expect = file_bytes(live + "." + name), got = file_bytes(out);
        EXPECT_GT(expect.size(), numel * dtype_size(dtype)) << what;  // the data and a header
        EXPECT_TRUE(got == expect) << what << " " << name << " pieces of " << piece << ": " << got.size() << " vs "
                                   << expect.size() << " bytes";
        EXPECT_FALSE(fs::exists(out + ".tmp"));
      }
  }
  fs::remove_all(dir);
}

// A checkpoint saved at world size 2 (stage 3) exports the same bytes once resharded to world
// size 1 (stage 0) or 4 (stage 2), and the same as the live export of the saving engine.
TEST(CheckpointTool, ExportIsTheSameAfterReshard) {
  const std::string dir = test::temp_dir("ckpt-export-reshard");
  save_and_export_live(test::checkpoint_config(3, OffloadDevice::none, dir), 2, 3, dir + "/w2", dir + "/live");
  const ckpt::Manifest m2 = ckpt::read_manifest_file(dir + "/w2");
  for (const auto& [world, stage, chunk] : {std::tuple{1, 0, 64}, std::tuple{4, 2, 7}}) {
    const std::string out = dir + "/w" + std::to_string(world);
    ckpt::reshard_checkpoint(dir + "/w2", m2, out, world, stage, chunk);
    const ckpt::Manifest m = ckpt::read_manifest_file(out);
    ASSERT_EQ(m.world_size, world);
    for (const auto& [dtype, name] : {kDtypes[0], kDtypes[1]}) {
      ckpt::export_safetensors(dir + "/w2", m2, dir + "/from2." + name, dtype, kMetadata);
      ckpt::export_safetensors(out, m, dir + "/resharded." + name, dtype, kMetadata);
      const std::string a = file_bytes(dir + "/from2." + name);
      EXPECT_TRUE(a == file_bytes(dir + "/resharded." + name)) << name << " after reshard to world " << world;
      EXPECT_TRUE(a == file_bytes(dir + "/live." + name)) << name;
    }
  }
  fs::remove_all(dir);
}

// A corrupt or incomplete checkpoint is refused naming the file, before the output exists: an
// earlier file of that name is left as it was and no temporary file remains.
TEST(CheckpointTool, ExportRefusesACorruptCheckpoint) {
  const std::string dir = test::temp_dir("ckpt-export-bad");
  test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, dir), 2, 0, 2, "", dir + "/ckpt");
  const std::string out = dir + "/m.safetensors";
  std::ofstream(out) << "earlier";
  const ckpt::Manifest m = ckpt::read_manifest_file(dir + "/ckpt");
  {
    std::fstream f(dir + "/ckpt/rank1.zoe", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  std::string msg = error_of([&] { ckpt::export_safetensors(dir + "/ckpt", m, out, DType::bf16); });
  EXPECT_NE(msg.find("rank1.zoe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_EQ(file_bytes(out), "earlier");
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  fs::remove(dir + "/ckpt/rank1.zoe");
  msg = error_of([&] { ckpt::export_safetensors(dir + "/ckpt", m, out, DType::f32); });
  EXPECT_NE(msg.find("rank1.zoe"), std::string::npos) << msg;
  EXPECT_EQ(file_bytes(out), "earlier");
  EXPECT_FALSE(fs::exists(out + ".tmp"));
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
  EXPECT_EQ(rc, 1) << out;  // rank2.zoe is corrupt
  EXPECT_NE(out.find("rank2.zoe"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/m.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/m.safetensors.tmp"));
  std::tie(rc, out) = shell(bin + " export " + dir + "/four " + dir + "/m.safetensors --dtype fp8");
  EXPECT_EQ(rc, 2) << out;  // CLI11's set check

  // A good checkpoint: the bytes of the library's export; an unwritable output is named.
  fs::remove_all(dir + "/four");
  test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, dir), 2, 0, 2, "", dir + "/good");
  std::tie(rc, out) = shell(bin + " export " + dir + "/good " + dir +
                            "/m.safetensors --dtype bf16 --metadata format=pt --metadata run=ckpt-export");
  EXPECT_EQ(rc, 0) << out;
  const ckpt::Manifest good = ckpt::read_manifest_file(dir + "/good");
  std::size_t tensors = 0;
  for (const ckpt::GroupEntry& g : good.groups) tensors += g.params.size();
  EXPECT_NE(out.find(std::to_string(tensors) + " tensors written to " + dir + "/m.safetensors as bf16"),
            std::string::npos)
      << out;
  ckpt::export_safetensors(dir + "/good", good, dir + "/lib.safetensors", DType::bf16, kMetadata);
  EXPECT_TRUE(file_bytes(dir + "/m.safetensors") == file_bytes(dir + "/lib.safetensors"));
  std::tie(rc, out) = shell(bin + " export " + dir + "/good " + dir + "/no/such/dir/m.safetensors");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find(dir + "/no/such/dir/m.safetensors"), std::string::npos) << out;
  std::tie(rc, out) = shell(bin + " export " + dir + "/good " + dir + "/x.safetensors --metadata novalue");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("'novalue' is not KEY=VALUE"), std::string::npos) << out;
  std::tie(rc, out) = shell(bin + " export " + dir + "/nothing " + dir + "/x.safetensors");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find(dir + "/nothing"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));

  // A save interrupted in its publish (DIR incomplete, DIR.old complete): every command reads
  // DIR.old, as a load does, and says so.
  fs::rename(dir + "/good", dir + "/good.old");
  fs::create_directory(dir + "/good");
  std::tie(rc, out) = shell(bin + " verify " + dir + "/good");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("reading '" + dir + "/good.old'"), std::string::npos) << out;
  std::tie(rc, out) = shell(bin + " export " + dir + "/good " + dir +
                            "/old.safetensors --dtype bf16 --metadata format=pt --metadata run=ckpt-export");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(file_bytes(dir + "/old.safetensors") == file_bytes(dir + "/lib.safetensors"));
  fs::remove_all(dir);
}

// A trainer's checkpoint directory (zoe-gpt --checkpoint-dir DIR: the engine's files in
// DIR/engine, the trainer's trainer-<step>.json beside them): every command reads DIR/engine and
// says so; a directory whose checkpoint is elsewhere below it is refused naming where it is.
TEST(CheckpointTool, ReadsATrainersCheckpointDirectory) {
  const std::string bin = ZOE_CKPT_BIN;
  const std::string dir = test::temp_dir("ckpt-trainer-dir");
  fs::create_directories(dir + "/run");
  test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, dir), 2, 0, 2, "", dir + "/run/engine");
  { std::ofstream(dir + "/run/trainer-2.json") << "{}"; }

  auto [rc, out] = shell(bin + " verify " + dir + "/run");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("'" + dir + "/run' is a trainer's checkpoint directory; reading its engine checkpoint '" + dir +
                     "/run/engine'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("every checksum matches"), std::string::npos) << out;
  std::tie(rc, out) = shell(bin + " inspect " + dir + "/run");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("world size 2, ZeRO stage 2"), std::string::npos) << out;
  std::tie(rc, out) = shell(bin + " export " + dir + "/run " + dir + "/run.safetensors");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(dir + "/run.safetensors"));
  std::tie(rc, out) = shell(bin + " reshard " + dir + "/run " + dir + "/one -n 1");
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = shell(bin + " inspect " + dir + "/one");
  EXPECT_NE(out.find("world size 1"), std::string::npos) << out;

  // An interrupted save of the engine checkpoint inside: engine.old is read, and both are said.
  fs::rename(dir + "/run/engine", dir + "/run/engine.old");
  std::tie(rc, out) = shell(bin + " verify " + dir + "/run");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("reading '" + dir + "/run/engine.old'"), std::string::npos) << out;

  // The checkpoint under another name: refused, saying where to point.
  fs::rename(dir + "/run/engine.old", dir + "/run/weights");
  std::tie(rc, out) = shell(bin + " verify " + dir + "/run");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("no checkpoint at '" + dir + "/run' (no manifest.json there); '" + dir +
                     "/run/weights' holds one: point zoe-ckpt there"),
            std::string::npos)
      << out;
  fs::remove_all(dir);
}
