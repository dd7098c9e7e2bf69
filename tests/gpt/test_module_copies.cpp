// module_copies.hpp, independently of the engine: one forward/backward of the model on 16-bit
// parameters through ModuleCopies equals the fp32 model run on the same values rounded to
// bf16/fp16 (the loss bit for bit), and each module's 16-bit gradient is exactly that fp32
// gradient times the loss scale, rounded once (nearest even) -- on the CPU ops and on the CUDA
// kernels' math (KernelOps).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "examples/gpt/kernel_ops.hpp"
#include "examples/gpt/model.hpp"
#include "examples/gpt/module_copies.hpp"

namespace gpt {
namespace {

using kernels::Storage16;

float round16(Storage16 s, float x) {
  return s == Storage16::bf16 ? kernels::bf16_to_float(kernels::float_to_bf16(x))
                              : kernels::fp16_to_float(kernels::float_to_fp16(x));
}
std::uint16_t bits16(Storage16 s, float x) {
  return s == Storage16::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_fp16(x);
}

// fp32 parameters (GPT-2's init rounded to the 16-bit format); records each module's gradients.
class Fp32Provider : public ParamProvider<float> {
 public:
  Fp32Provider(const ModelSpec& spec, Storage16 s) : spec_(spec) {
    for (const auto& p : spec.params) {
      std::vector<float> v = initial_value(p, 5);
      for (float& x : v) x = round16(s, x);
      values.push_back(v);
    }
  }
  ModuleView<float> begin_forward(int m) override {
    ModuleView<float> v;
    for (int p : spec_.modules[m].params) v.params.push_back(values[p].data());
    return v;
  }
  void end_forward(int) override {}
  ModuleView<float> begin_backward(int m) override {
    ModuleView<float> v = begin_forward(m);
    auto& g = grads[m];
    g.clear();
    for (int p : spec_.modules[m].params) g.emplace_back(values[p].size(), 0.0f);
    for (auto& x : g) v.grads.push_back(x.data());
    return v;
  }
  void end_backward(int) override {}
  std::vector<std::vector<float>> values;
  std::map<int, std::vector<std::vector<float>>> grads;  // per module, per parameter of it

 private:
  const ModelSpec& spec_;
};

// The same parameters as 16-bit bits, seen through ModuleCopies; gradients come back 16-bit.
class Provider16 : public ParamProvider<float> {
 public:
  Provider16(const ModelSpec& spec, const Fp32Provider& ref, Storage16 s, ModuleCopies& copies, float scale)
      : spec_(spec), copies_(copies), scale_(scale) {
    for (const auto& v : ref.values) {
      std::vector<std::uint16_t> b;
      for (float x : v) b.push_back(bits16(s, x));
      values.push_back(b);
    }
  }
  ModuleView<float> begin_forward(int m) override { return copies_.open(params(m), {}); }
  void end_forward(int) override {}
  ModuleView<float> begin_backward(int m) override {
    auto& g = grads[m];
    g.clear();
    open_.clear();
    for (int p : spec_.modules[m].params) g.emplace_back(values[p].size(), std::uint16_t{0});
    for (auto& x : g) open_.push_back({x.data(), x.size()});
    return copies_.open(params(m), open_);
  }
  void end_backward(int) override { copies_.close(open_, scale_); }
  std::vector<std::vector<std::uint16_t>> values;
  std::map<int, std::vector<std::vector<std::uint16_t>>> grads;

 private:
  std::vector<Buffer16> params(int m) {
    std::vector<Buffer16> b;
    for (int p : spec_.modules[m].params) b.push_back({values[p].data(), values[p].size()});
    return b;
  }
  const ModelSpec& spec_;
  ModuleCopies& copies_;
  float scale_;
  std::vector<Buffer16> open_;
};

template <class Ops>
void check(Storage16 s, float scale, bool checkpointing) {
  GptConfig cfg;
  cfg.vocab_size = 40;
  cfg.context = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  std::mt19937_64 rng(4);
  std::vector<std::int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % 40);
    tg[i] = static_cast<std::int32_t>(rng() % 40);
  }
  GptModel<float, Ops> ref_model(cfg, checkpointing);
  Fp32Provider ref(ref_model.spec(), s);
  const double ref_loss = ref_model.forward_backward(ref, in.data(), tg.data(), 2, 8);
  const double ref_eval = ref_model.forward(ref, in.data(), tg.data(), 2, 8);

  GptModel<float, Ops> model(cfg, checkpointing);
  OpsModuleCopies<Ops> copies(model.ops(), s);
  Provider16 pp(model.spec(), ref, s, copies, scale);
  const double loss = model.forward_backward(pp, in.data(), tg.data(), 2, 8);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_EQ(model.forward(pp, in.data(), tg.data(), 2, 8), ref_eval);
  ASSERT_EQ(pp.grads.size(), ref.grads.size());
  std::size_t nonzero = 0;
  for (const auto& [m, gs] : ref.grads)
    for (std::size_t p = 0; p < gs.size(); ++p)
      for (std::size_t i = 0; i < gs[p].size(); ++i) {
        ASSERT_EQ(pp.grads.at(m)[p][i], bits16(s, scale * gs[p][i])) << "module " << m << " param " << p << " element " << i;
        nonzero += gs[p][i] != 0;
      }
  EXPECT_GT(nonzero, 1000u);
}

TEST(ModuleCopies, Bf16EqualsTheFp32ModelOnRoundedWeights) {
  check<CpuOps<float>>(Storage16::bf16, 1.0f, false);
  check<CpuOps<float>>(Storage16::bf16, 1.0f, true);
}
TEST(ModuleCopies, Fp16WithALossScaleEqualsTheScaledFp32Gradients) {
  check<CpuOps<float>>(Storage16::fp16, 1024.0f, false);
}
TEST(ModuleCopies, TheKernelsMathAgrees) {
  check<KernelOps<float>>(Storage16::bf16, 1.0f, true);
  check<KernelOps<float>>(Storage16::fp16, 256.0f, false);
}

}  // namespace
}  // namespace gpt
