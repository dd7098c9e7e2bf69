// The trainer end to end through zoe's Engine on a tiny model (2 ranks as threads): the same
// seed gives the same loss curve for ZeRO stage 0 and stage 3, and with optimizer states on NVMe
// or not; the loss falls on learnable data.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <filesystem>

#include "examples/gpt/trainer.hpp"

namespace gpt {
namespace {

TokenSplit synthetic_tokens() {
  // A repeating pattern with noise: learnable, so the loss must fall.
  TokenSplit d;
  std::mt19937_64 rng(9);
  for (int i = 0; i < 4000; ++i) d.train.push_back(static_cast<TokenId>(rng() % 7 == 0 ? rng() % 64 : (i * 5) % 64));
  for (int i = 0; i < 600; ++i) d.val.push_back(static_cast<TokenId>((i * 5) % 64));
  return d;
}

TrainOptions tiny(int stage, zoe::OffloadDevice offload, const std::string& nvme) {
  TrainOptions o;
  o.model.vocab_size = 64;
  o.model.context = 16;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.model.n_embd = 16;
  o.steps = 6;
  o.lr = 1e-2;
  o.warmup = 1;
  o.world_size = 2;
  o.threads_per_rank = 1;
  o.eval_interval = 0;
  o.eval_batches = 2;
  o.sample_length = 0;
  o.seed = 7;
  o.engine.train_micro_batch_size_per_gpu = 2;
  o.engine.gradient_accumulation_steps = 2;
  o.engine.gradient_clipping = 1.0;
  o.engine.zero_optimization.stage = stage;
  o.engine.zero_optimization.offload_optimizer.device = offload;
  o.engine.zero_optimization.offload_optimizer.nvme_path = nvme;
  return o;
}

TEST(GptEngineRun, StagesAndOffloadGiveTheSameLossCurve) {
  const TokenSplit data = synthetic_tokens();
  const Tokenizer no_tokenizer;  // not used: no sample
  const std::string nvme =
      (std::filesystem::temp_directory_path() / ("zoe_gpt_test_nvme_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(nvme);
  const TrainSummary s0 = train(tiny(0, zoe::OffloadDevice::none, nvme), data, no_tokenizer, false);
  const TrainSummary s3 = train(tiny(3, zoe::OffloadDevice::none, nvme), data, no_tokenizer, false);
  const TrainSummary s3n = train(tiny(3, zoe::OffloadDevice::nvme, nvme), data, no_tokenizer, false);
  std::filesystem::remove_all(nvme);
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

}  // namespace
}  // namespace gpt
