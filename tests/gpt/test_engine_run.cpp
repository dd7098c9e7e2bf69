// The trainer end to end through zoe's Engine on a tiny model (2 ranks as threads): the same
// seed gives the same loss curve for ZeRO stage 0 and stage 3, and with optimizer states on NVMe
// or not; the loss falls on learnable data; the CUDA backend's math (KernelOps) trains alike.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/gpt/tiny_run.hpp"

namespace gpt {
namespace {

using test::synthetic_tokens;
using test::tiny;

TEST(GptEngineRun, StagesAndOffloadGiveTheSameLossCurve) {
  const TokenSplit data = synthetic_tokens();
  const Tokenizer no_tokenizer;  // not used: no sample
  const test::TempDir dir("engine_run");
  const std::string nvme = dir.str();
  const TrainSummary s0 = train(tiny(0, zoe::OffloadDevice::none, nvme), data, no_tokenizer, false);
  const TrainSummary s3 = train(tiny(3, zoe::OffloadDevice::none, nvme), data, no_tokenizer, false);
  const TrainSummary s3n = train(tiny(3, zoe::OffloadDevice::nvme, nvme), data, no_tokenizer, false);
  ASSERT_EQ(s0.losses.size(), 6u);
  ASSERT_EQ(s3.losses.size(), 6u);
  ASSERT_EQ(s3n.losses.size(), 6u);
  EXPECT_NEAR(s0.losses[0], std::log(64.0), 0.05);  // GPT-2 init: nearly uniform
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(s3.losses[i], s0.losses[i], 1e-4 * s0.losses[i]) << "step " << i;
    EXPECT_NEAR(s3n.losses[i], s3.losses[i], 1e-4 * s3.losses[i]) << "step " << i;
  }
  EXPECT_LT(s0.losses.back(), s0.losses.front() - 0.05);  // learning, in 6 steps
  EXPECT_NEAR(s3.final_val_loss, s0.final_val_loss, 1e-4 * s0.final_val_loss);
}

// GPT-2 practice through the engine's parameter groups: the biases and LayerNorm gains (the
// 1-D parameters, nanoGPT's rule, an independent statement of it) take no weight decay. One
// step (lr > 0 at step 0) with weight decay 0.5 and 0 from the same start: the 1-D parameters
// end bitwise equal, every matrix and embedding differs.
TEST(GptEngineRun, BiasesAndLayerNormGainsTakeNoWeightDecay) {
  const TokenSplit data = synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("engine_run_decay");
  TrainOptions a = tiny(2, zoe::OffloadDevice::none, dir.str(), /*steps=*/1);
  a.engine.optimizer.weight_decay = 0.5;
  TrainOptions b = a;
  b.engine.optimizer.weight_decay = 0.0;
  const TrainSummary sa = train(a, data, no_tokenizer, false, /*gather_parameters=*/true);
  const TrainSummary sb = train(b, data, no_tokenizer, false, /*gather_parameters=*/true);
  const ModelSpec spec = make_model_spec(a.model);
  int decayed = 0, kept = 0;
  for (const ParamSpec& p : spec.params) {
    const bool matrix = p.shape.size() >= 2;
    EXPECT_EQ(decays(p.name), matrix) << p.name;
    const auto& va = sa.parameters.at(p.name);
    const auto& vb = sb.parameters.at(p.name);
    ASSERT_EQ(va.size(), vb.size());
    const bool same = std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, !matrix) << p.name << (matrix ? " was not decayed" : " was decayed");
    (matrix ? decayed : kept) += 1;
  }
  // Per block 2 LayerNorms x (gain, bias) and 4 linear biases; ln_f's gain and bias. (A zero
  // bias stays equal even if decayed; the gains, ones at init, would not.)
  EXPECT_EQ(kept, 8 * a.model.n_layer + 2);
  EXPECT_GT(decayed, 0);
}

// The CUDA backend's math (KernelOps, `--host-ops kernels`) trains through the engine like the
// CPU ops: ZeRO-3 with NVMe optimizer states, the same loss curve to fp32 summation order.
TEST(GptEngineRun, TheKernelsMathTrainsLikeTheCpuOps) {
  const TokenSplit data = synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("engine_run_kernels");
  TrainOptions cpu = tiny(3, zoe::OffloadDevice::nvme, dir.str());
  TrainOptions kernels = cpu;
  kernels.host_ops = TrainOptions::HostOps::kernels;
  const TrainSummary a = train(cpu, data, no_tokenizer, false, /*gather_parameters=*/true);
  const TrainSummary b = train(kernels, data, no_tokenizer, false, /*gather_parameters=*/true);
  ASSERT_EQ(b.losses.size(), a.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 1e-5 * a.losses[i]) << "step " << i;
  EXPECT_NEAR(b.final_val_loss, a.final_val_loss, 1e-5 * a.final_val_loss);
  // Different summation orders, so not bitwise the same, but the same trained weights to fp32.
  ASSERT_EQ(b.parameters.size(), a.parameters.size());
  double diff = 0, scale = 0;
  for (const auto& [name, value] : a.parameters)
    for (std::size_t i = 0; i < value.size(); ++i) {
      diff = std::max(diff, std::abs(double(b.parameters.at(name)[i]) - value[i]));
      scale = std::max(scale, std::abs(double(value[i])));
    }
  EXPECT_LT(diff, 1e-4 * scale);
  EXPECT_GT(diff, 0.0);
}

}  // namespace
}  // namespace gpt
