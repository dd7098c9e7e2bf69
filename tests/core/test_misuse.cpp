// Misuse never trains silently wrong (issue 17): a rank that skips or reorders a module's
// backward fails on every rank before the optimizer runs (host communicators compare
// collective tags; the step agreement catches it on a backend that cannot, as NCCL);
// calls out of order are a UsageError at the call naming the module and the rule; legit
// patterns (recomputed forward, evaluation forwards, accumulation, tied weights, a fused
// head) still train, bitwise as the plain run; with zoe.debug_poison a view read past its
// scope reads NaN. Ranks are threads with a 5 s collective timeout, so a regression fails
// instead of hanging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/comm/gloo_local_ranks.hpp"
#include "src/device/host_device.hpp"
#include "tests/core/forwarding_communicator.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using ::testing::HasSubstr;

namespace {

constexpr double kTimeoutS = 5.0;

Config config(int stage, int gas = 1) {
  Config c;
  c.zero_optimization.stage = stage;
  c.gradient_accumulation_steps = gas;
  c.optimizer.lr = 1e-2;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zoe.optimizer_threads = 1;
  c.zoe.comm_timeout_s = kTimeoutS;
  // Each group its own gradient bucket, so the messages name the module that differs (a
  // bucket of several groups fails as well, naming them all: Buckets.* in test_buckets.cpp).
  c.zero_optimization.reduce_bucket_size = 0;
  return c;
}


enum class Backend { local, gloo, tagless };
const char* backend_name(Backend b) { return b == Backend::local ? "local" : b == Backend::gloo ? "gloo" : "tagless"; }

std::vector<RankContext> ranks_of(Backend b, int world) {
  if (b == Backend::gloo) {
    HostCommOptions o;
    o.timeout = std::chrono::milliseconds(static_cast<int>(kTimeoutS * 1000));
    return make_gloo_local_ranks(world, o);
  }
  auto ranks = make_local_ranks(world, kTimeoutS);
  if (b == Backend::tagless)
    for (RankContext& r : ranks)  // as NCCL: collectives paired by position only
      r.comm = std::make_shared<test::ForwardingCommunicator>(r.comm, test::ForwardingCommunicator::Tags::dropped);
  return ranks;
}

// Two modules of the same size: their gradient reductions have the same shape.
struct TwoModules {
  static constexpr int kN = 64;
  Engine& e;
  ParamId pa, pb;
  ModuleId a, b;
  explicit TwoModules(Engine& engine) : e(engine) {
    std::vector<float> va(kN), vb(kN);
    for (int i = 0; i < kN; ++i) {
      va[i] = 0.01f * i;
      vb[i] = -0.02f * i;
    }
    pa = e.add_parameter("wa", {kN}, va);
    pb = e.add_parameter("wb", {kN}, vb);
    a = e.add_module("A", {pa});
    b = e.add_module("B", {pb});
  }
  void forward() {
    for (ModuleId m : {a, b}) ForwardScope f(e, m);
  }
  // Backward of `order`, each adding (rank + 1) * (module + 1) to every gradient element.
  void backward(const std::vector<ModuleId>& order) {
    for (ModuleId m : order) {
      BackwardScope s(e, m);
      for (std::int64_t i = 0; i < s.tensors().grads[0].numel(); ++i)
        test::add(s.tensors().grads[0], i, static_cast<float>((e.rank() + 1) * (m.index + 1)));
    }
  }
};

// What each rank's step 1 did: the error it threw, or "" if the step completed.
std::vector<std::string> run_asymmetric(Backend backend, int stage, const std::vector<ModuleId>& rank0,
                                        const std::vector<ModuleId>& rank1) {
  auto ranks = ranks_of(backend, 2);
  std::vector<std::string> errors(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(stage), ctx);
    TwoModules net(e);
    net.forward();
    net.backward({net.b, net.a});
    e.step();
    try {
      net.forward();
      net.backward(ctx.rank == 0 ? rank0 : rank1);
      e.step();
      errors[ctx.rank] = "";
    } catch (const Error& err) {
      errors[ctx.rank] = err.what();
    }
  });
  return errors;
}

class AsymmetricBackward : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

// Rank 1 skips B's backward (B's reduction is the first of the step): rank 0's reduction of
// B would pair with rank 1's of A (same shape).
TEST_P(AsymmetricBackward, SkippedFirstReductionFailsOnEveryRank) {
  auto [backend, stage] = GetParam();
  const ModuleId A{0}, B{1};
  std::vector<std::string> errors = run_asymmetric(backend, stage, {B, A}, {A});
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << backend_name(backend) << " stage " << stage << " rank " << r);
    ASSERT_FALSE(errors[r].empty()) << "the step completed: rank 1's missing backward of B went unnoticed";
    if (backend == Backend::tagless) {
      // No tags: the agreement (or a shape mismatch with it) catches it at step().
      EXPECT_THAT(errors[r], ::testing::AnyOf(HasSubstr("made different calls"), HasSubstr("mismatched collectives")));
    } else {
      EXPECT_THAT(errors[r], HasSubstr("mismatched collectives"));
      EXPECT_THAT(errors[r], HasSubstr("of 'B'"));  // names the module rank 0 reduced or gathered
      EXPECT_THAT(errors[r], HasSubstr("rank 1 issued"));
      EXPECT_THAT(errors[r], HasSubstr("step 1"));
    }
  }
}

// Rank 1 skips A's backward, the last reduction of the step: at stage 0 nothing else follows
// it before the step, so the step agreement must pair with rank 0's reduction of A.
TEST_P(AsymmetricBackward, SkippedLastReductionFailsOnEveryRankBeforeTheUpdate) {
  auto [backend, stage] = GetParam();
  const ModuleId A{0}, B{1};
  std::vector<std::string> errors = run_asymmetric(backend, stage, {B, A}, {B});
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << backend_name(backend) << " stage " << stage << " rank " << r);
    ASSERT_FALSE(errors[r].empty()) << "the step completed: rank 1's missing backward of A went unnoticed";
    if (backend != Backend::tagless) {
      EXPECT_THAT(errors[r], HasSubstr("mismatched collectives"));
      EXPECT_THAT(errors[r], HasSubstr("of 'A'"));
    }
  }
}

// Both ranks run both backward passes, in different orders: same collectives, same shapes,
// in a different order. Only the tags (or, without tags, the agreement's fingerprint) tell.
TEST_P(AsymmetricBackward, DifferentBackwardOrdersFailOnEveryRank) {
  auto [backend, stage] = GetParam();
  const ModuleId A{0}, B{1};
  std::vector<std::string> errors = run_asymmetric(backend, stage, {B, A}, {A, B});
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << backend_name(backend) << " stage " << stage << " rank " << r);
    ASSERT_FALSE(errors[r].empty()) << "the step completed with mixed gradients";
    if (backend == Backend::tagless && stage == 3) {
      // Stage 3's gathers and reductions interleave differently: the shapes differ at once.
      EXPECT_THAT(errors[r], HasSubstr("mismatched collectives"));
    } else if (backend == Backend::tagless) {
      EXPECT_THAT(errors[r], HasSubstr("made different calls in this step"));
      EXPECT_THAT(errors[r], HasSubstr(r == 0 ? "rank 1 made different calls" : "rank 0 made different calls"));
      EXPECT_THAT(errors[r], HasSubstr(r == 0 ? "backward calls: 'B', 'A'" : "backward calls: 'A', 'B'"));
    } else {
      EXPECT_THAT(errors[r], HasSubstr("mismatched collectives"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Misuse, AsymmetricBackward,
                         ::testing::Combine(::testing::Values(Backend::local, Backend::gloo, Backend::tagless),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return std::string(backend_name(std::get<0>(info.param))) + "_stage" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The same symmetric calls on both ranks pass the checks and train (tags never differ when
// the calls agree): parameters move as the averaged gradient says.
TEST(Misuse, SymmetricCallsTrainOnEveryBackend) {
  for (Backend backend : {Backend::local, Backend::gloo, Backend::tagless}) {
    auto ranks = ranks_of(backend, 2);
    run_ranks(ranks, [&](RankContext& ctx) {
      Config c = config(3);
      c.optimizer.type = OptimizerType::adam;
      c.optimizer.weight_decay = 0;
      Engine e(c, ctx);
      TwoModules net(e);
      for (int s = 0; s < 2; ++s) {
        net.forward();
        net.backward({net.b, net.a});
        StepResult r = e.step();
        EXPECT_FALSE(r.skipped);
      }
      // Adam's first steps move each element by about lr against the gradient's sign.
      std::vector<float> wa = e.gather_parameter(net.pa);
      EXPECT_NEAR(wa[3], 0.03f - 2 * 1e-2f, 1e-4f) << backend_name(backend);
    });
  }
}

// ---------------------------------------------------------------- calls out of order

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

class OutOfOrder : public ::testing::TestWithParam<int> {};

TEST_P(OutOfOrder, BackwardWithoutForwardIsAnErrorAtTheCall) {
  auto ranks = make_local_ranks(1, kTimeoutS);
  Engine e(config(GetParam()), ranks[0]);
  TwoModules net(e);
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }),
              HasSubstr("begin_backward('A') with no forward of 'A' in this micro-batch"));
  // Only B's forward ran: A's backward is still refused, B's is fine.
  { ForwardScope f(e, net.b); }
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }), HasSubstr("no forward of 'A'"));
  net.backward({net.b});
  EXPECT_FALSE(e.step().skipped);
  // A forward in the previous step licenses nothing in this one.
  net.forward();
  net.backward({net.b, net.a});
  e.step();
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }), HasSubstr("no forward of 'A'"));
}

TEST_P(OutOfOrder, SecondBackwardInAMicroBatchIsAnErrorAtTheCall) {
  auto ranks = make_local_ranks(1, kTimeoutS);
  Engine e(config(GetParam(), /*gas=*/2), ranks[0]);
  TwoModules net(e);
  net.forward();
  net.backward({net.b, net.a});
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }),
              HasSubstr("begin_backward('A'): 'A' already ran its backward in this micro-batch"));
  // The refused call changed nothing: the second micro-batch and the step go through.
  net.forward();
  net.backward({net.b, net.a});
  EXPECT_FALSE(e.step().skipped);
}

TEST_P(OutOfOrder, MoreMicroBatchesThanAccumulationStepsIsAnErrorAtTheCall) {
  auto ranks = make_local_ranks(1, kTimeoutS);
  Engine e(config(GetParam(), /*gas=*/2), ranks[0]);
  TwoModules net(e);
  for (int j = 0; j < 2; ++j) {
    net.forward();
    net.backward({net.b, net.a});
  }
  net.forward();
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.b); }),
              HasSubstr("'B' already ran its backward in all 2 micro-batch(es) of this step"));
  EXPECT_FALSE(e.step().skipped);
}

TEST_P(OutOfOrder, PhaseErrorsNameTheOpenPhase) {
  auto ranks = make_local_ranks(1, kTimeoutS);
  Engine e(config(GetParam()), ranks[0]);
  TwoModules net(e);
  e.begin_forward(net.a);
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }),
              HasSubstr("begin_backward('A') while 'A' is still in forward: end_forward('A') first"));
  EXPECT_THAT(usage_error_of([&] { e.begin_forward(net.a); }), HasSubstr("'A' is already in forward"));
  EXPECT_THAT(usage_error_of([&] { e.end_backward(net.a); }), HasSubstr("end_backward('A') while 'A' is in forward"));
  e.end_forward(net.a);
  EXPECT_THAT(usage_error_of([&] { e.end_forward(net.a); }), HasSubstr("end_forward('A') without begin_forward('A')"));
  e.begin_backward(net.a);
  EXPECT_THAT(usage_error_of([&] { e.begin_forward(net.a); }), HasSubstr("begin_forward('A') while 'A' is in backward"));
  EXPECT_THAT(usage_error_of([&] { e.end_forward(net.a); }), HasSubstr("end_forward('A') while 'A' is in backward"));
  EXPECT_THAT(usage_error_of([&] { e.begin_backward(net.a); }), HasSubstr("'A' is already in backward"));
  e.end_backward(net.a);
  EXPECT_THAT(usage_error_of([&] { e.end_backward(net.b); }), HasSubstr("end_backward('B') without begin_backward('B')"));
}

INSTANTIATE_TEST_SUITE_P(Misuse, OutOfOrder, ::testing::Values(0, 1, 2, 3));

// ---------------------------------------------------------------- legit patterns

// A fused head: its forward runs inside its backward scope.
TEST(Misuse, InBackwardModuleNeedsNoForwardButRunsOncePerMicroBatch) {
  auto ranks = make_local_ranks(1, kTimeoutS);
  Engine e(config(3), ranks[0]);
  std::vector<float> w(16, 0.5f), h(16, 0.25f);
  ModuleId body = e.add_module("body", {e.add_parameter("w", {16}, w)});
  ModuleId head = e.add_module("head", {e.add_parameter("h", {16}, h)}, ForwardMode::in_backward);
  for (int s = 0; s < 2; ++s) {
    { ForwardScope f(e, body); }
    { BackwardScope b(e, head); }
    EXPECT_THAT(usage_error_of([&] { e.begin_backward(head); }),
                HasSubstr("begin_backward('head'): 'head' already ran its backward in this micro-batch"));
    { BackwardScope b(e, body); }
    e.step();
  }
  { ForwardScope f(e, head); }  // evaluation forwards of it are fine too
}

// Activation checkpointing (the forward recomputed right before each backward), evaluation
// forwards between micro-batches and gradient accumulation train exactly as the plain run.
TEST(Misuse, RecomputedAndEvaluationForwardsTrainBitwiseAsThePlainRun) {
  for (int stage : {0, 3}) {
    auto run = [&](bool extra_forwards) {
      auto ranks = make_local_ranks(2, kTimeoutS);
      std::vector<float> out;
      std::mutex m;
      run_ranks(ranks, [&](RankContext& ctx) {
        Engine e(config(stage, /*gas=*/2), ctx);
        TwoModules net(e);
        for (int s = 0; s < 3; ++s) {
          for (int j = 0; j < 2; ++j) {
            if (extra_forwards) net.forward();  // evaluation
            net.forward();
            for (ModuleId mod : {net.b, net.a}) {
              if (extra_forwards) ForwardScope recompute(e, mod);
              BackwardScope bs(e, mod);
              for (std::int64_t i = 0; i < bs.tensors().grads[0].numel(); ++i)
                test::add(bs.tensors().grads[0], i, 0.1f * (ctx.rank + 1) + 0.01f * (s + j + i));
            }
          }
          e.step();
        }
        std::vector<float> wb = e.gather_parameter(net.pb);
        std::lock_guard lock(m);
        if (ctx.rank == 0) out = wb;
      });
      return out;
    };
    std::vector<float> plain = run(false), extra = run(true);
    ASSERT_EQ(plain.size(), static_cast<std::size_t>(TwoModules::kN));
    EXPECT_NE(plain[5], -0.02f * 5) << "the parameters did not move";
    EXPECT_EQ(std::memcmp(plain.data(), extra.data(), plain.size() * sizeof(float)), 0) << "stage " << stage;
  }
}

// Tied weights (a head listing layer 0's weight) over two ranks at every stage: the checks
// pass and the stages agree bitwise, as before them.
TEST(Misuse, TiedWeightsPassTheChecksAtEveryStage) {
  test::NetSpec spec{{8, 8, 8, 8}, true, 9};
  Config c0 = config(0);
  c0.zoe.comm_timeout_s = kTimeoutS;
  test::RunResult ref = test::train(c0, spec, 2, 3, 8);
  for (int stage = 1; stage <= 3; ++stage)
    EXPECT_TRUE(test::bitwise_equal(test::train(config(stage), spec, 2, 3, 8), ref)) << "stage " << stage;
}

// ---------------------------------------------------------------- stale views

TEST(Misuse, HostDeviceQuarantinePoisonsFreedBlocks) {
  HostDevice d;
  void* a = d.allocate(3 << 20);
  std::memset(a, 0, 3 << 20);
  d.deallocate(a);
  void* cached = d.allocate(3 << 20);
  if (HostDevice::kCachesBlocks) EXPECT_EQ(cached, a) << "without the debug mode the block cache hands the block back";
  d.set_poison_freed(8 << 20);
  d.deallocate(cached);
  EXPECT_EQ(d.cached_bytes(), 0u);
  EXPECT_EQ(d.quarantined_bytes(), 3u << 20);
  const auto* f = static_cast<const float*>(cached);  // still ours: quarantined, not freed
  EXPECT_TRUE(std::isnan(f[0]) && std::isnan(f[(3 << 18) - 1]));
  void* b = d.allocate(3 << 20);
  EXPECT_NE(b, cached) << "a quarantined block was handed out again";
  d.deallocate(b);
  void* c = d.allocate(3 << 20);  // quarantine over 8 MiB: the oldest block goes back first
  d.deallocate(c);
  EXPECT_LE(d.quarantined_bytes(), 8u << 20);
}

// A view kept past end_forward (stage 3: the gathered buffer is freed, even a persistent
// group's) and a gradient view kept past end_backward (stages 2-3: reduced and freed) read NaN
// in the debug mode, not another module's values; results are bitwise those of the normal mode.
TEST(Misuse, DebugPoisonTurnsStaleViewsIntoNaN) {
  constexpr int kN = 300'000;
  for (int variant : {2, 3, 4}) {  // stage 2, stage 3, stage 3 with persistent groups
    const int stage = std::min(variant, 3);
    auto run = [&](bool poison) {
      // 2 x 1.2 MB per step written element by element: more headroom under TSan.
      auto ranks = make_local_ranks(2, 6 * kTimeoutS);
      std::vector<float> result;
      std::mutex m;
      run_ranks(ranks, [&](RankContext& ctx) {
        Config c = config(stage);
        c.zoe.debug_poison = poison;
        if (variant == 4) c.zero_optimization.stage3_param_persistence_threshold = 1'000'000;
        // Sub-groups below the host Adam's parallel grain: the update runs on the update
        // stream's thread, not on oneTBB's (uninstrumented) workers, so TSan sees its order.
        c.zero_optimization.sub_group_size = 1 << 14;
        Engine e(c, ctx);
        std::vector<float> va(kN, 1.0f), vb(kN, 2.0f);
        ParamId pa = e.add_parameter("wa", {kN}, va);
        ModuleId A = e.add_module("A", {pa});
        ModuleId B = e.add_module("B", {e.add_parameter("wb", {kN}, vb)});
        for (int s = 0; s < 2; ++s) {
          const float* stale = e.begin_forward(A).params[0].as<float>();
          if (s == 0) EXPECT_EQ(stale[7], 1.0f);
          e.end_forward(A);
          { ForwardScope f(e, B); }
          if (poison && stage == 3) {
            int nan = 0;
            for (int i = 0; i < kN; i += 997) nan += std::isnan(stale[i]) ? 1 : 0;
            EXPECT_EQ(nan, (kN + 996) / 997) << "a stale parameter view read numbers, step " << s << ", variant " << variant;
          }
          for (ModuleId mod : {B, A}) {
            ModuleTensors t = e.begin_backward(mod);
            for (std::int64_t i = 0; i < kN; ++i) t.grads[0].as<float>()[i] = 1e-3f * ((i % 7) + ctx.rank);
            const float* stale_grad = t.grads[0].as<float>();
            e.end_backward(mod);
            if (poison) EXPECT_TRUE(std::isnan(stale_grad[kN / 2])) << "a stale gradient view read a number";
          }
          e.step();
        }
        std::vector<float> wa = e.gather_parameter(pa);
        std::lock_guard lock(m);
        if (ctx.rank == 0) result = wa;
      });
      return result;
    };
    std::vector<float> plain = run(false), poisoned = run(true);
    ASSERT_EQ(plain.size(), static_cast<std::size_t>(kN));
    EXPECT_NE(plain[0], 1.0f);
    EXPECT_EQ(std::memcmp(plain.data(), poisoned.data(), plain.size() * sizeof(float)), 0)
        << "the debug mode changed results, variant " << variant;
  }
}

}  // namespace
