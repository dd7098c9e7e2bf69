// zoe-estimate's device buffers for the trainer's own model (estimate::gpt_model, as
// `zoe-estimate --gpt` computes them) against rank 0's measured allocated device peak
// (TrainSummary::memory.device_peak) when zoe-gpt trains that model the way scripts/scale-demo.sh
// does: ZeRO-3, one rank, bf16, activation checkpointing, reduce_bucket_size 0, optimizer states
// and parameters offloaded (cpu, nvme). Within 10%. The vocabulary is large beside the width, so
// the embedding (tied to the head) is the largest module, as in GPT-2.
#include <gtest/gtest.h>

#include <cstdio>

#include "src/config/estimate.hpp"
#include "src/config/model_size.hpp"
#include "tests/gpt/tiny_run.hpp"

namespace gpt {
namespace {

TEST(GptMemoryEstimate, DeviceBuffersWithinTenPercentOfTheAllocatedPeak) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("memory_estimate");
  for (zoe::OffloadDevice tier : {zoe::OffloadDevice::cpu, zoe::OffloadDevice::nvme}) {
    SCOPED_TRACE(tier == zoe::OffloadDevice::cpu ? "cpu" : "nvme");
    TrainOptions o = test::tiny(3, tier, dir.str(), 3);
    o.model.vocab_size = 16384;  // tokens stay < 64; wte 16384 x 64 = 1 Mi elements
    o.model.n_embd = 64;
    o.model.n_layer = 4;
    o.model.context = 32;
    o.world_size = 1;
    o.activation_checkpointing = true;
    o.eval_batches = 1;
    zoe::Config& c = o.engine;
    c.bf16.enabled = true;
    c.gradient_accumulation_steps = 1;
    c.train_micro_batch_size_per_gpu = 1;
    c.zero_optimization.reduce_bucket_size = 0;
    c.zero_optimization.offload_param.device = tier;
    c.zero_optimization.offload_param.nvme_path = dir.str();
    c.zero_optimization.offload_param.buffer_size = 2'000'000;  // holds the embeddings' shard
    const TrainSummary s = train(o, data, no_tokenizer, false);
    const zoe::estimate::ModelShape shape =
        zoe::estimate::gpt_model(o.model.n_layer, o.model.n_embd, o.model.vocab_size, o.model.context);
    const zoe::estimate::RankEstimate est = zoe::estimate::estimate_rank(shape, 1, c);
    const double predicted = static_cast<double>(est.model_states.device + est.buffers.device);
    const double measured = static_cast<double>(s.memory.device_peak);
    std::printf("offload %s: predicted %.3f MiB, allocated peak %.3f MiB (ratio %.3f), reserved peak %.3f MiB\n",
                tier == zoe::OffloadDevice::cpu ? "cpu" : "nvme", predicted / 1048576.0, measured / 1048576.0,
                predicted / measured, s.memory.device_reserved_peak / 1048576.0);
    EXPECT_NEAR(predicted, measured, 0.10 * measured);
    EXPECT_GE(s.memory.device_reserved_peak, s.memory.device_peak);
  }
}

}  // namespace
}  // namespace gpt
