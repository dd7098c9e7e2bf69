// ZOE_LOG_LEVEL's values. spdlog's own from_str makes any unknown text "off", so a typo would
// silence every warning; zoe takes spdlog's names only.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string_view>

namespace zoe::log {
/// A ZOE_LOG_LEVEL value as spdlog names levels (trace, debug, info, warn/warning, err/error,
/// critical, off); nullopt for any other text. Thread-safe (pure).
std::optional<spdlog::level::level_enum> parse_level(std::string_view text);
}  // namespace zoe::log
