// The whole model: gradients of the loss w.r.t. every parameter against finite differences in
// double, with and without activation checkpointing; the module call order; the initial loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "examples/gpt/kernel_ops.hpp"
#include "examples/gpt/model.hpp"
#include "tests/gpt/fd_check.hpp"
#include "tests/gpt/plain_provider.hpp"

namespace gpt {
namespace {

GptConfig tiny() {
  GptConfig c;
  c.vocab_size = 13;
  c.context = 6;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

TEST(ModelSpec, NamesShapesAndCount) {
  GptConfig c;
  c.vocab_size = 50257;
  c.context = 128;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  const ModelSpec s = make_model_spec(c);
  ASSERT_EQ(s.modules.size(), 6u);
  EXPECT_EQ(s.params[s.modules[1].params[kAttnW]].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(s.params[s.modules[1].params[kAttnW]].shape, (std::vector<std::int64_t>{128, 384}));
  EXPECT_EQ(s.params[s.modules[4].params[kMlpProjW]].name, "h.3.mlp.c_proj.weight");
  EXPECT_EQ(s.modules[5].params[kHeadWte], s.modules[0].params[kEmbWte]);  // tied
  // V*C + T*C + L*(12 C^2 + 13 C) + 2C, as HF GPT2Model counts.
  const std::int64_t C = 128;
  EXPECT_EQ(s.parameter_count(), 50257 * C + 128 * C + 4 * (12 * C * C + 13 * C) + 2 * C);
  c.n_embd = 130;
  EXPECT_THROW(make_model_spec(c), zoe::Error);
}

// The draws one after another, as the trainer computed them before fill_initial_value: one
// splitmix64 stream per parameter (FNV-1a of the name mixed with the seed), Box-Muller pairs.
std::vector<float> sequential_reference(const ParamSpec& p, std::uint64_t seed) {
  auto mix = [](std::uint64_t& state) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : p.name) h = (h ^ c) * 1099511628211ull;
  std::uint64_t s0 = h ^ (seed * 0x9E3779B97F4A7C15ull);
  std::uint64_t state = mix(s0);
  std::vector<float> v(static_cast<std::size_t>(p.numel()));
  auto uniform = [&] { return (static_cast<double>(mix(state) >> 11) + 1.0) * 0x1.0p-53; };
  for (std::size_t i = 0; i < v.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 2.0 * M_PI * uniform();
    v[i] = static_cast<float>(p.stddev * r * std::cos(a));
    if (i + 1 < v.size()) v[i + 1] = static_cast<float>(p.stddev * r * std::sin(a));
  }
  return v;
}

TEST(ModelSpec, InitChunksEqualTheSequentialStreamBitwise) {
  const ParamSpec p{"h.3.mlp.c_fc.weight", {3, 100001}, Init::normal, 0.02};  // odd numel
  const std::vector<float> ref = sequential_reference(p, 7);
  EXPECT_EQ(initial_value(p, 7), ref);
  // Chunks of odd and even sizes at odd and even offsets (a pair split across two chunks).
  std::vector<float> pieced(ref.size(), -1.0f);
  std::int64_t offset = 0;
  for (std::int64_t n : {1, 2, 3, 70000, 4, 99999, 1000000}) {
    n = std::min<std::int64_t>(n, p.numel() - offset);
    fill_initial_value(p, 7, offset, std::span<float>(pieced.data() + offset, static_cast<std::size_t>(n)));
    offset += n;
  }
  ASSERT_EQ(offset, p.numel());
  EXPECT_EQ(pieced, ref);
  std::vector<float> ones(5, 0.0f);
  fill_initial_value({"ln_f.weight", {9}, Init::ones}, 7, 4, ones);
  EXPECT_EQ(ones, std::vector<float>(5, 1.0f));
  std::vector<float> past(3);
  EXPECT_THROW(fill_initial_value(p, 7, p.numel() - 2, past), zoe::Error);
  EXPECT_THROW(fill_initial_value(p, 7, -1, past), zoe::Error);
}

TEST(ModelSpec, InitIsDeterministicWithGpt2Std) {
  const ModelSpec s = make_model_spec(tiny());
  const ParamSpec& proj = s.params[s.modules[1].params[kMlpProjW]];
  EXPECT_EQ(initial_value(proj, 5), initial_value(proj, 5));
  EXPECT_NE(initial_value(proj, 5), initial_value(proj, 6));
  ParamSpec big{"w", {200000}, Init::normal, 0.02};
  const auto v = initial_value(big, 1);
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x;
    sq += double(x) * x;
  }
  EXPECT_NEAR(sum / v.size(), 0.0, 3 * 0.02 / std::sqrt(200000.0));
  EXPECT_NEAR(std::sqrt(sq / v.size()), 0.02, 0.0002);
  EXPECT_NEAR(proj.stddev, 0.02 / std::sqrt(4.0), 1e-15);
}

// The whole model on backend Ops (double): every parameter's gradient against finite
// differences of the forward loss.
template <class Ops>
void check_model_gradient(bool checkpoint_activations) {
  const GptConfig cfg = tiny();
  GptModel<double, Ops> model(cfg, checkpoint_activations);
  model.set_head_chunk(4);
  test::PlainProvider<double> pp(model.spec(), 11);
  // Larger weights than GPT-2's 0.02 so every path carries signal.
  std::mt19937_64 rng(12);
  for (std::size_t i = 0; i < pp.values.size(); ++i)
    if (model.spec().params[i].init == Init::normal) pp.values[i] = test::random_vector(pp.values[i].size(), rng, 0.5);
  const int B = 2, T = 5;
  std::vector<std::int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
    tg[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
  }
  const double trained_loss = model.forward_backward(pp, in.data(), tg.data(), B, T);
  auto loss = [&] { return model.forward(pp, in.data(), tg.data(), B, T); };
  EXPECT_EQ(trained_loss, loss());  // the same float operations in the same order
  for (std::size_t i = 0; i < pp.values.size(); ++i)
    test::expect_gradient(model.spec().params[i].name, pp.values[i], pp.grads[i], loss, 1e-6, 1e-6);
}

class ModelGradient : public ::testing::TestWithParam<bool> {};

TEST_P(ModelGradient, EveryParameterMatchesFiniteDifferences) {
  check_model_gradient<CpuOps<double>>(GetParam());
}
// The CUDA kernels' math (KernelOps, the host twin of CudaOps) through the same graph.
TEST_P(ModelGradient, EveryParameterMatchesFiniteDifferencesWithTheKernelsMath) {
  check_model_gradient<KernelOps<double>>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, ModelGradient, ::testing::Values(false, true));

TEST(Model, CheckpointingGivesTheSameGradientsInFloat) {
  GptConfig cfg = tiny();
  cfg.vocab_size = 50;
  cfg.context = 16;
  std::vector<std::vector<float>> grads[2];
  std::mt19937_64 rng(3);
  std::vector<std::int32_t> in(32), tg(32);
  for (int i = 0; i < 32; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % 50);
    tg[i] = static_cast<std::int32_t>(rng() % 50);
  }
  for (int ck = 0; ck < 2; ++ck) {
    GptModel<float> model(cfg, ck == 1);
    test::PlainProvider<float> pp(model.spec(), 1);
    model.forward_backward(pp, in.data(), tg.data(), 2, 16);
    grads[ck] = pp.grads;
  }
  // Recomputation repeats the same float operations; only Eigen's vectorized reductions may
  // associate differently when buffers have another alignment.
  for (std::size_t p = 0; p < grads[0].size(); ++p)
    for (std::size_t i = 0; i < grads[0][p].size(); ++i)
      ASSERT_NEAR(grads[0][p][i], grads[1][p][i], 1e-6 + 1e-5 * std::abs(grads[0][p][i]))
          << "param " << p << " element " << i;
}

TEST(Model, ModulesRunInOrderForwardThenReverse) {
  GptModel<float> model(tiny(), false);
  test::PlainProvider<float> pp(model.spec(), 1);
  std::vector<std::int32_t> in{1, 2, 3}, tg{2, 3, 4};
  model.forward_backward(pp, in.data(), tg.data(), 1, 3);
  // The head (module 3) runs forward and backward inside its backward scope.
  EXPECT_EQ(pp.calls, (std::vector<std::string>{"F0", "F1", "F2", "B3", "B2", "B1", "B0"}));
  pp.calls.clear();
  model.forward(pp, in.data(), tg.data(), 1, 3);
  EXPECT_EQ(pp.calls, (std::vector<std::string>{"F0", "F1", "F2", "F3"}));
}

TEST(Model, InitialLossIsLnVocab) {
  // GPT-2 init makes the logits nearly uniform: loss at step 0 ~ ln(50257) = 10.825.
  GptConfig cfg;
  cfg.vocab_size = 50257;
  cfg.context = 32;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  GptModel<float> model(cfg, false);
  test::PlainProvider<float> pp(model.spec(), 42);
  std::mt19937_64 rng(1);
  std::vector<std::int32_t> in(64), tg(64);
  for (int i = 0; i < 64; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % 50257);
    tg[i] = static_cast<std::int32_t>(rng() % 50257);
  }
  const double loss = model.forward(pp, in.data(), tg.data(), 2, 32);
  EXPECT_NEAR(loss, std::log(50257.0), 0.02);
}

}  // namespace
}  // namespace gpt
