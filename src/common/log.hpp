// zoe's logger (spdlog, Debian's libspdlog-dev). Level from ZOE_LOG_LEVEL
// (trace|debug|info|warn|error|off; default info). Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

namespace zoe::log {
/// The shared "zoe" logger, created on first use.
spdlog::logger& get();
}  // namespace zoe::log

#define ZOE_LOG_DEBUG(...) ::zoe::log::get().debug(__VA_ARGS__)
#define ZOE_LOG_INFO(...) ::zoe::log::get().info(__VA_ARGS__)
#define ZOE_LOG_WARN(...) ::zoe::log::get().warn(__VA_ARGS__)
#define ZOE_LOG_ERROR(...) ::zoe::log::get().error(__VA_ARGS__)
