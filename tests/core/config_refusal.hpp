// A check shared by the tests of config keys: building an Engine from `config` is refused with
// a ConfigError whose message names `key` and contains `needle` (the value or the other key).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "zoe/engine.hpp"

namespace zoe::test {

inline void expect_config_refused(const Config& config, const std::string& key, const std::string& needle) {
  try {
    Engine e(config, make_local_ranks(1)[0]);
    ADD_FAILURE() << "accepted; expected a ConfigError naming " << key << " and " << needle;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(key), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

}  // namespace zoe::test
