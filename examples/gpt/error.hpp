// The trainer's error helper: throws zoe::Error (include/zoe/error.hpp, the public API) with the
// caller's file:line, the message built from the streamed arguments.
#pragma once

#include <sstream>
#include <string>

#include "zoe/error.hpp"

namespace gpt::detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace gpt::detail

/// Throw zoe::Error("<args...>") with this file:line.
#define GPT_THROW(...) throw ::zoe::Error(::gpt::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
/// Throw zoe::Error unless `cond` holds (runtime check, never compiled out).
#define GPT_CHECK(cond, ...) \
  do { if (!(cond)) GPT_THROW(__VA_ARGS__); } while (0)
