// Internal helpers to raise zoe errors with the caller's file:line.
#pragma once

#include <cerrno>
#include <sstream>
#include <string>

#include "zoe/error.hpp"

namespace zoe::detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace zoe::detail

/// Throw `Type(message...)` where Type derives from zoe::Error with (msg, file, line).
#define ZOE_THROW(Type, ...) throw Type(::zoe::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
/// Throw zoe::UsageError / zoe::Error unless `cond` holds (runtime check, never compiled out).
#define ZOE_CHECK(cond, ...) \
  do { if (!(cond)) ZOE_THROW(::zoe::Error, "check failed: " #cond ": ", __VA_ARGS__); } while (0)
#define ZOE_CHECK_USAGE(cond, ...) \
  do { if (!(cond)) ZOE_THROW(::zoe::UsageError, __VA_ARGS__); } while (0)
/// Throw zoe::SystemError with the current errno.
#define ZOE_THROW_ERRNO(err, ...) \
  throw ::zoe::SystemError(::zoe::detail::concat(__VA_ARGS__), (err), __FILE__, __LINE__)
/// Throw zoe::ConfigError naming the key.
#define ZOE_THROW_CONFIG(key, ...) \
  throw ::zoe::ConfigError((key), ::zoe::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
