// The trainer end to end through zoe's Engine on a tiny model (2 ranks as threads): the same
// seed gives the same loss curve for ZeRO stage 0 and stage 3, and with optimizer states on NVMe
// or not; the loss falls on learnable data.
#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace gpt
