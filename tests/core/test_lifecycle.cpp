// The engine's lifecycle (include/zoe/engine.hpp, src/core/lifecycle.hpp): registering ->
// built -> broken. The checks before a build (no module, a parameter no module uses) leave the
// engine registering, so the trainer can register what is missing and go on; a failed build
// breaks it, and every later call, registration included, throws UsageError naming the cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "zoe/engine.hpp"

using namespace zoe;
using ::testing::HasSubstr;

namespace {

Config config(int stage) {
  Config c;
  c.zero_optimization.stage = stage;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  return c;
}

// One forward, backward and step of module m (no compute: the gradient stays zero).
void pass(Engine& e, ModuleId m) {
  e.begin_forward(m);
  e.end_forward(m);
  e.begin_backward(m);
  e.end_backward(m);
  e.step();
}

std::vector<float> ones(std::size_t n) { return std::vector<float>(n, 1.0f); }

}  // namespace

// The first forward without a module, then with a parameter no module uses: UsageError each
// time, and the engine stays usable: registering the missing module lets it train.
TEST(Lifecycle, ChecksBeforeTheBuildLeaveTheEngineUsable) {
  for (int stage : {0, 3}) {
    auto ranks = make_local_ranks(1, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(stage), ctx);
      const std::vector<float> w = ones(32);
      ParamId a = e.add_parameter("a", {32}, std::span<const float>(w));
      EXPECT_THROW(e.step(), UsageError);
      ModuleId ma = e.add_module("ma", {a});  // would throw if the failed step() had broken it
      ParamId b = e.add_parameter("b", {32}, std::span<const float>(w));
      try {
        e.begin_forward(ma);
        ADD_FAILURE() << "a parameter no module uses was accepted";
      } catch (const UsageError& err) {
        EXPECT_THAT(err.message(), HasSubstr("'b' is not used by any module"));
      }
      e.add_module("mb", {b});
      pass(e, ma);  // built now: module mb ran no backward, its gradient is zero
      EXPECT_EQ(e.global_step(), 1);
    });
  }
}

// An initializer that throws breaks the engine at the build; afterwards every call throws
// UsageError naming the original cause, registration included.
TEST(Lifecycle, AFailedBuildRefusesEveryLaterCallNamingTheCause) {
  auto ranks = make_local_ranks(1, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(3), ctx);
    ParamId p = e.add_parameter("w.broken", {64}, [](std::int64_t, std::span<float>) {
      throw std::runtime_error("no weights today");
    });
    ModuleId m = e.add_module("m", {p});
    EXPECT_THROW(e.begin_forward(m), Error);
    auto expect_unusable = [&](const char* what, auto&& call) {
      try {
        call();
        ADD_FAILURE() << what << " did not throw on a broken engine";
      } catch (const UsageError& err) {
        EXPECT_THAT(err.message(), HasSubstr("unusable")) << what;
        EXPECT_THAT(err.message(), HasSubstr("no weights today")) << what;
        EXPECT_THAT(err.message(), HasSubstr("w.broken")) << what;
      }
    };
    const std::vector<float> v = ones(8);
    expect_unusable("add_parameter", [&] { e.add_parameter("late", {8}, std::span<const float>(v)); });
    expect_unusable("add_module", [&] { e.add_module("late", {p}); });
    expect_unusable("add_param_group", [&] {
      e.add_param_group(ParamGroup{"late", [](const std::string&) { return true; }, ParamOptions{}});
    });
    expect_unusable("begin_forward", [&] { e.begin_forward(m); });
    expect_unusable("begin_backward", [&] { e.begin_backward(m); });
    expect_unusable("step", [&] { e.step(); });
    expect_unusable("gather_parameter", [&] { e.gather_parameter(p); });
    expect_unusable("synchronize", [&] { e.synchronize(); });
  });
}
