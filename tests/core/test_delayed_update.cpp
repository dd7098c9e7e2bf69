// The one-step-delayed update (zoe.delayed_update, ZeRO-Offload's DPU): forward/backward of
// step k+1 see the parameters of update k-1. Checked against an independent reference of
// that recurrence on a quadratic loss whose gradient is written by hand: with per-rank
// targets t_r, rank r's gradient is w - t_r, the engine sums them in rank order and Adam
// (kernels::adam_update, the same per-element math the engine runs) takes grad_scale 1/world.
//   M_0 = init; Q_0 = Q_1 = M_0; g_k = sum_r (Q_k - t_r); M_{k+1} = Adam(M_k, g_k / world);
//   Q_{k+1} = M_k (k >= 1).
// Stages 1-3 with optimizer offload cpu and nvme match it bitwise; and the plain
// (undelayed) engine does not, so the test can fail. With frozen parameters beside w (and a
// module of frozen parameters only) w still matches it, the frozen values never change, and a
// checkpoint of the delayed engine resumes bitwise.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "kernels/adam_math.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;

namespace {

constexpr int kWorld = 2, kSteps = 12;
constexpr std::int64_t kN = 100;

float target(int rank, std::int64_t i) { return 0.01f * static_cast<float>((i * 7 + rank * 13) % 23) - 0.1f; }
float initial(std::int64_t i) { return 0.05f * static_cast<float>(i % 11) - 0.2f; }

Config config(int stage, OffloadDevice offload, bool delayed) {
  // (reference() reads only the optimizer settings.)
  Config c;
  c.zero_optimization.stage = stage;
  c.optimizer.lr = 0.05;
  c.optimizer.weight_decay = 0.01;
  c.zoe.optimizer_threads = 1;
  c.zoe.delayed_update = delayed;
  c.zero_optimization.sub_group_size = 32;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path =
      (std::filesystem::temp_directory_path() / ("zoe-dpu-" + std::to_string(getpid()))).string();
  return c;
}

float frozen_value(std::int64_t i) { return 0.03f * static_cast<float>(i % 13) - 0.15f; }

// The engine's final master weights (rank 0's gather). `with_frozen`: module m also holds a
// frozen parameter f [37], and a second module n holds only a frozen parameter e [50]; every
// forward checks that both still hold their initial values, bit for bit.
// `save` at step `save_at` (before its forward; the save applies the pending update), `load`
// before step `from`.
struct Checkpointing {
  int save_at = -1;
  std::string save, load;
  int from = 0;
};
std::vector<float> run(const Config& c, bool with_frozen = false, const Checkpointing& ck = {}) {
  auto ranks = make_local_ranks(kWorld, 60.0);
  std::vector<float> out;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    std::vector<float> init(kN), fixed(50);
    for (std::int64_t i = 0; i < kN; ++i) init[i] = initial(i);
    for (std::int64_t i = 0; i < 50; ++i) fixed[static_cast<std::size_t>(i)] = frozen_value(i);
    const ParamOptions frozen{std::nullopt, 1.0, true};
    ParamId w = e.add_parameter("w", {kN}, init);
    std::vector<ParamId> m_params{w};
    if (with_frozen) m_params.push_back(e.add_parameter("f", {37}, std::span<const float>(fixed).first(37), frozen));
    ModuleId m = e.add_module("m", m_params);
    std::optional<ModuleId> n;
    if (with_frozen) n = e.add_module("n", {e.add_parameter("e", {50}, fixed, frozen)});
    auto check_frozen = [&](const ModuleTensors& t, std::size_t at, std::int64_t count, int k) {
      ASSERT_EQ(std::memcmp(t.params[at].data, fixed.data(), static_cast<std::size_t>(count) * sizeof(float)), 0)
          << "frozen values changed by step " << k;
      ASSERT_EQ(t.grads.size() > at ? t.grads[at].data : nullptr, nullptr);
    };
    if (!ck.load.empty()) e.load_checkpoint(ck.load);
    for (int k = ck.from; k < kSteps; ++k) {
      if (k == ck.save_at) e.save_checkpoint(ck.save);
      std::vector<float> seen(kN);
      ModuleTensors f = e.begin_forward(m);
      std::memcpy(seen.data(), f.params[0].data, kN * sizeof(float));
      if (with_frozen) check_frozen(f, 1, 37, k);
      e.end_forward(m);
      if (n) {
        ForwardScope fn(e, *n);
        check_frozen(fn.tensors(), 0, 50, k);
      }
      if (n) {
        BackwardScope bn(e, *n);
        check_frozen(bn.tensors(), 0, 50, k);
      }
      ModuleTensors b = e.begin_backward(m);
      auto* g = static_cast<float*>(b.grads[0].data);
      for (std::int64_t i = 0; i < kN; ++i) g[i] += seen[i] - target(ctx.rank, i);
      if (with_frozen) check_frozen(b, 1, 37, k);
      e.end_backward(m);
      e.step();
    }
    std::vector<float> final_w = e.gather_parameter(w);
    if (ctx.rank == 0) out = final_w;
  });
  return out;
}

std::vector<float> reference(const Config& c, bool delayed) {
  std::vector<float> M(kN), m(kN, 0.0f), v(kN, 0.0f), Q(kN), prev(kN);
  for (std::int64_t i = 0; i < kN; ++i) M[i] = Q[i] = initial(i);
  const auto& o = c.optimizer;
  for (int k = 0; k < kSteps; ++k) {
    const auto coeffs = kernels::adam_coeffs(o.lr, o.betas[0], o.betas[1], o.eps, o.weight_decay, true, k + 1,
                                             static_cast<float>(1.0 / kWorld));
    prev = M;
    for (std::int64_t i = 0; i < kN; ++i) {
      float g = 0.0f;
      for (int r = 0; r < kWorld; ++r) g += Q[i] - target(r, i);
      kernels::adam_update(coeffs, g, M[i], m[i], v[i]);
    }
    Q = delayed ? prev : M;  // the next forward sees M_k (delayed) or M_{k+1}
  }
  return M;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(DelayedUpdate, FollowsTheOneStepDelayedRecurrenceBitwise) {
  const std::vector<float> delayed_ref = reference(config(1, OffloadDevice::cpu, true), true);
  const std::vector<float> plain_ref = reference(config(1, OffloadDevice::cpu, false), false);
  ASSERT_FALSE(same_bits(delayed_ref, plain_ref)) << "the delay must change the math for this test to mean anything";
  for (int stage : {1, 2, 3}) {  // the delayed update needs optimizer offload, hence stage >= 1
    for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
      for (bool overlap : {true, false}) {
        Config c = config(stage, d, true);
        c.zoe.overlap_step = overlap;
        EXPECT_TRUE(same_bits(run(c), delayed_ref)) << "stage " << stage << " offload " << static_cast<int>(d)
                                                    << " overlap " << overlap;
      }
    }
    EXPECT_TRUE(same_bits(run(config(stage, OffloadDevice::cpu, false)), plain_ref)) << "undelayed, stage " << stage;
  }
  std::filesystem::remove_all(config(1, OffloadDevice::nvme, true).zero_optimization.offload_optimizer.nvme_path);
}

TEST(DelayedUpdate, FrozenParametersStayAndTheTrainableOnesFollowTheRecurrence) {
  // Frozen groups have no update to delay: they stay settled, their values unchanged at every
  // forward and backward (also a module with frozen parameters only), and the trainable
  // parameter beside them follows the delayed recurrence bit for bit.
  const std::vector<float> delayed_ref = reference(config(1, OffloadDevice::cpu, true), true);
  for (int stage : {1, 2, 3})
    for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme})
      EXPECT_TRUE(same_bits(run(config(stage, d, true), true), delayed_ref))
          << "stage " << stage << " offload " << static_cast<int>(d);
  // A checkpoint of such an engine (the save applies the pending update): loading it and
  // training on equals the saving run continued, bit for bit.
  const std::string dir = config(1, OffloadDevice::nvme, true).zero_optimization.offload_optimizer.nvme_path;
  for (int stage : {1, 3}) {
    const Config c = config(stage, OffloadDevice::nvme, true);
    const std::vector<float> continued = run(c, true, {.save_at = 6, .save = dir + "/ckpt"});
    EXPECT_FALSE(same_bits(continued, delayed_ref)) << "the save applies the pending update: another run";
    EXPECT_TRUE(same_bits(run(c, true, {.load = dir + "/ckpt", .from = 6}), continued)) << "stage " << stage;
  }
  std::filesystem::remove_all(dir);
}

TEST(DelayedUpdate, RefusedWithParameterOffload) {
  Config c = config(3, OffloadDevice::cpu, true);
  c.zero_optimization.offload_param.device = OffloadDevice::cpu;
  auto ranks = make_local_ranks(1, 10.0);
  try {
    Engine e(c, ranks[0]);
    FAIL() << "accepted";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.key(), "zoe.delayed_update");
  }
}
