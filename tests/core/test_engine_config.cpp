// The effects on the Engine of DeepSpeed keys zoe accepts (issue 20): the logging keys log
// what they say (steps_per_print, wall_clock_breakdown, dump_state, memory_breakdown);
// optimizer.params.bias_correction false is Adam without bias correction on the CPU and the
// device optimizer alike.
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/adam_math.hpp"
#include "src/common/log.hpp"
#include "src/optim/cpu_adam.hpp"
#include "tests/common/log_capture.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::LogCapture;
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

// Adam without bias correction (DeepSpeed's bias_correction=False), written here in double
// from the formula (Kingma & Ba 2015, Alg. 1 without the bias-corrected m^ and v^):
//   AdamW: p = p * (1 - lr wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   p = p - lr m / (sqrt(v) + eps).
TEST(ConfigEffects, BiasCorrectionFalseIsAdamWithoutBiasCorrection) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  const std::vector<float> p0 = {0.5f, -1.25f, 2.0f, 0.0f, -0.03125f}, grads = {0.25f, -0.5f, 1e-3f, 3.0f, -2.0f};
  for (bool bc : {false, true}) {
    SCOPED_TRACE(bc ? "bias_correction true" : "bias_correction false");
    optim::CpuAdam adam(1, optim::Isa::scalar);
    optim::AdamHyper h{lr, b1, b2, eps, wd, true, bc};
    std::vector<float> p = p0, m(p.size(), 0.0f), v(p.size(), 0.0f);
    std::vector<double> rp(p0.begin(), p0.end()), rm(p.size(), 0.0), rv(p.size(), 0.0);
    for (int t = 1; t <= 3; ++t) {
      adam.step(h, t, 1.0f, p.data(), m.data(), v.data(), grads.data(), DType::f32, p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double g = grads[i];
        rp[i] *= 1 - lr * wd;
        rm[i] = b1 * rm[i] + (1 - b1) * g;
        rv[i] = b2 * rv[i] + (1 - b2) * g * g;
        const double mh = bc ? rm[i] / (1 - std::pow(b1, t)) : rm[i];
        const double vh = bc ? rv[i] / (1 - std::pow(b2, t)) : rv[i];
        rp[i] -= lr * mh / (std::sqrt(vh) + eps);
        EXPECT_NEAR(p[i], rp[i], 1e-6 * std::max(1.0, std::fabs(rp[i]))) << "element " << i << " step " << t;
      }
    }
  }
  // The one coefficient computation both optimizers use: exactly 1 and -lr.
  const kernels::AdamCoeffs c = kernels::adam_coeffs(lr, b1, b2, eps, wd, true, 7, 1.0f, false);
  EXPECT_EQ(c.bias_correction2_sqrt, 1.0f);
  EXPECT_EQ(c.neg_step_size, static_cast<float>(-lr));
}

// The CPU optimizer (offload_optimizer cpu) and the device optimizer give bitwise the same
// weights without bias correction, and not those of the corrected run.
TEST(ConfigEffects, BiasCorrectionFalseIsBitwiseEqualOnTheCpuAndDeviceOptimizers) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Config device = small_config();
    device.bf16.enabled = dtype == DType::bf16;
    device.optimizer.bias_correction = false;
    Config cpu = device;
    cpu.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
    const RunResult a = train(device, mlp(), 2, 6, 8);
    const RunResult b = train(cpu, mlp(), 2, 6, 8);
    EXPECT_TRUE(zoe::test::bitwise_equal(a, b)) << dtype_name(dtype);
    Config corrected = device;
    corrected.optimizer.bias_correction = true;
    EXPECT_FALSE(zoe::test::bitwise_equal(a, train(corrected, mlp(), 2, 6, 8))) << dtype_name(dtype);
  }
}

namespace {
// Trains like test::train (2 ranks as threads, 8 samples a step) and records the lr the
// engine reports before each step; `set_lrs`, if given, are set with set_lr before each step.
struct LrRun {
  std::vector<double> lrs;
  RunResult run;
};
LrRun train_recording_lr(const Config& config, int steps, const std::vector<double>& set_lrs = {}) {
  LrRun out;
  auto ranks = make_local_ranks(2, 60.0);
  std::vector<std::vector<std::vector<float>>> finals(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine engine(config, ctx);
    zoe::test::TestNet net(engine, mlp());
    for (int s = 0; s < steps; ++s) {
      if (!set_lrs.empty()) engine.set_lr(set_lrs[s]);
      if (ctx.rank == 0) out.lrs.push_back(engine.lr());
      net.micro_batch(static_cast<std::int64_t>(s) * 8 + ctx.rank * 4, 4, engine.loss_scale());
      engine.step();
    }
    engine.synchronize();
    for (ParamId p : net.params()) finals[ctx.rank].push_back(engine.gather_parameter(p));
  });
  out.run.params = finals[0];
  return out;
}
}  // namespace

// The configured scheduler sets the lr of every step (DeepSpeed's indexing, see
// ScheduleValuesEqualDeepSpeeds in tests/config), exactly as a trainer calling set_lr with
// those values would.
TEST(ConfigEffects, TheSchedulerDrivesTheLearningRate) {
  Config c = small_config();
  c.scheduler.type = SchedulerType::warmup_decay_lr;
  c.scheduler.warmup_num_steps = 3;
  c.scheduler.warmup_type = WarmupType::linear;
  c.scheduler.total_num_steps = 8;
  c.scheduler.warmup_max_lr = 0.01;
  const LrRun sched = train_recording_lr(c, 9);
  const std::vector<double> want = {0.0, 0.0, 0.01 / 3 * 1, 0.01 / 3 * 2, 0.01, 0.008, 0.006, 0.004, 0.002};
  ASSERT_EQ(sched.lrs.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(sched.lrs[k], want[k], 1e-15) << "step " << k + 1;
  Config manual = small_config();
  const LrRun set = train_recording_lr(manual, 9, sched.lrs);
  EXPECT_TRUE(zoe::test::bitwise_equal(sched.run, set.run));
  EXPECT_FALSE(zoe::test::bitwise_equal(sched.run, train_recording_lr(manual, 9).run));
}

TEST(ConfigEffects, SetLrWithASchedulerIsAUsageErrorNamingBoth) {
  Config c = small_config();
  c.scheduler.type = SchedulerType::warmup_lr;
  auto ranks = make_local_ranks(1, 60.0);
  Engine engine(c, ranks[0]);
  try {
    engine.set_lr(0.5);
    ADD_FAILURE() << "no exception";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("set_lr(0.5)"), std::string::npos) << what;
    EXPECT_NE(what.find("\"scheduler\""), std::string::npos) << what;
  }
  EXPECT_EQ(engine.lr(), 0.0);  // WarmupLR's first step: warmup_min_lr
}

// A skipped fp16 step does not advance the schedule (DeepSpeed steps its scheduler only after
// an applied step): the lr logged for step 4 is step 3's again.
TEST(ConfigEffects, ASkippedStepDoesNotAdvanceTheSchedule) {
  Config c = small_config();
  c.fp16.enabled = true;
  c.steps_per_print = 1;
  c.scheduler.type = SchedulerType::warmup_lr;
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = WarmupType::linear;
  c.scheduler.warmup_max_lr = 1.0;
  LogCapture log;
  const RunResult r = train(c, mlp(), 2, 5, 8, /*poison_step=*/2);
  ASSERT_TRUE(r.steps[2].skipped);
  const auto lines = log.lines_with("skipped=");
  ASSERT_EQ(lines.size(), 5u) << log.text();
  // Applied steps before each call: 0, 1, 2, 2 (step 3 skipped), 3 -> lr (k - 1) / 10.
  const std::vector<std::string> lr = {"lr=0,", "lr=0,", "lr=0.1,", "lr=0.1,", "lr=0.2,"};
  for (int i = 0; i < 5; ++i) EXPECT_NE(lines[i].find(lr[i]), std::string::npos) << lines[i];
  EXPECT_NE(lines[2].find("skipped=1"), std::string::npos) << lines[2];
}
