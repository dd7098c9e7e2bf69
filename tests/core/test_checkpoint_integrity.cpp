// Bad checkpoints are refused on every rank with an error naming the file and what is wrong,
// before anything changes (a flipped byte in a rank file or the manifest, a truncated or
// missing rank file, swapped rank files, a rank file of another save, a checkpoint of another
// model), and the directory protocol keeps a complete checkpoint through interrupted saves.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
using zoe::test::checkpoint_config;
using zoe::test::checkpoint_run;
using zoe::test::Params;
namespace fs = std::filesystem;

namespace {
struct Outcome {
  std::vector<std::string> errors{2};
  std::vector<std::string> kinds{2};
  std::vector<char> unchanged = std::vector<char>(2, 0);
};

// Loads `ckpt` on 2 ranks of `c` (model `spec`), catching what each rank throws.
Outcome try_load(const Config& c, const std::string& ckpt, const test::NetSpec& spec = test::kCheckpointNet) {
  Outcome o;
  auto ranks = make_local_ranks(2, 120.0);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    test::TestNet net(e, spec);
    Params before;
    for (ParamId id : net.params()) before.push_back(e.gather_parameter(id));
    try {
      e.load_checkpoint(ckpt);
    } catch (const CorruptionError& err) {
      o.errors[ctx.rank] = err.what();
      o.kinds[ctx.rank] = "corruption";
    } catch (const UsageError& err) {
      o.errors[ctx.rank] = err.what();
      o.kinds[ctx.rank] = "usage";
    } catch (const SystemError& err) {
      o.errors[ctx.rank] = err.what();
      o.kinds[ctx.rank] = "system";
    } catch (const Error& err) {
      o.errors[ctx.rank] = err.what();
      o.kinds[ctx.rank] = "other";
    }
    Params after;
    for (ParamId id : net.params()) after.push_back(e.gather_parameter(id));
    o.unchanged[ctx.rank] = before == after && e.global_step() == 0;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "a rank waited for a timeout";
  return o;
}

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char x = 0;
  f.read(&x, 1);
  x = static_cast<char>(x ^ 0x5a);
  f.seekp(at);
  f.write(&x, 1);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

class CheckpointIntegrity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("ckpt-integrity");
    c_ = checkpoint_config(3, OffloadDevice::none, dir_);
    checkpoint_run(c_, 2, 0, 2, "", good());
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A fresh copy of the good checkpoint to spoil.
  std::string copy(const std::string& name) {
    const std::string to = dir_ + "/" + name;
    fs::copy(good(), to, fs::copy_options::recursive);
    return to;
  }
  std::string good() const { return dir_ + "/good"; }
  void expect_refused(const Outcome& o, const std::string& file, const std::string& what, int bad_rank) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(o.errors[r].find(file), std::string::npos) << "rank " << r << ": " << o.errors[r];
      EXPECT_NE(o.errors[r].find(what), std::string::npos) << "rank " << r << ": " << o.errors[r];
      EXPECT_TRUE(o.unchanged[r]) << "rank " << r << ": a failed load changed the engine";
    }
    if (bad_rank >= 0)  // the healthy rank names the failed one
      EXPECT_NE(o.errors[1 - bad_rank].find("could not be loaded on rank(s) " + std::to_string(bad_rank)),
                std::string::npos)
          << o.errors[1 - bad_rank];
  }
  std::string dir_;
  Config c_;
};
}  // namespace

TEST_F(CheckpointIntegrity, FlippedStateByteNamesTheFileAndGroupOnEveryRank) {
  const std::string ckpt = copy("flip");
  flip_byte(ckpt + "/rank1.zoe", 200);
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "rank1.zoe", "do not match their checksum", 1);
  EXPECT_EQ(o.kinds[0], "corruption");
  EXPECT_EQ(o.kinds[1], "corruption");
  EXPECT_NE(o.errors[1].find("group 'l0"), std::string::npos) << o.errors[1];  // (its small modules share it)
}

TEST_F(CheckpointIntegrity, FlippedLossScaleInTheManifestIsRefused) {
  const std::string ckpt = copy("scale");
  std::string text = read_text(ckpt + "/manifest.json");
  const std::size_t at = text.find("\"scale\": ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::size_t digit = text.find_first_of("0123456789", at + 9);
  text[digit] = text[digit] == '1' ? '2' : '1';  // 1.0 -> 2.0: valid JSON, another run
  write_text(ckpt + "/manifest.json", text);
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "manifest.json", "does not match its checksum", -1);
}

TEST_F(CheckpointIntegrity, FlippedHeaderByteIsRefused) {
  const std::string ckpt = copy("header");
  flip_byte(ckpt + "/rank0.zoe", 13);  // inside the rank field
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "rank0.zoe", "header does not match its checksum", 0);
}

TEST_F(CheckpointIntegrity, SwappedRankFilesAreRefused) {
  const std::string ckpt = copy("swap");
  fs::rename(ckpt + "/rank0.zoe", ckpt + "/x");
  fs::rename(ckpt + "/rank1.zoe", ckpt + "/rank0.zoe");
  fs::rename(ckpt + "/x", ckpt + "/rank1.zoe");
  const Outcome o = try_load(c_, ckpt);
  for (int r = 0; r < 2; ++r) {
    const std::string file = "rank" + std::to_string(r) + ".zoe";
    EXPECT_NE(o.errors[r].find(file + "': holds the states of rank " + std::to_string(1 - r)), std::string::npos)
        << o.errors[r];
    EXPECT_TRUE(o.unchanged[r]);
  }
}

TEST_F(CheckpointIntegrity, TruncatedRankFileIsRefused) {
  const std::string ckpt = copy("trunc");
  fs::resize_file(ckpt + "/rank1.zoe", fs::file_size(ckpt + "/rank1.zoe") - 100);
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "rank1.zoe", "truncated", 1);
}

TEST_F(CheckpointIntegrity, MissingRankFileIsRefused) {
  const std::string ckpt = copy("missing");
  fs::remove(ckpt + "/rank1.zoe");
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "rank1.zoe", "missing", 1);
}

TEST_F(CheckpointIntegrity, RankFileOfAnotherSaveIsRefused) {
  const std::string other = dir_ + "/other";
  checkpoint_run(c_, 2, 0, 3, "", other);
  const std::string ckpt = copy("mixed");
  fs::copy_file(other + "/rank1.zoe", ckpt + "/rank1.zoe", fs::copy_options::overwrite_existing);
  const Outcome o = try_load(c_, ckpt);
  expect_refused(o, "rank1.zoe", "belongs to another save", 1);
}

TEST_F(CheckpointIntegrity, AnotherModelIsAUsageErrorNamingTheParameter) {
  test::NetSpec wider = test::kCheckpointNet;
  wider.widths = {8, 16, 12};
  wider.tied_head = true;
  const Outcome o = try_load(c_, good(), wider);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(o.kinds[r], "usage") << o.errors[r];
    EXPECT_NE(o.errors[r].find("manifest.json' is of another model"), std::string::npos) << o.errors[r];
    EXPECT_NE(o.errors[r].find("l1.weight"), std::string::npos) << o.errors[r];
    EXPECT_TRUE(o.unchanged[r]);
  }
}

TEST_F(CheckpointIntegrity, NoCheckpointIsAnErrorOnEveryRank) {
  const Outcome o = try_load(c_, dir_ + "/nothing");
  for (int r = 0; r < 2; ++r) EXPECT_NE(o.errors[r].find("no checkpoint at"), std::string::npos) << o.errors[r];
}

// A crash between the two renames of a publish leaves <dir>.old complete and no <dir>: a load
// takes <dir>.old, and the next save first moves it back, so a second crash in that save
// (here: right after its preparation) still leaves a complete checkpoint. Before format 2 the
// resumed save removed <dir>.old first.
TEST_F(CheckpointIntegrity, InterruptedPublishTwiceInARowKeepsACheckpoint) {
  const std::string ckpt = dir_ + "/ckpt";
  fs::copy(good(), ckpt + ".old", fs::copy_options::recursive);  // crash 1: after rename(dir, old)
  fs::create_directories(ckpt + ".tmp");
  write_text(ckpt + ".tmp/rank0.zoe", "partial");
  EXPECT_EQ(ckpt::choose_for_load(ckpt), ckpt + ".old");
  checkpoint_run(c_, 2, 2, 2, ckpt, "");  // loads step 2 from <dir>.old
  // Crash 2: the resumed save stops right after its preparation (recover + a fresh temp dir).
  ckpt::recover(ckpt);
  ckpt::make_temp(ckpt);
  EXPECT_TRUE(ckpt::is_complete(ckpt)) << "the checkpoint was lost by the second save";
  EXPECT_FALSE(fs::exists(ckpt + ".old"));
  checkpoint_run(c_, 2, 2, 4, ckpt, ckpt);  // resumes, saves step 4 over it
  EXPECT_FALSE(fs::exists(ckpt + ".tmp"));
  EXPECT_FALSE(fs::exists(ckpt + ".old"));
  checkpoint_run(c_, 2, 4, 4, ckpt, "");
}

// A complete <dir>.tmp never replaces <dir> until the manifest is in it: a save that dies
// while the rank files are written leaves <dir> as it was.
TEST_F(CheckpointIntegrity, TempDirWithoutManifestIsNotACheckpoint) {
  const std::string ckpt = copy("ckpt");
  fs::copy(good(), ckpt + ".tmp", fs::copy_options::recursive);
  fs::remove(ckpt + ".tmp/manifest.json");
  EXPECT_FALSE(ckpt::is_complete(ckpt + ".tmp"));
  EXPECT_EQ(ckpt::choose_for_load(ckpt), ckpt);
}
