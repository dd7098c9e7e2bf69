// A filesystem that refuses O_DIRECT at open (ramfs: EINVAL): DirectFile falls back to
// buffered I/O on the file it created, or fails cleanly when direct I/O is required, and in
// both cases leaves no file behind once the DirectFile is gone.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>

#include "io/direct_file.hpp"
#include "io/engine.hpp"
#include "tests/io/scoped_mount.hpp"
#include "tests/io/test_support.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace zoe::io;

TEST(RefusedDirectIo, RamfsFallsBackToBufferedAndLeavesNothingBehind) {
  test::ScopedMount ramfs("ramfs");
  if (!ramfs.mounted()) GTEST_SKIP() << ramfs.why();
  const std::string path = ramfs.path() + "/zoe-rank0-1-0.swap";
  {
    DirectFile f = DirectFile::create(path, 1 << 20, FileOptions{.remove_on_close = true});
    EXPECT_FALSE(f.direct()) << "ramfs has no direct I/O";
    EXPECT_EQ(f.size(), 1u << 20);
    EXPECT_EQ(std::filesystem::file_size(path), 1u << 20);
    Engine engine;
    FileRef ref = engine.register_file(f);
    auto src = test::pattern_buffer(1 << 20, 41);
    AlignedBuffer back(1 << 20);
    engine.write(ref, src.data(), 0, 1 << 20).wait();
    engine.read(ref, back.data(), 0, 1 << 20).wait();
    EXPECT_EQ(test::first_difference(src.data(), back.data(), 1 << 20), -1);
    engine.unregister_file(ref);
  }
  EXPECT_TRUE(std::filesystem::is_empty(ramfs.path())) << "the buffered file was removed on close";

  // An existing file opens buffered too, and is not removed by a refusal.
  { DirectFile f = DirectFile::create(path, 4096); }
  EXPECT_TRUE(std::filesystem::exists(path)) << "remove_on_close is off";
  {
    DirectFile f = DirectFile::open(path);
    EXPECT_FALSE(f.direct());
    EXPECT_EQ(f.size(), 4096u);
  }
  try {
    DirectFile::open(path, FileOptions{.require_direct = true});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "zoe.require_direct_io");
  }
  EXPECT_EQ(std::filesystem::file_size(path), 4096u) << "a refused open leaves the file as it was";
  std::filesystem::remove(path);

  // Required direct I/O: a ConfigError naming the file, and no file created.
  try {
    DirectFile::create(ramfs.path() + "/required", 1 << 20, FileOptions{.require_direct = true});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "zoe.require_direct_io");
    EXPECT_NE(std::string(e.what()).find(ramfs.path() + "/required"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(ramfs.path())) << "a refused file is not left behind";
}
