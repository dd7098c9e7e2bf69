// zoe-ckpt never destroys what it did not write (docs/checkpoints.md): reshard refuses an
// output that is a file, a directory holding anything else than a zoe checkpoint, or the
// checkpoint it reads (or inside it, or holding it); an existing checkpoint there only with
// --force; export refuses an output inside the checkpoint it reads. Every refusal exits 1
// naming the path and leaves every file as it was (the checkpoint still verifies).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "tests/core/checkpoint_runs.hpp"
#include "tests/core/checkpoint_tree.hpp"
#include "tests/core/shell.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {
using test::shell;
using test::tree_of;

class CheckpointOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("ckpt-output"));
    test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, *dir_), 2, 0, 2, "", *dir_ + "/ckpt");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  // Runs `zoe-ckpt args` (in the test's directory) expecting exit status 1 and a message
  // holding `named`; the whole directory is unchanged and the checkpoint still verifies.
  static void expect_refused(const std::string& args, const std::string& named) {
    const auto before = tree_of(*dir_);
    const auto [rc, out] = shell("cd " + *dir_ + " && " + std::string(ZOE_CKPT_BIN) + " " + args);
    EXPECT_EQ(rc, 1) << args << ":\n" << out;
    EXPECT_NE(out.find(named), std::string::npos) << args << ": '" << named << "' not in:\n" << out;
    EXPECT_TRUE(tree_of(*dir_) == before) << args << " changed files";
    const auto [vrc, vout] = shell(std::string(ZOE_CKPT_BIN) + " verify " + *dir_ + "/ckpt");
    EXPECT_EQ(vrc, 0) << args << ": then verify:\n" << vout;
  }
  static std::string* dir_;
};
std::string* CheckpointOutput::dir_ = nullptr;

TEST_F(CheckpointOutput, ReshardRefusesADirectoryItDidNotWrite) {
  fs::create_directories(*dir_ + "/victim/keep");
  std::ofstream(*dir_ + "/victim/keep/file.txt") << "precious";
  expect_refused("reshard -n 1 ckpt victim", "'victim' is a directory that is not a zoe checkpoint");
  expect_refused("reshard -n 1 ckpt victim --force", "(it holds 'keep')");
  // A single unknown file among checkpoint names is enough to refuse.
  fs::create_directories(*dir_ + "/mixed");
  fs::copy(*dir_ + "/ckpt", *dir_ + "/mixed");
  std::ofstream(*dir_ + "/mixed/notes.txt") << "mine";
  expect_refused("reshard -n 1 ckpt mixed --force", "(it holds 'notes.txt')");
  // OUT.tmp and OUT.old are removed by the write: theirs are refused too.
  fs::create_directories(*dir_ + "/new.tmp");
  std::ofstream(*dir_ + "/new.tmp/a") << "mine";
  expect_refused("reshard -n 1 ckpt new", "temporary directory 'new.tmp'");
  fs::remove_all(*dir_ + "/new.tmp");
  std::ofstream(*dir_ + "/new.old") << "mine";
  expect_refused("reshard -n 1 ckpt new", "'new.old' exists and is not a directory");
  fs::remove(*dir_ + "/new.old");
  fs::remove_all(*dir_ + "/victim");
  fs::remove_all(*dir_ + "/mixed");
}

TEST_F(CheckpointOutput, ReshardRefusesAFile) {
  std::ofstream(*dir_ + "/afile") << "precious";
  expect_refused("reshard -n 3 ckpt afile", "'afile' exists and is not a directory");
  expect_refused("reshard -n 3 ckpt afile --force", "'afile' exists and is not a directory");
  fs::remove(*dir_ + "/afile");
}

TEST_F(CheckpointOutput, ReshardRefusesItsOwnInput) {
  expect_refused("reshard -n 3 ckpt ckpt", "overlap (the same directory)");
  expect_refused("reshard -n 3 ckpt ./ckpt/ --force", "overlap (the same directory)");
  expect_refused("reshard -n 3 ckpt ckpt/../ckpt", "overlap (the same directory)");
  expect_refused("reshard -n 3 ckpt ckpt/inner", "the output is inside it");
  expect_refused("reshard -n 3 ckpt/ . --force", "the checkpoint is inside the output");
  fs::create_symlink(*dir_ + "/ckpt", *dir_ + "/link");
  expect_refused("reshard -n 3 link ckpt --force", "overlap (the same directory)");
  fs::remove(*dir_ + "/link");
  // The library refuses the same, before anything is written.
  const ckpt::Manifest m = ckpt::read_manifest_file(*dir_ + "/ckpt");
  EXPECT_THROW(ckpt::reshard_checkpoint(*dir_ + "/ckpt", m, *dir_ + "/ckpt", 3, 2, 64), UsageError);
}

// An existing checkpoint (or an empty directory, as `mkdir OUT` leaves) is OUT's to replace:
// an empty directory is written, a checkpoint only with --force.
TEST_F(CheckpointOutput, ReshardReplacesACheckpointOnlyWithForce) {
  fs::create_directories(*dir_ + "/out");
  auto [rc, out] = shell(std::string(ZOE_CKPT_BIN) + " reshard -n 2 " + *dir_ + "/ckpt " + *dir_ + "/out");
  ASSERT_EQ(rc, 0) << out;
  expect_refused("reshard -n 4 ckpt out", "'out' is a zoe checkpoint already; pass --force");
  EXPECT_EQ(ckpt::read_manifest_file(*dir_ + "/out").world_size, 2);
  std::tie(rc, out) = shell(std::string(ZOE_CKPT_BIN) + " reshard -n 4 " + *dir_ + "/ckpt " + *dir_ + "/out --force");
  ASSERT_EQ(rc, 0) << out;
  const ckpt::Manifest n = ckpt::read_manifest_file(*dir_ + "/out");
  EXPECT_EQ(n.world_size, 4);
  ckpt::verify_checkpoint(*dir_ + "/out", n);
  EXPECT_FALSE(fs::exists(*dir_ + "/out.old"));
  EXPECT_FALSE(fs::exists(*dir_ + "/out.tmp"));
  // The library's default refuses it too.
  const ckpt::Manifest m = ckpt::read_manifest_file(*dir_ + "/ckpt");
  EXPECT_THROW(ckpt::reshard_checkpoint(*dir_ + "/ckpt", m, *dir_ + "/out", 1, 2, 64), UsageError);
  EXPECT_EQ(ckpt::read_manifest_file(*dir_ + "/out").world_size, 4);
  fs::remove_all(*dir_ + "/out");
}

TEST_F(CheckpointOutput, ExportRefusesAFileOfItsInput) {
  for (const char* file : {"ckpt/rank0.zoe", "ckpt/rank1.zoe", "ckpt/manifest.json", "ckpt/new.safetensors",
                           "./ckpt/../ckpt/m.st", "ckpt"})
    expect_refused(std::string("export ckpt ") + file, std::string("'") + file + "' is ");
  expect_refused("export ckpt ckpt/rank0.zoe", "inside the checkpoint 'ckpt'");
}

}  // namespace
