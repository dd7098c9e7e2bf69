#include "src/common/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace zoe::log {
spdlog::logger& get() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("zoe");
    l->set_pattern("[%H:%M:%S.%e] [zoe] [%^%l%$] %v");
    const char* level = std::getenv("ZOE_LOG_LEVEL");
    l->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
    return l;
  }();
  return *logger;
}
}  // namespace zoe::log
