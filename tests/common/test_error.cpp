#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "src/common/check.hpp"
#include "zoe/engine.hpp"
#include "zoe/error.hpp"

TEST(Error, CarriesFileAndLine) {
  try {
    ZOE_THROW(zoe::Error, "bad thing ", 42);
  } catch (const zoe::Error& e) {
    EXPECT_EQ(e.message(), "bad thing 42");
    EXPECT_NE(std::string(e.what()).find("test_error.cpp:"), std::string::npos);
    EXPECT_GT(e.line(), 0);
    return;
  }
  FAIL() << "no exception";
}

TEST(Error, IoErrorNamesFileOffsetLengthErrno) {
  zoe::IoError e("/x/rank0.zoe", 4096, 8192, EIO, "write", __FILE__, __LINE__);
  std::string w = e.what();
  EXPECT_NE(w.find("/x/rank0.zoe"), std::string::npos);
  EXPECT_NE(w.find("offset 4096"), std::string::npos);
  EXPECT_NE(w.find("8192"), std::string::npos);
  EXPECT_NE(w.find("errno 5"), std::string::npos);
  EXPECT_EQ(e.error_code(), EIO);
}

TEST(Error, ConfigErrorNamesKey) {
  try {
    ZOE_THROW_CONFIG("zero_optimization.stage", "must be 0..3, got ", 5);
  } catch (const zoe::ConfigError& e) {
    EXPECT_EQ(e.key(), "zero_optimization.stage");
    EXPECT_NE(std::string(e.what()).find("got 5"), std::string::npos);
  }
}

// The build maps the source dir away (-fmacro-prefix-map in CMakeLists.txt): an error raised in
// the library names "src/core/engine.cpp", never the builder's absolute path.
TEST(Error, NamesTheRepoRelativeSourcePath) {
  try {
    zoe::Engine engine(zoe::Config{}, zoe::RankContext{});  // no device: a UsageError
  } catch (const zoe::UsageError& e) {
    EXPECT_STREQ(e.file(), "src/core/engine.cpp");
    const std::string what = e.what();
    EXPECT_NE(what.find("[at src/core/engine.cpp:"), std::string::npos) << what;
    EXPECT_EQ(what.find("[at /"), std::string::npos) << what;
    EXPECT_STREQ(__FILE__, "tests/common/test_error.cpp");  // the tests' own paths too
    return;
  }
  FAIL() << "no exception";
}
