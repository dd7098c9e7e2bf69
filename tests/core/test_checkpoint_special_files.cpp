// A checkpoint whose manifest.json or rank file is not a regular file (/dev/zero, /dev/urandom,
// a FIFO, a directory) is refused at once, naming the path, by zoe-ckpt inspect / verify /
// export / reshard and by the engine's load: never read without end, never blocked on, never
// reported as "truncated" or "not valid JSON".
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "tests/core/checkpoint_runs.hpp"
#include "tests/core/shell.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {
using test::shell;

enum class Special { dev_zero, dev_urandom, fifo, directory };
const char* name_of(Special s) {
  switch (s) {
    case Special::dev_zero: return "/dev/zero";
    case Special::dev_urandom: return "/dev/urandom";
    case Special::fifo: return "a FIFO";
    case Special::directory: return "a directory";
  }
  return "?";
}
const char* kind_of(Special s) {
  switch (s) {
    case Special::dev_zero:
    case Special::dev_urandom: return "(it is a character device)";
    case Special::fifo: return "(it is a FIFO)";
    case Special::directory: return "(it is a directory)";
  }
  return "?";
}

// Replaces `path` with the special file `s`.
void make_special(const std::string& path, Special s) {
  fs::remove(path);
  switch (s) {
    case Special::dev_zero: fs::create_symlink("/dev/zero", path); break;
    case Special::dev_urandom: fs::create_symlink("/dev/urandom", path); break;
    case Special::fifo: ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; break;
    case Special::directory: fs::create_directory(path); break;
  }
}

class CheckpointSpecialFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("ckpt-special"));
    test::checkpoint_run(test::checkpoint_config(2, OffloadDevice::none, *dir_), 2, 0, 2, "", *dir_ + "/good");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  // A copy of the good checkpoint with `file` replaced by `s`.
  static std::string broken(const std::string& file, Special s) {
    const std::string d = *dir_ + "/broken";
    fs::remove_all(d);
    fs::copy(*dir_ + "/good", d);
    make_special(d + "/" + file, s);
    return d;
  }
  // Every zoe-ckpt command on `d` exits 1 within the timeout, naming `path` as not a regular file.
  static void expect_cli_refuses(const std::string& d, const std::string& path, Special s) {
    const std::string bin = ZOE_CKPT_BIN;
    for (const std::string& cmd : {"inspect " + d, "verify " + d, "export " + d + " " + *dir_ + "/x.safetensors",
                                   "reshard -n 1 " + d + " " + *dir_ + "/x"}) {
      // timeout: a read that blocks on a FIFO fails the test instead of hanging it.
      const auto [rc, out] = shell("timeout 20 " + bin + " " + cmd);
      EXPECT_EQ(rc, 1) << cmd << " with " << name_of(s) << ":\n" << out;
      EXPECT_NE(out.find("'" + path + "' is not a regular file " + kind_of(s)), std::string::npos)
          << cmd << " with " << name_of(s) << ":\n" << out;
      EXPECT_FALSE(fs::exists(*dir_ + "/x")) << cmd;
      EXPECT_FALSE(fs::exists(*dir_ + "/x.safetensors")) << cmd;
    }
  }
  static std::string* dir_;
};
std::string* CheckpointSpecialFiles::dir_ = nullptr;

constexpr Special kAll[] = {Special::dev_zero, Special::dev_urandom, Special::fifo, Special::directory};

TEST_F(CheckpointSpecialFiles, ManifestIsRefusedByEveryCommand) {
  for (Special s : kAll) {
    const std::string d = broken("manifest.json", s);
    expect_cli_refuses(d, d + "/manifest.json", s);
  }
}

TEST_F(CheckpointSpecialFiles, RankFileIsRefusedByEveryCommand) {
  for (Special s : kAll) {
    // inspect reads only the manifest: verify, export and reshard open the rank files.
    const std::string d = broken("rank1.zoe", s);
    const std::string bin = ZOE_CKPT_BIN;
    for (const std::string& cmd : {"verify " + d, "export " + d + " " + *dir_ + "/x.safetensors",
                                   "reshard -n 1 " + d + " " + *dir_ + "/x"}) {
      const auto [rc, out] = shell("timeout 20 " + bin + " " + cmd);
      EXPECT_EQ(rc, 1) << cmd << " with " << name_of(s) << ":\n" << out;
      EXPECT_NE(out.find("'" + d + "/rank1.zoe' is not a regular file " + std::string(kind_of(s))), std::string::npos)
          << cmd << " with " << name_of(s) << ":\n" << out;
    }
  }
}

// The engine's load (a collective: every rank) refuses both, naming the file; a FIFO does not block it.
TEST_F(CheckpointSpecialFiles, EngineLoadRefusesThem) {
  for (const char* file : {"manifest.json", "rank0.zoe"})
    for (Special s : kAll) {
      const std::string d = broken(file, s);
      const Config c = test::checkpoint_config(2, OffloadDevice::none, *dir_);
      try {
        test::checkpoint_run(c, 2, 2, 2, d, "");
        ADD_FAILURE() << file << " as " << name_of(s) << " loaded";
      } catch (const Error& e) {
        EXPECT_NE(e.message().find(d + "/" + file + "' is not a regular file " + kind_of(s)), std::string::npos)
            << file << " as " << name_of(s) << ": " << e.message();
      }
    }
}

// The library's reader refuses the manifest the same way.
TEST_F(CheckpointSpecialFiles, ReadManifestFileThrowsCorruptionError) {
  for (Special s : kAll) {
    const std::string d = broken("manifest.json", s);
    EXPECT_THROW(ckpt::read_manifest_file(d), CorruptionError) << name_of(s);
  }
}

}  // namespace
