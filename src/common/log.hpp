// zoe's logger (spdlog, Debian's libspdlog-dev). Level from ZOE_LOG_LEVEL
// (trace|debug|info|warn|error|critical|off; default info; an unknown name is refused with a
// warning). Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

namespace zoe::log {
/// The shared "zoe" logger, created on first use. An unknown ZOE_LOG_LEVEL is refused with a
/// warning on the logger (it names the value) and the level stays info (log_level.hpp).
spdlog::logger& get();
}  // namespace zoe::log

#define ZOE_LOG_DEBUG(...) ::zoe::log::get().debug(__VA_ARGS__)
#define ZOE_LOG_INFO(...) ::zoe::log::get().info(__VA_ARGS__)
#define ZOE_LOG_WARN(...) ::zoe::log::get().warn(__VA_ARGS__)
#define ZOE_LOG_ERROR(...) ::zoe::log::get().error(__VA_ARGS__)
