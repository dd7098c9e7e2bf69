// The effects on the Engine of DeepSpeed keys zoe accepts (issue 20): the logging keys log
// what they say (steps_per_print, wall_clock_breakdown, dump_state, memory_breakdown).
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/log.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::train;

namespace {

Config small_config() {
  Config c;
  c.zero_optimization.stage = 2;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  return c;
}

NetSpec mlp() { return NetSpec{{8, 16, 8}, false, 7}; }

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

}  // namespace

TEST(ConfigEffects, StepsPerPrintLogsEveryNthStepOnRankZero) {
  Config c = small_config();
  c.steps_per_print = 2;
  LogCapture log;
  const RunResult r = train(c, mlp(), 2, 5, 8);
  const auto lines = log.lines_with("skipped=");
  ASSERT_EQ(lines.size(), 2u) << log.text();  // steps 2 and 4, rank 0 only
  for (int i = 0; i < 2; ++i) {
    const int step = 2 * (i + 1);
    std::ostringstream want;
    want << "step=" << step << ", skipped=0, lr=0.01, betas=(0.9, 0.999), loss_scale=1, grad_norm=";
    EXPECT_EQ(lines[i].rfind(want.str(), 0), 0u) << lines[i];
    // The norm logged is the step's (fmt prints the shortest round-trip form).
    const double logged = std::stod(lines[i].substr(want.str().size()));
    EXPECT_EQ(logged, r.steps[step - 1].grad_norm) << lines[i];
  }
}

TEST(ConfigEffects, NoStepsPerPrintNoProgressLines) {
  LogCapture log;
  train(small_config(), mlp(), 1, 3, 8);
  EXPECT_TRUE(log.lines_with("skipped=").empty()) << log.text();
  EXPECT_TRUE(log.lines_with("time (ms)").empty()) << log.text();
}

TEST(ConfigEffects, WallClockBreakdownLogsEveryStepsTimes) {
  Config c = small_config();
  c.wall_clock_breakdown = true;
  LogCapture log;
  train(c, mlp(), 2, 3, 8);
  const auto lines = log.lines_with("time (ms)");
  ASSERT_EQ(lines.size(), 3u) << log.text();
  const std::regex form(R"(step=(\d) time \(ms\) \| forward\+backward: (\d+\.\d{3}) \| step: (\d+\.\d{3}))");
  for (int i = 0; i < 3; ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(lines[i], m, form)) << lines[i];
    EXPECT_EQ(std::stoi(m[1]), i + 1);
    EXPECT_GT(std::stod(m[2]) + std::stod(m[3]), 0.0) << lines[i];
  }
}

TEST(ConfigEffects, DumpStateLogsTheConfigurationOnce) {
  Config c = small_config();
  c.dump_state = true;
  LogCapture log;
  train(c, mlp(), 2, 1, 8);
  const auto lines = log.lines_with("configuration (dump_state):");
  EXPECT_EQ(lines.size(), 1u) << log.text();
  EXPECT_NE(log.text().find(c.to_json()), std::string::npos) << log.text();
}

TEST(ConfigEffects, MemoryBreakdownLogsTheMemoryReport) {
  Config c = small_config();
  c.memory_breakdown = true;
  LogCapture log;
  const RunResult r = train(c, mlp(), 1, 2, 8);
  const auto lines = log.lines_with("memory (bytes)");
  ASSERT_EQ(lines.size(), 2u) << log.text();
  const MemoryReport& m = r.memory[0];
  std::ostringstream want;
  want << "step=2 memory (bytes) | device: model states " << m.device_model_states << ", buffers ";
  EXPECT_EQ(lines[1].rfind(want.str(), 0), 0u) << lines[1];
  EXPECT_GT(m.device_model_states, 0);
}
