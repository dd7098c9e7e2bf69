// The ZeRO engine on the host device with ranks as threads: stages 0-3 agree bitwise,
// world sizes agree numerically, memory and traffic follow the ZeRO formulas, and the
// numerics (overflow skip, clipping, accumulation) hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::bitwise_equal;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::train;

namespace {

Config base_config(int stage, DType dtype = DType::bf16) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = dtype == DType::bf16;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  return c;
}

double max_rel_diff(const RunResult& a, const RunResult& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    for (std::size_t j = 0; j < a.params[i].size(); ++j) {
      num = std::max(num, std::fabs(double(a.params[i][j]) - b.params[i][j]));
      den = std::max(den, std::fabs(double(b.params[i][j])));
    }
  return num / den;
}

NetSpec mlp() { return NetSpec{{8, 16, 16, 8}, false, 7}; }
NetSpec tied() { return NetSpec{{8, 8, 8, 8}, true, 9}; }

}  // namespace

class StagesBitwise : public ::testing::TestWithParam<std::tuple<int, DType, bool>> {};

TEST_P(StagesBitwise, TwentyStepsEqualStageZero) {
  auto [world, dtype, tied_model] = GetParam();
  NetSpec spec = tied_model ? tied() : mlp();
  RunResult ref = train(base_config(0, dtype), spec, world, 20, 16);
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the model does not train";
  for (int stage = 1; stage <= 3; ++stage) {
    RunResult r = train(base_config(stage, dtype), spec, world, 20, 16);
    EXPECT_TRUE(bitwise_equal(r, ref)) << "stage " << stage << " differs from stage 0 at world size " << world
                                       << ": max rel diff " << max_rel_diff(r, ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, StagesBitwise,
                         ::testing::Values(std::tuple{2, DType::bf16, false}, std::tuple{2, DType::f32, true},
                                           std::tuple{4, DType::bf16, true}, std::tuple{4, DType::f32, false}));

TEST(Engine, WorldSizesAgreeOnTheSameGlobalBatch) {
  for (int stage : {0, 3}) {
    RunResult w1 = train(base_config(stage, DType::f32), mlp(), 1, 20, 16);
    for (int world : {2, 4}) {
      RunResult w = train(base_config(stage, DType::f32), mlp(), world, 20, 16);
      EXPECT_LE(max_rel_diff(w, w1), 1e-5) << "world " << world << " stage " << stage;
    }
  }
}

TEST(Engine, FourMicroBatchesAccumulateToTheirSum) {
  Config one = base_config(2, DType::f32);
  Config four = one;
  four.gradient_accumulation_steps = 4;
  for (int world : {1, 2}) {
    RunResult a = train(one, mlp(), world, 5, 16);
    RunResult b = train(four, mlp(), world, 5, 16);
    EXPECT_LE(max_rel_diff(b, a), 1e-6) << "world " << world;
  }
  Config four_s0 = four;
  four_s0.zero_optimization.stage = 0;
  EXPECT_LE(max_rel_diff(train(four_s0, mlp(), 2, 5, 16), train(one, mlp(), 2, 5, 16)), 1e-6);
}

TEST(Engine, InfInOneBf16GradientSkipsTheStepBitwise) {
  for (int stage : {0, 2, 3}) {
    Config c = base_config(stage);
    RunResult clean2 = train(c, mlp(), 2, 2, 16);
    RunResult poisoned3 = train(c, mlp(), 2, 3, 16, /*poison_step=*/2);
    ASSERT_EQ(poisoned3.steps.size(), 3u);
    EXPECT_TRUE(poisoned3.steps[2].skipped);
    EXPECT_EQ(poisoned3.steps[2].step, 2);
    EXPECT_TRUE(bitwise_equal(poisoned3, clean2)) << "stage " << stage;
    for (const auto& p : poisoned3.params)
      for (float v : p) ASSERT_TRUE(std::isfinite(v));
  }
}

// The step's finite check is its fp64 sum of squares (no second pass over the gradients): a
// NaN anywhere skips the step, the largest finite value of the compute dtype does not (its
// square, taken in fp64, is finite), at stages 0-3 and 1-2 ranks, in fp32 and bf16, with the
// optimizer on the device and offloaded (the bf16 gradient tier keeps a gradient as it arrives).
TEST(Engine, TheSumOfSquaresIsTheFiniteCheck) {
  auto step_with = [](int stage, int world, DType dtype, float value, OffloadDevice offload) {
    Config c = base_config(stage, dtype);
    c.zero_optimization.offload_optimizer.device = offload;
    c.train_batch_size = world;
    c.train_micro_batch_size_per_gpu = 1;
    std::vector<StepResult> steps(static_cast<std::size_t>(world));
    auto ranks = make_local_ranks(world, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(c, ctx);
      auto init = [](std::int64_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.25f); };
      ParamId a = e.add_parameter("a.w", {100}, init);
      ParamId b = e.add_parameter("b.w", {37}, init);
      ModuleId ma = e.add_module("a", {a}), mb = e.add_module("b", {b});
      for (ModuleId m : {ma, mb}) {
        e.begin_forward(m);
        e.end_forward(m);
      }
      for (ModuleId m : {mb, ma}) {
        ModuleTensors t = e.begin_backward(m);
        const std::int64_t n = t.grads[0].numel();
        for (std::int64_t i = 0; i < n; ++i) {
          const bool odd = ctx.rank == 0 && m.index == mb.index && i == n - 1;  // one element of one rank's gradient
          test::add(t.grads[0], i, odd ? value : 1e-3f);
        }
        e.end_backward(m);
      }
      steps[static_cast<std::size_t>(ctx.rank)] = e.step();
    });
    return steps;
  };
  for (OffloadDevice offload : {OffloadDevice::none, OffloadDevice::cpu}) {
    for (DType dtype : {DType::f32, DType::bf16})
      for (int stage : {0, 2, 3})
        for (int world : {1, 2}) {
          if (offload != OffloadDevice::none && stage == 0) continue;  // (ZeRO-Offload needs stage >= 1)
          const float largest = dtype == DType::f32 ? std::numeric_limits<float>::max() : kernels::bf16_to_f32(0x7F7F);
          for (const StepResult& r : step_with(stage, world, dtype, std::numeric_limits<float>::quiet_NaN(), offload)) {
            EXPECT_TRUE(r.skipped) << "NaN, stage " << stage << " world " << world;
            EXPECT_TRUE(std::isnan(r.grad_norm)) << "a skipped step's norm, stage " << stage;
          }
          for (const StepResult& r : step_with(stage, world, dtype, largest, offload)) {
            EXPECT_FALSE(r.skipped) << "largest finite, stage " << stage << " world " << world;
            // The norm of the averaged gradient: the large element over the world size.
            EXPECT_NEAR(r.grad_norm, double(largest) / world, 1e-6 * double(largest)) << "stage " << stage;
          }
        }
  }
}

TEST(Engine, ClippingOverTwoRanksEqualsOneRank) {
  Config c = base_config(2, DType::f32);
  c.gradient_clipping = 0.05;
  RunResult one = train(c, mlp(), 1, 5, 16);
  RunResult two = train(c, mlp(), 2, 5, 16);
  ASSERT_LT(one.steps[0].clip_coef, 1.0) << "the test must actually clip";
  for (int s = 0; s < 5; ++s) {
    EXPECT_NEAR(two.steps[s].grad_norm, one.steps[s].grad_norm, 1e-6 * one.steps[s].grad_norm);
    EXPECT_NEAR(two.steps[s].clip_coef, one.steps[s].clip_coef, 1e-6);
  }
  EXPECT_LE(max_rel_diff(two, one), 1e-5);
}

TEST(Engine, Fp16LossScalingTrainsAndMatchesBf16Shape) {
  Config c = base_config(3, DType::f16);
  c.bf16.enabled = false;
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 8;
  RunResult r = train(c, mlp(), 2, 10, 16);
  EXPECT_EQ(r.steps[0].loss_scale, 256.0);
  EXPECT_LT(r.losses.back(), r.losses.front());
}

// Per-rank model-state bytes and elements sent per step against the ZeRO paper's formulas.
// Widths are multiples of 16 * Nd so there is no padding: Ψ = live parameters.
TEST(Engine, MemoryAndTrafficFollowTheFormulas) {
  NetSpec spec{{64, 64, 64}, false, 3};
  const double psi = 2 * (64 * 64 + 64);  // 8320, a multiple of 64 per group
  for (int world : {2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      RunResult r = train(base_config(stage), spec, world, 2, 8 * world);
      double nd = world;
      double expect_mem[4] = {16 * psi, 4 * psi + 12 * psi / nd, 2 * psi + 14 * psi / nd, 16 * psi / nd};
      double expect_traffic = (stage == 3 ? 3 : 2) * psi * (nd - 1) / nd;
      for (int rk = 0; rk < world; ++rk) {
        EXPECT_EQ(r.memory[rk].device_model_states, static_cast<std::int64_t>(expect_mem[stage]))
            << "stage " << stage << " world " << world;
        EXPECT_EQ(r.memory[rk].device_buffers, 0) << "buffers left after the step, stage " << stage;
        EXPECT_NEAR(r.traffic[rk].elements_sent, expect_traffic, 0.01 * expect_traffic)
            << "stage " << stage << " world " << world;
        // Bytes counted by the communicator agree with the elements the engine sent (bf16).
        EXPECT_NEAR(r.traffic[rk].bytes_sent, 2 * expect_traffic, 0.01 * 2 * expect_traffic + 64);
      }
    }
  }
}

TEST(Engine, PaddingNeverReachesResults) {
  // One 57-element parameter at world size 2, and parameters of 8, 0 and 24 elements.
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Config c = base_config(3, DType::f32);
    Engine e(c, ctx);
    std::vector<float> v57(57), v8(8, 1.5f), v24(24, -2.0f);
    for (int i = 0; i < 57; ++i) v57[i] = 0.25f * i - 3;
    ParamId a = e.add_parameter("a", {57}, v57);
    ParamId b = e.add_parameter("b", {2, 4}, v8);
    ParamId z = e.add_parameter("empty", {0, 3}, {});
    ParamId d = e.add_parameter("d", {24}, v24);
    ModuleId m0 = e.add_module("m0", {a});
    ModuleId m1 = e.add_module("m1", {b, z, d});
    EXPECT_EQ(e.gather_parameter(a), v57);
    EXPECT_TRUE(e.gather_parameter(z).empty());
    for (int s = 0; s < 3; ++s) {
      for (ModuleId m : {m0, m1}) ForwardScope f(e, m);
      for (ModuleId m : {m1, m0}) {
        BackwardScope bs(e, m);
        for (const TensorView& g : bs.tensors().grads)
          for (std::int64_t i = 0; i < g.numel(); ++i) g.as<float>()[i] += 0.1f * (i % 5) - 0.2f;
        EXPECT_EQ(bs.tensors().params.size(), m.index == 0 ? 1u : 3u);
      }
      e.step();
    }
    std::vector<float> got = e.gather_parameter(a);
    ASSERT_EQ(got.size(), 57u);
    EXPECT_NE(got, v57);
    for (float x : got) EXPECT_TRUE(std::isfinite(x));
    EXPECT_EQ(e.gather_parameter(d).size(), 24u);
  });
}

TEST(Engine, Stage3OrderChangeLeavesNothingInFlight) {
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Config c = base_config(3, DType::f32);
    c.zero_optimization.stage3_prefetch_bucket_size = 1 << 20;
    c.zero_optimization.stage3_max_live_parameters = 2 * 64;  // room for two 16x4 groups
    Engine e(c, ctx);
    std::vector<ModuleId> mods;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> w(64, 0.01f * (i + 1));
      mods.push_back(e.add_module("m" + std::to_string(i), {e.add_parameter("w" + std::to_string(i), {16, 4}, w)}));
    }
    auto run = [&](const std::vector<int>& order) {
      for (int i : order) {
        ForwardScope f(e, mods[i]);
        EXPECT_LE(e.memory_report().device_buffers, 2 * 64 * 4 + 64 * 4);
      }
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        BackwardScope b(e, mods[*it]);
        b.tensors().grads[0].as<float>()[0] += 1.0f;
      }
      e.step();
      EXPECT_EQ(e.memory_report().device_buffers, 0);
    };
    run({0, 1, 2, 3});
    run({0, 1, 2, 3});  // prefetching along the recorded order
    run({3, 1, 0, 2});  // a different order: prefetches dropped, nothing leaked
    run({3, 1, 0, 2});
  });
}

TEST(Engine, BadUsageIsAClearError) {
  auto ranks = make_local_ranks(1, 10.0);
  Config c = base_config(0, DType::f32);
  Engine e(c, ranks[0]);
  std::vector<float> w(4, 1.0f);
  ParamId p = e.add_parameter("w", {2, 2}, w);
  EXPECT_THROW(e.add_parameter("bad", {3}, w), UsageError);
  ModuleId m = e.add_module("m", {p});
  EXPECT_THROW(e.end_forward(m), UsageError);
  EXPECT_THROW(e.step(), UsageError);  // no backward ran
  Config bad = c;
  bad.zero_optimization.stage = 5;
  EXPECT_THROW(Engine(bad, ranks[0]), ConfigError);
  Config param_offload = base_config(2, DType::f32);  // parameter offload needs stage 3
  param_offload.zero_optimization.offload_param.device = OffloadDevice::cpu;
  try {
    Engine e2(param_offload, ranks[0]);
    ADD_FAILURE() << "offload_param accepted at stage 2";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.key(), "zero_optimization.offload_param.device");
  }
}

TEST(Engine, ComputePlaceOfAHostRankIsTheHostWithNoStream) {
  auto ranks = make_local_ranks(1, 10.0);
  Engine e(base_config(0, DType::f32), ranks[0]);
  const ComputePlace place = e.compute_place();
  EXPECT_EQ(place.kind, DeviceKind::host);
  EXPECT_EQ(place.ordinal, -1);
  EXPECT_EQ(place.stream, nullptr);
  EXPECT_STREQ(device_kind_name(place.kind), "host");
}
