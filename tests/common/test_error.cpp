#include <gtest/gtest.h>

#include <cerrno>

#include "src/common/check.hpp"
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
