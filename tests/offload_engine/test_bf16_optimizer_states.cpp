// zoe.optimizer_state_dtype = bf16: exp_avg and exp_avg_sq stored in bf16 on the CPU optimizer's
// tier (host memory or NVMe), the fp32 master and fp32 math unchanged.
//  - The engine's parameters equal an independent scalar reference (torch's AdamW with the
//    moments rounded to nearest even after each step, tests/optim/adam_reference.hpp) bit for
//    bit, at stages 2-3, 1-2 ranks, cpu and nvme tiers.
//  - bf16 states give the same bits wherever they live and at either stage (bf16 compute,
//    1-2 micro-batches); the NVMe tier holds 8 bytes of states per element instead of 12.
//  - Checkpoints hold fp32 states in both modes: a fp32-state checkpoint loads into a bf16-state
//    engine (moments rounded once) and a bf16-state one into a fp32-state engine (exact), each
//    continuing as the reference says; a bf16 checkpoint resumed in bf16 equals the unbroken run.
//  - The key is refused where it cannot be honoured (no CPU optimizer, ratio < 1) or misspelt.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/core/config_refusal.hpp"
#include "tests/core/test_net.hpp"
#include "tests/optim/adam_reference.hpp"

using namespace zoe;

namespace {

constexpr std::int64_t kN = 1000;  // one parameter of kN elements, sub-groups of 128
constexpr double kLr = 1e-2, kWeightDecay = 0.01;

/// The trainer's gradient of step t (1-based), element i: the same on every rank, so the
/// ranks' mean is this value exactly.
float grad_of(std::int64_t t, std::int64_t i) { return zoe::test::hashed_uniform(static_cast<std::uint64_t>(t), i, 0.5f); }
float initial(std::int64_t i) { return zoe::test::hashed_uniform(99, i, 1.0f); }

struct Mode {
  int stage = 2;
  int world = 1;
  OffloadDevice tier = OffloadDevice::cpu;
  OptimizerStateDType states = OptimizerStateDType::bf16;
  std::string name() const {
    return "stage " + std::to_string(stage) + " world " + std::to_string(world) +
           (tier == OffloadDevice::cpu ? " cpu" : " nvme") + (states == OptimizerStateDType::bf16 ? " bf16" : " fp32") +
           " states";
  }
};

Config config_of(const Mode& m, const std::string& nvme_dir) {
  Config c;
  c.zero_optimization.stage = m.stage;
  c.optimizer.lr = kLr;
  c.optimizer.weight_decay = kWeightDecay;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 128;
  c.zero_optimization.offload_optimizer.device = m.tier;
  c.zero_optimization.offload_optimizer.nvme_path = nvme_dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zoe.optimizer_state_dtype = m.states;
  return c;
}

/// Runs steps first+1 .. first+steps of the one-parameter model (fp32 compute: the trainer's
/// gradient reaches the optimizer unchanged), loading `load` first and saving to `save` after,
/// if given. Returns the final parameter (rank 0's gather).
std::vector<float> run(const Mode& m, const std::string& nvme_dir, std::int64_t first, int steps,
                       const std::string& load = {}, const std::string& save = {}) {
  std::vector<float> result;
  auto ranks = make_local_ranks(m.world, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config_of(m, nvme_dir), ctx);
    std::vector<float> init(kN);
    for (std::int64_t i = 0; i < kN; ++i) init[static_cast<std::size_t>(i)] = initial(i);
    const ParamId p = e.add_parameter("w", {kN}, init);
    const ModuleId mod = e.add_module("m", {p});
    if (!load.empty()) e.load_checkpoint(load);
    for (int s = 0; s < steps; ++s) {
      { ForwardScope f(e, mod); }
      {
        BackwardScope b(e, mod);
        float* g = b.tensors().grads[0].as<float>();
        for (std::int64_t i = 0; i < kN; ++i) g[i] = grad_of(first + s + 1, i);
      }
      e.step();
    }
    e.synchronize();
    if (!save.empty()) e.save_checkpoint(save);
    std::vector<float> w = e.gather_parameter(p);
    if (ctx.rank == 0) result = std::move(w);
  });
  return result;
}

/// The reference: torch's AdamW step by step, with fp32 or bf16-stored moments.
struct Reference {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> m16, v16;
  std::int64_t t = 0;
  Reference() : p(kN), m(kN, 0.0f), v(kN, 0.0f), m16(kN, 0), v16(kN, 0) {
    for (std::int64_t i = 0; i < kN; ++i) p[static_cast<std::size_t>(i)] = initial(i);
  }
  RefHyper hyper() const {
    RefHyper h;
    h.lr = kLr;
    h.weight_decay = kWeightDecay;
    return h;
  }
  std::vector<float> grad(std::int64_t step) const {
    std::vector<float> g(kN);
    for (std::int64_t i = 0; i < kN; ++i) g[static_cast<std::size_t>(i)] = grad_of(step, i);
    return g;
  }
  void fp32_steps(int n) {
    for (int k = 0; k < n; ++k) ++t, ref_adam_step(hyper(), t, 1.0f, p, m, v, grad(t));
  }
  void bf16_steps(int n) {
    for (int k = 0; k < n; ++k) ++t, ref_adam_step_bf16_states(hyper(), t, 1.0f, p, m16, v16, grad(t));
  }
  // What a checkpoint carries between the modes: fp32 moments, rounded or widened.
  void to_bf16() {
    for (std::size_t i = 0; i < p.size(); ++i) m16[i] = ref_float_to_bf16(m[i]), v16[i] = ref_float_to_bf16(v[i]);
  }
  void to_fp32() {
    for (std::size_t i = 0; i < p.size(); ++i) m[i] = ref_bf16_to_float(m16[i]), v[i] = ref_bf16_to_float(v16[i]);
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return std::min(a.size(), b.size());
}

}  // namespace

TEST(Bf16OptimizerStates, EqualTheScalarReferenceBitwise) {
  const std::string dir = zoe::test::temp_dir("bf16-states-ref");
  Reference ref;
  ref.bf16_steps(5);
  Reference fp32_ref;
  fp32_ref.fp32_steps(5);
  EXPECT_FALSE(same_bits(ref.p, fp32_ref.p)) << "the rounding of the moments must show after 5 steps";
  for (int stage : {2, 3})
    for (int world : {1, 2})
      for (OffloadDevice tier : {OffloadDevice::cpu, OffloadDevice::nvme}) {
        const Mode m{stage, world, tier, OptimizerStateDType::bf16};
        SCOPED_TRACE(m.name());
        const std::vector<float> got = run(m, dir, 0, 5);
        EXPECT_TRUE(same_bits(got, ref.p)) << "first difference at element " << first_difference(got, ref.p);
      }
  // The fp32 mode against its own reference, so the harness is known to be exact.
  const std::vector<float> fp32 = run(Mode{3, 2, OffloadDevice::nvme, OptimizerStateDType::fp32}, dir, 0, 5);
  EXPECT_TRUE(same_bits(fp32, fp32_ref.p)) << "first difference at element " << first_difference(fp32, fp32_ref.p);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

TEST(Bf16OptimizerStates, CheckpointsLoadIntoEitherMode) {
  const std::string dir = zoe::test::temp_dir("bf16-states-ckpt");
  const std::string nvme = dir + "/nvme";
  std::filesystem::create_directories(nvme);
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Mode fp32{stage, 2, OffloadDevice::nvme, OptimizerStateDType::fp32};
    const Mode bf16{stage, 2, OffloadDevice::cpu, OptimizerStateDType::bf16};
    const std::string c32 = dir + "/fp32-" + std::to_string(stage), c16 = dir + "/bf16-" + std::to_string(stage);
    run(fp32, nvme, 0, 3, {}, c32);
    run(bf16, nvme, 0, 3, {}, c16);

    // fp32 states -> bf16 states: the moments rounded once at the load; bf16 -> fp32: widened
    // exactly.
    for (bool from_fp32 : {true, false}) {
      Reference ref;
      if (from_fp32) {
        ref.fp32_steps(3), ref.to_bf16(), ref.bf16_steps(3);
      } else {
        ref.bf16_steps(3), ref.to_fp32(), ref.fp32_steps(3);
      }
      const std::vector<float> got = run(from_fp32 ? bf16 : fp32, nvme, 3, 3, from_fp32 ? c32 : c16);
      EXPECT_TRUE(same_bits(got, ref.p)) << (from_fp32 ? "fp32 checkpoint into bf16 states" : "bf16 checkpoint into fp32 states")
                                         << ": first difference at " << first_difference(got, ref.p);
    }

    // bf16 -> bf16, through the other tier: the unbroken run's bits.
    const std::vector<float> unbroken = run(bf16, nvme, 0, 6);
    const std::vector<float> resumed = run(Mode{stage, 2, OffloadDevice::nvme, OptimizerStateDType::bf16}, nvme, 3, 3, c16);
    EXPECT_TRUE(same_bits(resumed, unbroken)) << "first difference at " << first_difference(resumed, unbroken);
  }
  std::filesystem::remove_all(dir);
}

TEST(Bf16OptimizerStates, SameBitsOnEveryTierAndStageAndHalfTheStateBytes) {
  const std::string dir = zoe::test::temp_dir("bf16-states-net");
  const zoe::test::NetSpec net{{16, 32, 32, 8}, true, 5};
  for (int world : {1, 2})
    for (int gas : {1, 2}) {
      SCOPED_TRACE("world " + std::to_string(world) + " gas " + std::to_string(gas));
      auto cfg = [&](int stage, OffloadDevice tier, OptimizerStateDType states) {
        Config c = config_of(Mode{stage, world, tier, states}, dir);
        c.bf16.enabled = true;
        c.zero_optimization.sub_group_size = 64;
        c.gradient_accumulation_steps = gas;
        return c;
      };
      const auto ref = zoe::test::train(cfg(2, OffloadDevice::cpu, OptimizerStateDType::bf16), net, world, 8, 16);
      const auto fp32 = zoe::test::train(cfg(3, OffloadDevice::nvme, OptimizerStateDType::fp32), net, world, 8, 16);
      EXPECT_FALSE(zoe::test::bitwise_equal(ref, fp32)) << "bf16 states changed nothing";
      for (int stage : {2, 3}) {
        const auto nvme = zoe::test::train(cfg(stage, OffloadDevice::nvme, OptimizerStateDType::bf16), net, world, 8, 16);
        EXPECT_TRUE(zoe::test::bitwise_equal(nvme, ref)) << "stage " << stage << " nvme";
        for (int k = 0; k < world; ++k) {
          // NVMe: 8 bytes of states + g of gradient per element against 12 + g (g: bf16 as
          // reduced with one micro-batch per step, else fp32).
          const std::int64_t g = gas == 1 ? 2 : 4;
          const std::int64_t elements = fp32.memory[k].nvme_model_states / (12 + g);
          if (stage == 3) {
            EXPECT_EQ(fp32.memory[k].nvme_model_states % (12 + g), 0);
            EXPECT_EQ(nvme.memory[k].nvme_model_states, (8 + g) * elements) << "rank " << k;
          }
        }
        if (stage == 3) {
          const auto cpu = zoe::test::train(cfg(stage, OffloadDevice::cpu, OptimizerStateDType::bf16), net, world, 8, 16);
          EXPECT_TRUE(zoe::test::bitwise_equal(cpu, ref)) << "stage 3 cpu";
          EXPECT_EQ(cpu.losses, ref.losses);
        }
      }
    }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

TEST(Bf16OptimizerStates, RefusedWhereItCannotBeHonoured) {
  auto refused = [](const Config& c, const std::string& needle) {
    zoe::test::expect_config_refused(c, "zoe.optimizer_state_dtype", needle);
  };
  Config c;
  c.zero_optimization.stage = 2;
  c.zoe.optimizer_state_dtype = OptimizerStateDType::bf16;
  refused(c, "offload_optimizer.device");
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  c.zero_optimization.offload_optimizer.ratio = 0.5;
  refused(c, "ratio");
  try {
    (void)Config::from_json(R"({"zoe": {"optimizer_state_dtype": "fp16"}})");
    ADD_FAILURE() << "optimizer_state_dtype fp16 was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zoe.optimizer_state_dtype"), std::string::npos) << what;
    EXPECT_NE(what.find("fp16"), std::string::npos) << what;
  }
  const Config parsed = Config::from_json(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zoe": {"optimizer_state_dtype": "bf16"}})");
  EXPECT_EQ(parsed.zoe.optimizer_state_dtype, OptimizerStateDType::bf16);
  EXPECT_NE(parsed.to_json().find("\"optimizer_state_dtype\": \"bf16\""), std::string::npos);
}
