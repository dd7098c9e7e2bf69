#include "src/common/log.hpp"
#include "src/common/log_level.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "src/common/quote.hpp"

namespace zoe::log {
std::optional<spdlog::level::level_enum> parse_level(std::string_view text) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(text));
  if (parsed == spdlog::level::off && text != "off") return std::nullopt;
  return parsed;
}

spdlog::logger& get() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("zoe");
    l->set_pattern("[%H:%M:%S.%e] [zoe] [%^%l%$] %v");
    l->set_level(spdlog::level::info);
    if (const char* level = std::getenv("ZOE_LOG_LEVEL"); level && *level) {
      // An unknown name is refused (said on stderr) and the level stays info.
      if (const auto parsed = parse_level(level)) {
        l->set_level(*parsed);
      } else {
        const std::string shown = detail::excerpt(level, 40);
        l->warn("ZOE_LOG_LEVEL '{}' is not one of trace, debug, info, warn, error, critical, off: logging at info",
                shown);
      }
    }
    return l;
  }();
  return *logger;
}
}  // namespace zoe::log
