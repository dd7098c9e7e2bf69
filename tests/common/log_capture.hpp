// LogCapture: what zoe's logger writes while one lives, for tests that check a message.
// Thread-safety: the logger's sink is thread-safe; construct and destroy on one thread, one at
// a time.
#pragma once

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/log.hpp"

namespace zoe::test {

// Everything zoe's logger writes while it lives (info level and above).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    sink_->set_pattern("%v");
    level_ = log::get().level();
    log::get().set_level(spdlog::level::info);
    log::get().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log::get().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    log::get().set_level(level_);
  }
  std::string text() const { return text_.str(); }
  // Lines containing `needle`.
  std::vector<std::string> lines_with(const std::string& needle) const {
    std::vector<std::string> out;
    std::istringstream in(text_.str());
    for (std::string line; std::getline(in, line);)
      if (line.find(needle) != std::string::npos) out.push_back(line);
    return out;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

}  // namespace zoe::test
