// zoe's logger (spdlog, Debian's libspdlog-dev). Level from ZOE_LOG_LEVEL
// (trace|debug|info|warn|error|critical|off; default info; an unknown name is refused with a
// warning). Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string_view>

namespace zoe::log {
/// The shared "zoe" logger, created on first use. An unknown ZOE_LOG_LEVEL is refused with a
/// warning on the logger (it names the value) and the level stays info.
spdlog::logger& get();
/// A ZOE_LOG_LEVEL value as spdlog names levels (trace, debug, info, warn/warning, err/error,
/// critical, off); nullopt for any other text (spdlog's from_str would make it "off" and
/// silence every warning). Thread-safe (pure).
std::optional<spdlog::level::level_enum> parse_level(std::string_view text);
}  // namespace zoe::log

#define ZOE_LOG_DEBUG(...) ::zoe::log::get().debug(__VA_ARGS__)
#define ZOE_LOG_INFO(...) ::zoe::log::get().info(__VA_ARGS__)
#define ZOE_LOG_WARN(...) ::zoe::log::get().warn(__VA_ARGS__)
#define ZOE_LOG_ERROR(...) ::zoe::log::get().error(__VA_ARGS__)
