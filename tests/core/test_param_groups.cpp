// Parameter groups (per-parameter weight decay and lr factor, frozen parameters) and the
// trainer's conveniences (scalar all-reduce, lookup by name, reading / writing a parameter).
//  - The optimizer math against an independent double-precision AdamW with per-parameter decay.
//  - Bitwise equality of every stage 0-3, optimizer offload none / cpu / nvme (ratio 1 and 0.6:
//    of the 6 sub-groups per rank at stages 1-3, A's first 2 of 3 stay on the device optimizer,
//    so one group's runs of options are split between the two optimizers), parameter offload, both host modes
//    (the ctest twin runs ZOE_HOST_MEMORY=discrete).
//  - Frozen parameters: unchanged bitwise, no gradient view, not reduced, no state bytes (the
//    ledger's exact numbers, from the layout rule of docs/architecture.md).
//  - fp16 with loss scaling and 2 micro-batches of gradient accumulation: stages 0-3 and the
//    optimizer offloads bitwise equal (gradients whose every partial sum is exact), and the
//    double reference.
//  - A checkpoint with frozen parameters resumes bitwise (the rest: test_checkpoint_frozen.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "tests/core/test_net.hpp"
#include "zoe/safetensors.hpp"

using namespace zoe;

namespace {

// The model: three modules.
//  A: A.w [8, 9] (decay 0.1), A.b [5] (no decay)
//  B: B.w [33] (decay 0.05, lr x 0.5), B.ln [7] (frozen), B.b [3] (no decay, lr x 2)
//  C: C.emb [20] (frozen), and A.w again (tied: its gradient adds from both modules)
struct Spec {
  std::string name;
  std::int64_t numel;
  ParamOptions options;
};
const std::vector<Spec> kParams = {
    {"A.w", 72, {0.1, 1.0, false}}, {"A.b", 5, {0.0, 1.0, false}},   {"B.w", 33, {0.05, 0.5, false}},
    {"B.ln", 7, {std::nullopt, 1.0, true}}, {"B.b", 3, {0.0, 2.0, false}}, {"C.emb", 20, {std::nullopt, 1.0, true}},
};
const std::vector<std::vector<int>> kModules = {{0, 1}, {2, 3, 4}, {5, 0}};
const char* kModuleNames[] = {"A", "B", "C"};

float initial(int p, std::int64_t i) { return zoe::test::hashed_uniform(100 + p, i, 1.0f); }

// The gradient rank `rank` adds for element i of parameter p in module m at step s: a multiple
// of 2^-10 in [-1, 1], so sums over modules and ranks and the mean over 2 or 4 ranks are exact
// in fp32 (and the reference gradient is exact).
float grad_value(int s, int rank, int m, int p, std::int64_t i) {
  const float u = zoe::test::hashed_uniform(1000 * (s + 1) + 100 * rank + 10 * m + p, i, 1.0f);
  return std::round(u * 1024.0f) / 1024.0f;
}

Config base(int stage, DType dtype) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = dtype == DType::bf16;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.02;  // what the frozen ones would get; none of the others use it
  c.zero_optimization.sub_group_size = 16;  // runs of options cross sub-group boundaries
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  return c;
}

struct Model {
  std::vector<ParamId> params;
  std::vector<ModuleId> modules;
};

Model build(Engine& e, bool by_group = false) {
  Model m;
  for (std::size_t p = 0; p < kParams.size(); ++p) {
    const int pi = static_cast<int>(p);
    auto init = [pi](std::int64_t offset, std::span<float> out) {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = initial(pi, offset + static_cast<std::int64_t>(i));
    };
    m.params.push_back(e.add_parameter(kParams[p].name, {kParams[p].numel}, init, by_group ? ParamOptions{} : kParams[p].options));
  }
  if (by_group) {  // the same options as torch-style named groups
    e.add_param_group({"decay", [](const std::string& n) { return n == "A.w"; }, {0.1, 1.0, false}});
    e.add_param_group({"no_decay", [](const std::string& n) { return n == "A.b"; }, {0.0, 1.0, false}});
    e.add_param_group({"slow", [](const std::string& n) { return n == "B.w"; }, {0.05, 0.5, false}});
    e.add_param_group({"fast", [](const std::string& n) { return n == "B.b"; }, {0.0, 2.0, false}});
    e.add_param_group({"frozen", [](const std::string& n) { return n == "B.ln" || n == "C.emb"; }, {{}, 1.0, true}});
  }
  for (std::size_t k = 0; k < kModules.size(); ++k) {
    std::vector<ParamId> ids;
    for (int p : kModules[k]) ids.push_back(m.params[static_cast<std::size_t>(p)]);
    m.modules.push_back(e.add_module(kModuleNames[k], ids));
  }
  return m;
}

// One step: forward of every module, then backward in reverse adding grad_value; checks that a
// frozen parameter's gradient view is null.
void train_step(Engine& e, const Model& m, int s) {
  for (ModuleId id : m.modules) {
    ForwardScope f(e, id);
  }
  for (int k = static_cast<int>(m.modules.size()) - 1; k >= 0; --k) {
    BackwardScope b(e, m.modules[static_cast<std::size_t>(k)]);
    const auto& t = b.tensors();
    for (std::size_t j = 0; j < kModules[static_cast<std::size_t>(k)].size(); ++j) {
      const int p = kModules[static_cast<std::size_t>(k)][j];
      const TensorView& g = t.grads[j];
      ASSERT_EQ(g.data == nullptr, kParams[static_cast<std::size_t>(p)].options.frozen) << kParams[p].name;
      if (!g.data) continue;
      for (std::int64_t i = 0; i < g.numel(); ++i) zoe::test::add(g, i, grad_value(s, e.rank(), k, p, i));
    }
  }
  e.step();
}

struct Result {
  std::vector<std::vector<float>> values;  // every parameter after training (rank 0)
  std::vector<MemoryReport> memory;
  std::vector<TrafficReport> traffic;
};

Result run(const Config& c, int world, int steps, bool by_group = false,
           const std::function<void(Engine&, const Model&)>& before = {}) {
  Result r;
  r.memory.resize(static_cast<std::size_t>(world));
  r.traffic.resize(static_cast<std::size_t>(world));
  std::vector<std::vector<std::vector<float>>> values(static_cast<std::size_t>(world));
  run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
    Engine e(c, ctx);
    Model m = build(e, by_group);
    if (before) before(e, m);
    for (int s = 0; s < steps; ++s) train_step(e, m, s);
    e.synchronize();
    r.memory[static_cast<std::size_t>(ctx.rank)] = e.memory_report();
    r.traffic[static_cast<std::size_t>(ctx.rank)] = e.last_step_traffic();
    for (ParamId p : m.params) values[static_cast<std::size_t>(ctx.rank)].push_back(e.gather_parameter(p));
  });
  r.values = values[0];
  return r;
}

bool bitwise(const Result& a, const Result& b, std::string* where) {
  for (std::size_t p = 0; p < a.values.size(); ++p)
    if (a.values[p].size() != b.values[p].size() ||
        std::memcmp(a.values[p].data(), b.values[p].data(), a.values[p].size() * sizeof(float)) != 0) {
      *where = kParams[p].name;
      return false;
    }
  return true;
}

// The reference: AdamW (torch.optim.AdamW, decoupled decay) in double, each parameter with its
// own decay and lr, on the exact mean gradient.
std::vector<std::vector<double>> reference(const Config& c, int world, int steps) {
  const auto& o = c.optimizer;
  std::vector<std::vector<double>> p(kParams.size()), m(kParams.size()), v(kParams.size());
  for (std::size_t q = 0; q < kParams.size(); ++q) {
    for (std::int64_t i = 0; i < kParams[q].numel; ++i) p[q].push_back(initial(static_cast<int>(q), i));
    m[q].assign(p[q].size(), 0.0);
    v[q].assign(p[q].size(), 0.0);
  }
  for (int s = 0; s < steps; ++s) {
    const double t = s + 1;
    for (std::size_t q = 0; q < kParams.size(); ++q) {
      if (kParams[q].options.frozen) continue;
      const double wd = *kParams[q].options.weight_decay, lr = o.lr * kParams[q].options.lr_scale;
      for (std::size_t i = 0; i < p[q].size(); ++i) {
        double g = 0;
        for (int r = 0; r < world; ++r)
          for (std::size_t k = 0; k < kModules.size(); ++k)
            for (int pp : kModules[k])
              if (pp == static_cast<int>(q)) g += grad_value(s, r, static_cast<int>(k), pp, static_cast<std::int64_t>(i));
        g /= world;
        p[q][i] *= 1.0 - lr * wd;
        m[q][i] = o.betas[0] * m[q][i] + (1 - o.betas[0]) * g;
        v[q][i] = o.betas[1] * v[q][i] + (1 - o.betas[1]) * g * g;
        const double mhat = m[q][i] / (1 - std::pow(o.betas[0], t)), vhat = v[q][i] / (1 - std::pow(o.betas[1], t));
        p[q][i] -= lr * mhat / (std::sqrt(vhat) + o.eps);
      }
    }
  }
  return p;
}

// Elements of a group's flat buffer (docs/architecture.md, "Groups"): each parameter at a
// 16-aligned offset, the total padded to a multiple of 16 x world.
std::int64_t padded(const std::vector<int>& ps, int world) {
  std::int64_t end = 0;
  for (int p : ps) end = (end + 15) / 16 * 16 + kParams[static_cast<std::size_t>(p)].numel;
  const std::int64_t unit = 16 * world;
  return std::max<std::int64_t>(unit, (end + unit - 1) / unit * unit);
}

}  // namespace

TEST(ParamGroups, AdamWWithPerParameterDecayAndLrMatchesDoubleReference) {
  for (int world : {1, 2}) {
    const Config c = base(3, DType::f32);
    const int steps = 6;
    Result r = run(c, world, steps);
    auto ref = reference(c, world, steps);
    for (std::size_t q = 0; q < kParams.size(); ++q) {
      for (std::size_t i = 0; i < ref[q].size(); ++i) {
        if (kParams[q].options.frozen) {
          // Frozen: the initial value, bitwise.
          EXPECT_EQ(std::bit_cast<std::uint32_t>(r.values[q][i]), std::bit_cast<std::uint32_t>(initial(static_cast<int>(q), static_cast<std::int64_t>(i))))
              << kParams[q].name << "[" << i << "]";
          continue;
        }
        EXPECT_NEAR(r.values[q][i], ref[q][i], 2e-6 * std::max(1.0, std::fabs(ref[q][i])))
            << kParams[q].name << "[" << i << "] world " << world;
      }
    }
  }
}

TEST(ParamGroups, NamedGroupsEqualRegistrationOptionsBitwise) {
  const Config c = base(2, DType::bf16);
  Result a = run(c, 2, 4, false), b = run(c, 2, 4, true);
  std::string where;
  EXPECT_TRUE(bitwise(a, b, &where)) << where;
}

class ParamGroupsBitwise : public ::testing::TestWithParam<DType> {};

TEST_P(ParamGroupsBitwise, EveryStageAndOffloadEqualStageZero) {
  const DType dtype = GetParam();
  const std::string dir = zoe::test::temp_dir("param-groups");
  const Result ref = run(base(0, dtype), 2, 5);
  struct Case {
    int stage;
    OffloadDevice optimizer;
    double ratio;
    OffloadDevice param;
  };
  const std::vector<Case> cases = {
      {1, OffloadDevice::none, 1, OffloadDevice::none}, {2, OffloadDevice::none, 1, OffloadDevice::none},
      {3, OffloadDevice::none, 1, OffloadDevice::none}, {1, OffloadDevice::cpu, 1, OffloadDevice::none},
      {2, OffloadDevice::cpu, 0.6, OffloadDevice::none}, {3, OffloadDevice::cpu, 1, OffloadDevice::none},
      {3, OffloadDevice::cpu, 0.6, OffloadDevice::cpu},  {2, OffloadDevice::nvme, 1, OffloadDevice::none},
      {3, OffloadDevice::nvme, 0.6, OffloadDevice::nvme},
  };
  for (const Case& k : cases) {
    Config c = base(k.stage, dtype);
    auto& oo = c.zero_optimization.offload_optimizer;
    oo.device = k.optimizer;
    oo.ratio = k.ratio;
    oo.nvme_path = dir;
    oo.buffer_count = 3;
    c.zero_optimization.offload_param.device = k.param;
    c.zero_optimization.offload_param.nvme_path = dir;
    c.zero_optimization.offload_param.buffer_size = 4096;  // elements per staging buffer (default: 1e8)
    std::string where;
    EXPECT_TRUE(bitwise(run(c, 2, 5), ref, &where))
        << "stage " << k.stage << " optimizer offload " << static_cast<int>(k.optimizer) << " ratio " << k.ratio
        << " param offload " << static_cast<int>(k.param) << ": first difference in " << where;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Engine, ParamGroupsBitwise, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Gradient accumulation (2 micro-batches) with fp16 and its loss scaling: the trainer adds
// the scaled gradient (coarse_grad x loss_scale()) of every micro-batch. coarse_grad is a
// multiple of 1/64 in [-1, 1], so every partial sum (A.w: 2 modules x 2 micro-batches in the
// fp16 buffer of stages 0-1; the 2-rank reduction; the fp32 shard of stages 2-3) is exact and
// every stage sees the same mean gradient: stages 0-3 and the offloads are bitwise equal.
float coarse_grad(int micro, int rank, int m, int p, std::int64_t i) {
  return std::round(grad_value(micro, rank, m, p, i) * 64.0f) / 64.0f;
}

Config fp16_accumulating(int stage) {
  Config c = base(stage, DType::f32);
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 4;  // 16: the scaled sums stay far below fp16's 65504
  c.gradient_accumulation_steps = 2;
  return c;
}

struct Accumulated {
  std::vector<std::vector<float>> values;  // rank 0's gather_parameter after the steps
  std::vector<double> scales;              // loss_scale() at each step
};

Accumulated run_accumulating(const Config& c, int world, int steps) {
  Accumulated out;
  const int gas = c.gradient_accumulation_steps;
  run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
    Engine e(c, ctx);
    Model m = build(e);
    std::vector<double> scales;
    for (int s = 0; s < steps; ++s) {
      const float scale = static_cast<float>(e.loss_scale());
      scales.push_back(scale);
      for (int mb = 0; mb < gas; ++mb) {
        for (ModuleId id : m.modules) {
          ForwardScope f(e, id);
        }
        for (int k = static_cast<int>(m.modules.size()) - 1; k >= 0; --k) {
          BackwardScope b(e, m.modules[static_cast<std::size_t>(k)]);
          for (std::size_t j = 0; j < kModules[static_cast<std::size_t>(k)].size(); ++j) {
            const int p = kModules[static_cast<std::size_t>(k)][j];
            const TensorView& g = b.tensors().grads[j];
            if (!g.data) continue;
            for (std::int64_t i = 0; i < g.numel(); ++i)
              zoe::test::add(g, i, coarse_grad(s * gas + mb, e.rank(), k, p, i) * scale);
          }
        }
      }
      const StepResult st = e.step();
      EXPECT_FALSE(st.skipped) << "step " << s;
    }
    std::vector<std::vector<float>> values;
    for (ParamId p : m.params) values.push_back(e.gather_parameter(p));
    if (ctx.rank == 0) out = {std::move(values), std::move(scales)};
  });
  return out;
}

TEST(ParamGroups, Fp16GradientAccumulationEqualsAtEveryStageAndTheReference) {
  const int world = 2, steps = 4, gas = 2;
  const Accumulated ref = run_accumulating(fp16_accumulating(0), world, steps);
  EXPECT_EQ(ref.scales, std::vector<double>(steps, 16.0));
  // Against AdamW in double on the exact mean over ranks and micro-batches.
  const Config c0 = fp16_accumulating(0);
  const auto& o = c0.optimizer;
  for (std::size_t q = 0; q < kParams.size(); ++q) {
    std::vector<double> p, mo, v;
    for (std::int64_t i = 0; i < kParams[q].numel; ++i) p.push_back(initial(static_cast<int>(q), i));
    mo.assign(p.size(), 0.0);
    v.assign(p.size(), 0.0);
    if (kParams[q].options.frozen) {  // the fp16 copy of the initial value
      for (std::size_t i = 0; i < p.size(); ++i)
        EXPECT_EQ(ref.values[q][i], kernels::f16_to_f32(kernels::f32_to_f16(static_cast<float>(p[i]))))
            << kParams[q].name << "[" << i << "]";
      continue;
    }
    const double wd = *kParams[q].options.weight_decay, lr = o.lr * kParams[q].options.lr_scale;
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        double g = 0;
        for (int mb = 0; mb < gas; ++mb)
          for (int r = 0; r < world; ++r)
            for (std::size_t k = 0; k < kModules.size(); ++k)
              for (int pp : kModules[k])
                if (pp == static_cast<int>(q))
                  g += coarse_grad(s * gas + mb, r, static_cast<int>(k), pp, static_cast<std::int64_t>(i));
        g /= world * gas;
        p[i] *= 1.0 - lr * wd;
        mo[i] = o.betas[0] * mo[i] + (1 - o.betas[0]) * g;
        v[i] = o.betas[1] * v[i] + (1 - o.betas[1]) * g * g;
        const double t = s + 1;
        p[i] -= lr * (mo[i] / (1 - std::pow(o.betas[0], t))) / (std::sqrt(v[i] / (1 - std::pow(o.betas[1], t))) + o.eps);
      }
    }
    for (std::size_t i = 0; i < p.size(); ++i)
      EXPECT_NEAR(ref.values[q][i], p[i], 2e-6 * std::max(1.0, std::fabs(p[i]))) << kParams[q].name << "[" << i << "]";
  }
  const std::string dir = zoe::test::temp_dir("param-groups-fp16-gas");
  struct Case {
    int stage;
    OffloadDevice optimizer;
    double ratio;
  };
  for (const Case& k : {Case{1, OffloadDevice::none, 1}, Case{2, OffloadDevice::none, 1}, Case{3, OffloadDevice::none, 1},
                        Case{1, OffloadDevice::cpu, 1}, Case{2, OffloadDevice::cpu, 0.6}, Case{3, OffloadDevice::nvme, 0.6}}) {
    Config c = fp16_accumulating(k.stage);
    c.zero_optimization.offload_optimizer.device = k.optimizer;
    c.zero_optimization.offload_optimizer.ratio = k.ratio;
    c.zero_optimization.offload_optimizer.nvme_path = dir;
    const Accumulated got = run_accumulating(c, world, steps);
    Result a, b;
    a.values = ref.values;
    b.values = got.values;
    std::string where;
    EXPECT_TRUE(bitwise(b, a, &where)) << "stage " << k.stage << " optimizer offload " << static_cast<int>(k.optimizer)
                                       << " ratio " << k.ratio << ": first difference in " << where;
  }
  std::filesystem::remove_all(dir);
}

TEST(ParamGroups, FrozenParametersCostNoStateBytesAndAreNotReduced) {
  // Groups: A = {A.w, A.b}, B = {B.w, B.b} and "B (frozen)" = {B.ln}, C: "C (frozen)" = {C.emb}
  // (C's trainable group is empty: A.w is A's).
  const int world = 2;
  const std::int64_t PA = padded({0, 1}, world), PB = padded({2, 4}, world), PC = padded({}, world);
  const std::int64_t FB = padded({3}, world), FC = padded({5}, world);
  const std::int64_t trainable = PA + PB + PC, frozen = FB + FC;
  const std::int64_t B = 2;  // bf16
  for (int stage = 0; stage <= 3; ++stage) {
    const Config c = base(stage, DType::bf16);
    Result r = run(c, world, 2);
    std::int64_t expect = 0, reduce_scatter = 0;
    const std::int64_t S = trainable / world;  // shards of the trainable groups
    switch (stage) {
      case 0: expect = B * trainable + B * trainable + 12 * trainable + B * frozen; break;
      case 1: expect = B * trainable + B * trainable + 12 * S + B * frozen; break;
      case 2: expect = B * trainable + B * S + 12 * S + B * frozen; break;
      case 3: expect = B * S + B * S + 12 * S + B * frozen / world; break;
    }
    // Reduced: A and B (C's trainable group is empty, so no module uses it); the frozen ones: never.
    if (stage >= 1) reduce_scatter = B * (PA + PB) / world * (world - 1);
    for (int rk = 0; rk < world; ++rk) {
      EXPECT_EQ(r.memory[rk].device_model_states, expect) << "stage " << stage << " rank " << rk;
      EXPECT_EQ(r.memory[rk].host_model_states, 0);
      EXPECT_EQ(r.traffic[rk].reduce_scatter_bytes, reduce_scatter) << "stage " << stage;
    }
  }
  // With the optimizer on the CPU the frozen parameters still have no state there.
  Config c = base(3, DType::bf16);
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  Result r = run(c, world, 1);
  const std::int64_t S = trainable / world;
  EXPECT_EQ(r.memory[0].host_model_states, 14 * S);  // master, exp_avg, exp_avg_sq, bf16 gradient (one micro-batch)
  EXPECT_EQ(r.memory[0].device_model_states, B * S + B * frozen / world);  // no device gradient shard
}

TEST(ParamGroups, WriteParameterThenTrainEqualsStartingFromThatValue) {
  // Writing A.w (trainable) and C.emb (frozen) right after construction equals registering
  // those values, bitwise, at every stage.
  auto written = [](int p, std::int64_t i) { return zoe::test::hashed_uniform(77 + p, i, 0.5f); };
  for (int stage = 0; stage <= 3; ++stage) {
    const Config c = base(stage, DType::bf16);
    Result w = run(c, 2, 3, false, [&](Engine& e, const Model& m) {
      for (int p : {0, 5}) {
        std::vector<float> v(static_cast<std::size_t>(kParams[p].numel));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = written(p, static_cast<std::int64_t>(i));
        e.write_parameter(m.params[p], v);
        std::vector<float> back(v.size());
        e.read_parameter(m.params[p], back);
        if (kParams[p].options.frozen) {  // the compute-dtype copy only: v rounded to bf16
          for (std::size_t i = 0; i < v.size(); ++i)
            EXPECT_EQ(back[i], kernels::bf16_to_f32(kernels::f32_to_bf16(v[i]))) << kParams[p].name << "[" << i << "]";
        } else {
          EXPECT_EQ(back, v) << kParams[p].name;
        }
      }
    });
    // The reference registers those values instead (through the same build, then written
    // before the first forward: identical by construction only if write == initial values).
    Result ref;
    {
      std::vector<std::vector<std::vector<float>>> values(2);
      run_ranks(make_local_ranks(2, 60.0), [&](RankContext& ctx) {
        Engine e(c, ctx);
        Model m;
        for (std::size_t p = 0; p < kParams.size(); ++p) {
          const int pi = static_cast<int>(p);
          const bool w = pi == 0 || pi == 5;
          m.params.push_back(e.add_parameter(
              kParams[p].name, {kParams[p].numel},
              [pi, w, written](std::int64_t offset, std::span<float> out) {
                for (std::size_t i = 0; i < out.size(); ++i)
                  out[i] = w ? written(pi, offset + static_cast<std::int64_t>(i))
                             : initial(pi, offset + static_cast<std::int64_t>(i));
              },
              kParams[p].options));
        }
        for (std::size_t k = 0; k < kModules.size(); ++k) {
          std::vector<ParamId> ids;
          for (int p : kModules[k]) ids.push_back(m.params[static_cast<std::size_t>(p)]);
          m.modules.push_back(e.add_module(kModuleNames[k], ids));
        }
        for (int s = 0; s < 3; ++s) train_step(e, m, s);
        for (ParamId p : m.params) values[static_cast<std::size_t>(ctx.rank)].push_back(e.gather_parameter(p));
      });
      ref.values = values[0];
    }
    std::string where;
    EXPECT_TRUE(bitwise(w, ref, &where)) << "stage " << stage << ": " << where;
  }
}

TEST(ParamGroups, CheckpointWithFrozenParametersResumesBitwise) {
  // Save after 2 steps (a frozen value written first, which the loaded engine's initializer
  // does not give), load into a fresh engine, 2 more steps: the uninterrupted 4-step run, bit
  // for bit, at stages 0 and 3. (Reshard, offload, corruption, another frozen set and zoe-ckpt:
  // tests/core/test_checkpoint_frozen.cpp.)
  const std::string dir = zoe::test::temp_dir("param-groups-ckpt");
  const std::vector<float> emb(static_cast<std::size_t>(kParams[5].numel), 0.375f);
  for (int stage : {0, 3}) {
    const Config c = base(stage, DType::bf16);
    const Result straight = run(c, 2, 4, false, [&](Engine& e, const Model& m) { e.write_parameter(m.params[5], emb); });
    Result resumed;
    std::vector<std::vector<float>> values;
    run_ranks(make_local_ranks(2, 60.0), [&](RankContext& ctx) {
      Engine e(c, ctx);
      Model m = build(e);
      e.write_parameter(m.params[5], emb);
      for (int s = 0; s < 2; ++s) train_step(e, m, s);
      e.save_checkpoint(dir + "/ck");
    });
    run_ranks(make_local_ranks(2, 60.0), [&](RankContext& ctx) {
      Engine e(c, ctx);
      Model m = build(e);
      e.load_checkpoint(dir + "/ck");
      for (int s = 2; s < 4; ++s) train_step(e, m, s);
      std::vector<std::vector<float>> v;
      for (ParamId p : m.params) v.push_back(e.gather_parameter(p));
      if (ctx.rank == 0) values = std::move(v);
    });
    resumed.values = values;
    std::string where;
    EXPECT_TRUE(bitwise(straight, resumed, &where)) << "stage " << stage << ": " << where;
    EXPECT_EQ(resumed.values[5], emb) << "stage " << stage;
    std::filesystem::remove_all(dir + "/ck");
  }
  std::filesystem::remove_all(dir);
}

TEST(ParamGroups, SafetensorsExportHoldsFrozenAndTrainableValues) {
  // export_safetensors reads a frozen group through gather_group: every tensor of the file
  // equals gather_parameter's value, bitwise, at every stage (a written frozen value included).
  const std::string dir = zoe::test::temp_dir("param-groups-export");
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string path = dir + "/m" + std::to_string(stage) + ".safetensors";
    std::vector<std::vector<float>> expected;
    run_ranks(make_local_ranks(2, 60.0), [&](RankContext& ctx) {
      Engine e(base(stage, DType::bf16), ctx);
      Model m = build(e);
      train_step(e, m, 0);
      e.write_parameter(m.params[5], std::vector<float>(static_cast<std::size_t>(kParams[5].numel), 0.375f));
      e.export_safetensors(path, DType::f32);
      std::vector<std::vector<float>> values;
      for (ParamId p : m.params) values.push_back(e.gather_parameter(p));
      if (ctx.rank == 0) expected = std::move(values);
    });
    auto file = zoe::SafetensorsFile::open(path);
    ASSERT_EQ(file->tensors().size(), kParams.size()) << "stage " << stage;
    for (std::size_t p = 0; p < kParams.size(); ++p) {
      std::vector<float> got(static_cast<std::size_t>(kParams[p].numel));
      file->read_f32(kParams[p].name, 0, got);
      EXPECT_EQ(got, expected[p]) << "stage " << stage << " " << kParams[p].name;
    }
    EXPECT_EQ(expected[5], std::vector<float>(static_cast<std::size_t>(kParams[5].numel), 0.375f)) << "stage " << stage;
  }
  std::filesystem::remove_all(dir);
}

TEST(ParamGroups, TrainerAllReduceCombinesInRankOrder) {
  const int world = 4;
  run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
    Engine e(base(2, DType::bf16), ctx);
    const double mine = 0.1 * (ctx.rank + 1);  // 0.1, 0.2, 0.3, 0.4
    const double sum = ((0.1 * 1 + 0.1 * 2) + 0.1 * 3) + 0.1 * 4;  // rank order
    EXPECT_EQ(e.all_reduce(mine, ScalarReduce::sum, "loss"), sum);
    EXPECT_EQ(e.all_reduce(mine, ScalarReduce::mean, "loss"), sum / 4);
    EXPECT_EQ(e.all_reduce(mine, ScalarReduce::max, "acc"), 0.4);
    std::vector<double> v{mine, -mine, ctx.rank == 2 ? NAN : 1.0};
    e.all_reduce(v, ScalarReduce::min, "metrics");
    EXPECT_EQ(v[0], 0.1);
    EXPECT_EQ(v[1], -0.4);
    EXPECT_TRUE(std::isnan(v[2]));
  });
}

TEST(ParamGroups, TrainerAllReduceOfDifferentNamesFailsOnEveryRank) {
  auto ranks = make_local_ranks(2, 20.0);
  std::vector<std::string> errors(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(base(2, DType::bf16), ctx);
    try {
      e.all_reduce(1.0, ScalarReduce::mean, ctx.rank == 0 ? "loss" : "eval_loss");
    } catch (const CommError& err) {
      errors[static_cast<std::size_t>(ctx.rank)] = err.what();
    }
  });
  for (const std::string& m : errors) {
    EXPECT_NE(m.find("'loss'"), std::string::npos) << m;
    EXPECT_NE(m.find("'eval_loss'"), std::string::npos) << m;
  }
}

TEST(ParamGroups, LookupByName) {
  auto ranks = make_local_ranks(1);
  Engine e(base(0, DType::f32), ranks[0]);
  Model m = build(e);
  EXPECT_EQ(e.parameter("B.ln").index, m.params[3].index);
  EXPECT_EQ(e.find_parameter("C.emb")->index, m.params[5].index);
  EXPECT_FALSE(e.find_parameter("C.embed").has_value());
  EXPECT_EQ(e.parameter_name(m.params[2]), "B.w");
  EXPECT_EQ(e.parameter_shape(m.params[2]), std::vector<std::int64_t>{33});
  EXPECT_EQ(e.parameter_count(), kParams.size());
  EXPECT_EQ(*e.param_options(m.params[3]).weight_decay, 0.02);  // frozen: the config's, resolved
  EXPECT_TRUE(e.param_options(m.params[3]).frozen);
  try {
    e.parameter("C.embed");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("no parameter named 'C.embed'"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("closest: 'C.emb'"), std::string::npos) << err.what();
  }
}

TEST(ParamGroups, BadUsageNamesTheParameterAndTheProblem) {
  auto expect_usage = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error, expected: " << text;
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  };
  auto ranks = make_local_ranks(1);
  Engine e(base(0, DType::f32), ranks[0]);
  Model m = build(e);
  expect_usage([&] { e.add_parameter("A.w", {2}, std::vector<float>{1, 2}); }, "parameter 'A.w' is registered twice");
  expect_usage([&] { e.add_param_group({"typo", [](const std::string& n) { return n == "A.bias"; }, {}}); },
               "add_param_group('typo') matched none");
  e.add_param_group({"g1", [](const std::string& n) { return n == "A.b"; }, {0.0, 1.0, false}});
  expect_usage([&] { e.add_param_group({"g2", [](const std::string& n) { return n.ends_with(".b"); }, {}}); },
               "parameter 'A.b' is already in group 'g1'");
  try {
    e.add_param_group({"neg", [](const std::string&) { return true; }, {-0.1, 1.0, false}});
    ADD_FAILURE() << "negative decay accepted";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.key(), "param group 'neg'.weight_decay");
  }
  try {
    e.add_parameter("X", {1}, std::vector<float>{1}, ParamOptions{std::nullopt, NAN, false});
    ADD_FAILURE() << "NaN lr_scale accepted";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.key(), "param 'X'.lr_scale");
  }
  std::vector<float> wrong(3);
  expect_usage([&] { e.write_parameter(m.params[0], wrong); }, "write_parameter('A.w'): value has 3 elements, the parameter has 72");
  expect_usage([&] { e.read_parameter(m.params[0], wrong); }, "read_parameter('A.w'): out has 3 elements");
  std::vector<float> bad(72, 1.0f);
  bad[7] = INFINITY;
  expect_usage([&] { e.write_parameter(m.params[0], bad); }, "write_parameter('A.w'): element 7 is inf");
  {
    ForwardScope f(e, m.modules[1]);
    std::vector<float> v(72);
    expect_usage([&] { e.read_parameter(m.params[0], v); }, "read_parameter('A.w') while module 'B' is in forward");
  }
  expect_usage([&] { e.all_reduce(1.0, ScalarReduce::sum, ""); }, "needs a name");
}

TEST(ParamGroups, RanksWritingDifferentValuesFailBeforeWriting) {
  auto ranks = make_local_ranks(2, 20.0);
  std::vector<std::vector<float>> after(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(base(3, DType::f32), ctx);
    Model m = build(e);
    std::vector<float> v(5, ctx.rank == 0 ? 1.0f : 2.0f);
    try {
      e.write_parameter(m.params[1], v);
      ADD_FAILURE() << "rank " << ctx.rank << ": no error";
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("write_parameter('A.b'): rank"), std::string::npos) << err.what();
    }
    after[static_cast<std::size_t>(ctx.rank)] = e.gather_parameter(m.params[1]);
  });
  for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(after[0][i], initial(1, i));
  EXPECT_EQ(after[0], after[1]);
}

TEST(ParamGroups, OneRankWithAWrongValueFailsEveryRankWithoutAHang) {
  // Rank 1 passes 4 elements instead of 5: rank 1 names its size, rank 0 names rank 1, and
  // neither waits for a collective the other skipped (a 20 s timeout would say so).
  auto ranks = make_local_ranks(2, 20.0);
  std::vector<std::string> errors(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(base(2, DType::f32), ctx);
    Model m = build(e);
    std::vector<float> v(ctx.rank == 0 ? 5 : 4, 1.0f);
    try {
      e.write_parameter(m.params[1], v);
    } catch (const UsageError& err) {
      errors[static_cast<std::size_t>(ctx.rank)] = err.what();
    }
    std::vector<float> out(ctx.rank == 0 ? 5 : 3);
    try {
      e.read_parameter(m.params[1], out);
      if (ctx.rank == 1) ADD_FAILURE() << "a wrong size read on rank 1";
    } catch (const UsageError& err) {
      EXPECT_EQ(ctx.rank, 1);
      EXPECT_NE(std::string(err.what()).find("read_parameter('A.b'): out has 3 elements"), std::string::npos);
    }
    if (ctx.rank == 0)
      for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(out[i], initial(1, i));  // nothing was written
  });
  EXPECT_NE(errors[1].find("write_parameter('A.b'): value has 4 elements, the parameter has 5"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("write_parameter('A.b'): rank 1's value is wrong (4 elements"), std::string::npos)
      << errors[0];
}
