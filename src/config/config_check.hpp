// The checks of Config::validate as a list of problems rather than a throw, so that
// Config::from_json can report them together with the problems found while reading.
// Thread-safe (pure function of the Config).
#pragma once

#include <string>
#include <vector>

#include "zoe/config.hpp"

namespace zoe::config_detail {

/// One failed check: the key it blames, why, and the other keys whose values it read (a
/// cross-field check); from_json drops a check whose key or any of whose other keys had a
/// problem while reading (the check then saw a default, not the file's value).
struct CheckProblem {
  std::string key;
  std::string reason;
  std::vector<std::string> reads;
};

/// Every check of Config::validate that `c` fails, in the order validate() documents.
std::vector<CheckProblem> check(const Config& c);

}  // namespace zoe::config_detail
