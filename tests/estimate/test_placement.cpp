// Where each model state goes under offload, the ratio, fp32 compute, and the buffer rules.
#include <gtest/gtest.h>

#include "tests/estimate/estimate_test_util.hpp"
#include "zoe/error.hpp"

namespace {
using namespace zoe::estimate;
using zoe::OffloadDevice;
using zoe::estimate::testing::knobs;

constexpr std::int64_t kPsi = 1'000'000'000;
constexpr int kNd = 8;
constexpr std::int64_t kShard = 125'000'000;

TEST(EstimatePlacement, OptimizerOffloadMovesTheStatesAndTheGradientShard) {
  for (auto dev : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    SCOPED_TRACE(dev == OffloadDevice::cpu ? "cpu" : "nvme");
    auto c = knobs(2, dev);
    const auto r = estimate_rank({kPsi, 0}, kNd, c);
    EXPECT_EQ(r.params, (TierBytes{2 * kPsi, 0, 0}));
    // The gradient shard lives with the states, as reduced (bf16, one micro-batch); the device
    // keeps no gradient shard.
    const TierBytes grads = dev == OffloadDevice::cpu ? TierBytes{0, 2 * kShard, 0} : TierBytes{0, 0, 2 * kShard};
    EXPECT_EQ(r.gradients, grads);
    const TierBytes opt = dev == OffloadDevice::cpu ? TierBytes{0, 12 * kShard, 0} : TierBytes{0, 0, 12 * kShard};
    EXPECT_EQ(r.optimizer_states, opt);
    // Micro-batches accumulate in fp32 (4 bytes); bf16 exp_avg / exp_avg_sq take 8 of the 12.
    c.gradient_accumulation_steps = 2;
    c.zoe.optimizer_state_dtype = zoe::OptimizerStateDType::bf16;
    const auto a = estimate_rank({kPsi, 0}, kNd, c);
    EXPECT_EQ(a.gradients, dev == OffloadDevice::cpu ? (TierBytes{0, 4 * kShard, 0}) : (TierBytes{0, 0, 4 * kShard}));
    EXPECT_EQ(a.optimizer_states, dev == OffloadDevice::cpu ? (TierBytes{0, 8 * kShard, 0}) : (TierBytes{0, 0, 8 * kShard}));
  }
  // Stage 1 keeps the full device gradients (the trainer accumulates there) as well.
  const auto s1 = estimate_rank({kPsi, 0}, kNd, knobs(1, OffloadDevice::cpu));
  EXPECT_EQ(s1.gradients, (TierBytes{2 * kPsi, 2 * kShard, 0}));
  EXPECT_EQ(s1.optimizer_states, (TierBytes{0, 12 * kShard, 0}));
}

TEST(EstimatePlacement, ParamOffloadMovesTheStage3ParameterShard) {
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, knobs(3)).params, (TierBytes{2 * kShard, 0, 0}));
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, knobs(3, OffloadDevice::cpu, OffloadDevice::cpu)).params,
            (TierBytes{0, 2 * kShard, 0}));
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, knobs(3, OffloadDevice::nvme, OffloadDevice::nvme)).params,
            (TierBytes{0, 0, 2 * kShard}));
}

// NVMe bytes per step, counted by hand from what each tier moves (the estimate's header).
TEST(EstimatePlacement, NvmeTrafficPerStep) {
  // Everything on NVMe, bf16, one micro-batch: 18 read + 16 written per element (ZeRO-Infinity's
  // fp32 gradient makes it 20 + 18; zoe keeps the bf16 reduced shard, the same values).
  auto all_nvme = knobs(3, OffloadDevice::nvme, OffloadDevice::nvme);
  auto r = estimate_rank({kPsi, 0}, kNd, all_nvme);
  EXPECT_EQ(r.nvme_traffic.read, 18 * kShard);     // states 12 + bf16 gradient 2, the bf16 shard twice 4
  EXPECT_EQ(r.nvme_traffic.written, 16 * kShard);  // states 12, bf16 gradient 2, the new bf16 shard 2
  // Two micro-batches: the fp32 gradient, the second one read and written back (+4 +4), the
  // shard read in both micro-batches' forward and backward (+4).
  all_nvme.gradient_accumulation_steps = 2;
  r = estimate_rank({kPsi, 0}, kNd, all_nvme);
  EXPECT_EQ(r.nvme_traffic.read, (16 + 4 + 8) * kShard);
  EXPECT_EQ(r.nvme_traffic.written, (12 + 8 + 2) * kShard);
  // Half the sub-groups offloaded, parameters on the device: only their states and gradients.
  auto half = knobs(3, OffloadDevice::nvme);
  half.zero_optimization.offload_optimizer.ratio = 0.5;
  r = estimate_rank({kPsi, 0}, kNd, half);
  EXPECT_EQ(r.nvme_traffic.read, 14 * (kShard / 2));
  EXPECT_EQ(r.nvme_traffic.written, 14 * (kShard / 2));
  // zoe.host_memory_budget keeps gradients in host memory (parameters on the device): all of
  // them (12 read, 12 written for the states), or half of them.
  auto kept = knobs(3, OffloadDevice::nvme);
  kept.zoe.host_memory_budget = 2 * kShard;
  r = estimate_rank({kPsi, 0}, kNd, kept);
  EXPECT_EQ(r.nvme_traffic.read, 12 * kShard);
  EXPECT_EQ(r.nvme_traffic.written, 12 * kShard);
  EXPECT_EQ(r.gradients, (TierBytes{0, 2 * kShard, 0}));
  kept.zoe.host_memory_budget = kShard;
  r = estimate_rank({kPsi, 0}, kNd, kept);
  EXPECT_EQ(r.nvme_traffic.read, 12 * kShard + kShard);
  EXPECT_EQ(r.nvme_traffic.written, 12 * kShard + kShard);
  EXPECT_EQ(r.gradients, (TierBytes{0, kShard, kShard}));
  // And bf16 optimizer states: 8 bytes each way instead of 12.
  kept.zoe.host_memory_budget = 2 * kShard;
  kept.zoe.optimizer_state_dtype = zoe::OptimizerStateDType::bf16;
  r = estimate_rank({kPsi, 0}, kNd, kept);
  EXPECT_EQ(r.nvme_traffic.read, 8 * kShard);
  EXPECT_EQ(r.nvme_traffic.written, 8 * kShard);
  // With the parameter shards on NVMe too the budget keeps them first (read twice, written
  // once): 2 bytes per element take the shard off NVMe (12 + 2 read, 12 + 2 written); 4 take
  // the gradients as well (12 and 12); bf16 states then leave 8 and 8.
  auto both = knobs(3, OffloadDevice::nvme, OffloadDevice::nvme);
  both.zoe.host_memory_budget = 2 * kShard;
  r = estimate_rank({kPsi, 0}, kNd, both);
  EXPECT_EQ(r.params, (TierBytes{0, 2 * kShard, 0}));
  EXPECT_EQ(r.gradients, (TierBytes{0, 0, 2 * kShard}));
  EXPECT_EQ(r.nvme_traffic.read, (12 + 2) * kShard);
  EXPECT_EQ(r.nvme_traffic.written, (12 + 2) * kShard);
  both.zoe.host_memory_budget = 4 * kShard;
  r = estimate_rank({kPsi, 0}, kNd, both);
  EXPECT_EQ(r.gradients, (TierBytes{0, 2 * kShard, 0}));
  EXPECT_EQ(r.nvme_traffic.read, 12 * kShard);
  EXPECT_EQ(r.nvme_traffic.written, 12 * kShard);
  both.zoe.optimizer_state_dtype = zoe::OptimizerStateDType::bf16;
  r = estimate_rank({kPsi, 0}, kNd, both);
  EXPECT_EQ(r.nvme_traffic.read + r.nvme_traffic.written, 16 * kShard);
  // The update in backward: gradients in recycled host buffers, none on NVMe, whatever the budget.
  auto eager = knobs(3, OffloadDevice::nvme, OffloadDevice::nvme);
  eager.zoe.update_in_backward = true;
  r = estimate_rank({kPsi, 0}, kNd, eager);
  EXPECT_EQ(r.nvme_traffic.read, (12 + 4) * kShard);
  EXPECT_EQ(r.nvme_traffic.written, (12 + 2) * kShard);
  EXPECT_EQ(r.gradients.nvme, 0);
  // One group of the whole shard (no layer known): a buffer per sub-group of 1e7 elements.
  EXPECT_EQ(r.gradients.host, 13 * 2 * 10'000'000);
  // Layers of 5e7 elements: shards of 6,250,000, one sub-group each: two buffers.
  r = estimate_rank({kPsi, 50'000'000}, kNd, eager);
  EXPECT_EQ(r.gradients, (TierBytes{0, 2 * 2 * 6'250'000, 0}));
  // Split master weights: the master as 2 bytes each way (10 for the states), and the update
  // reads the shard it rewrites (2 more); with the update in backward it takes the step's last
  // read of the shard instead: 26 bytes per parameter, 18 with bf16 states.
  auto split = knobs(3, OffloadDevice::nvme, OffloadDevice::nvme);
  split.zoe.split_master_weights = true;
  const std::int64_t states = 10 * kShard;
  r = estimate_rank({kPsi, 0}, kNd, split);
  EXPECT_EQ(r.nvme_traffic.read, states + 2 * kShard + 4 * kShard + 2 * kShard);  // states, gradient, shard twice, high halves
  EXPECT_EQ(r.nvme_traffic.written, states + 2 * kShard + 2 * kShard);
  split.zoe.update_in_backward = true;
  r = estimate_rank({kPsi, 0}, kNd, split);
  EXPECT_EQ(r.nvme_traffic.read, states + 4 * kShard);
  EXPECT_EQ(r.nvme_traffic.written, states + 2 * kShard);
  EXPECT_EQ(r.nvme_traffic.read + r.nvme_traffic.written, 26 * kShard);
  split.zoe.optimizer_state_dtype = zoe::OptimizerStateDType::bf16;
  r = estimate_rank({kPsi, 0}, kNd, split);
  EXPECT_EQ(r.nvme_traffic.read + r.nvme_traffic.written, 18 * kShard);
  // Host-memory tiers move nothing over NVMe.
  r = estimate_rank({kPsi, 0}, kNd, knobs(3, OffloadDevice::cpu, OffloadDevice::cpu));
  EXPECT_EQ(r.nvme_traffic.read, 0);
  EXPECT_EQ(r.nvme_traffic.written, 0);
}

TEST(EstimatePlacement, RatioSplitsTheShard) {
  auto c = knobs(3, OffloadDevice::cpu);
  c.zero_optimization.offload_optimizer.ratio = 0.4;  // 50,000,000 of the 125,000,000 elements
  const auto r = estimate_rank({kPsi, 0}, kNd, c);
  EXPECT_EQ(r.optimizer_states, (TierBytes{12 * 75'000'000, 12 * 50'000'000, 0}));
  // The device sub-groups keep the device gradient shard; the offloaded ones their bf16 copy.
  EXPECT_EQ(r.gradients, (TierBytes{2 * kShard, 2 * 50'000'000, 0}));
}

TEST(EstimatePlacement, ShardsRoundUp) {
  const auto r = estimate_rank({1001, 0}, 10, knobs(3));
  EXPECT_EQ(r.shard_elements, 101);
  EXPECT_EQ(r.model_states.total(), 16 * 101);
}

TEST(EstimatePlacement, Fp32ComputeUsesFourByteParamsAndGradients) {
  zoe::Config c;  // neither fp16 nor bf16
  c.zero_optimization.stage = 1;
  const auto r = estimate_rank({kPsi, 0}, kNd, c);
  EXPECT_EQ(r.compute_bytes, 4);
  EXPECT_EQ(r.model_states.total(), 8 * kPsi + 12 * kShard);
}

TEST(EstimatePlacement, BuffersFollowTheDocumentedRules) {
  // Stages 0-2: the gradient bucket (gradients, flattened copy, reduced shards), capped by
  // the model; kNd ranks.
  auto c = knobs(2);
  c.zero_optimization.reduce_bucket_size = 200'000'000;
  auto bucket = [](std::int64_t b) { return 2 * (2 * b + (b + kNd - 1) / kNd); };
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, c).buffers, (TierBytes{bucket(200'000'000), 0, 0}));
  EXPECT_EQ(estimate_rank({1000, 0}, kNd, c).buffers, (TierBytes{bucket(1000), 0, 0}));
  // Stage 2 with the largest layer known: every gradient buffer of the step (given back at
  // step()) and two new shards (this step's and the last one's), larger than the bucket here;
  // allgather_bucket_size pieces stage 2a once a layer holds 2a.
  c.zero_optimization.allgather_bucket_size = 1000;
  EXPECT_EQ(estimate_rank({kPsi, 1999}, kNd, c).buffers.device, 2 * (kPsi + 2 * kShard));
  EXPECT_EQ(estimate_rank({kPsi, 2000}, kNd, c).buffers.device, 2 * (kPsi + 2 * kShard) + 2 * 2000);
  c.zero_optimization.stage = 1;  // stage 1: the bucket (its gradients are model states)
  EXPECT_EQ(estimate_rank({kPsi, 1999}, kNd, c).buffers.device, bucket(200'000'000));
  // Stage 3 (the device's allocated peak): the larger of the first step (the largest layer L
  // gathered, the layer m before it still held, the gradients of both; no reduced-shard
  // buffers without optimizer offload) and later steps (G gathered: min(Psi, max(L + P,
  // min(live cap, reuse distance + L))), the same gradients, a coalesced prefetch's staging
  // c + c/Nd with c = P + m). The bucket (100 elements) is smaller than the layers' gradients.
  c = knobs(3);
  c.zero_optimization.reduce_bucket_size = 100;
  c.zero_optimization.stage3_prefetch_bucket_size = 30'000'000;
  const std::int64_t L = 20'000'000, m = 5'000'000, P = 30'000'000;
  const std::int64_t grads = L + m;
  auto coalesced = [](std::int64_t x) { return x + (x + kNd - 1) / kNd; };
  // Reuse distance and live cap at their defaults (1e9 each): G = min(Psi, 1e9) = Psi, all
  // gathered, so nothing is prefetched (no coalesced staging).
  EXPECT_EQ(estimate_rank({kPsi, L, 0, m}, kNd, c).buffers.device, 2 * (kPsi + grads));
  c.zero_optimization.stage3_max_reuse_distance = 0;  // nothing kept: G = L + P
  EXPECT_EQ(estimate_rank({kPsi, L, 0, m}, kNd, c).buffers.device, 2 * (L + P + grads + coalesced(P + m)));
  c.zero_optimization.stage3_max_live_parameters = 1;  // G stays L + P (the prefetch stops at the cap, but never below it)
  EXPECT_EQ(estimate_rank({kPsi, L, 0, m}, kNd, c).buffers.device, 2 * (L + P + grads + coalesced(P + m)));
  // The second largest layer unknown: taken as L. One rank: no coalesced staging; the first
  // step (L + m gathered, L + m gradients) is larger with prefetch off.
  c.zero_optimization.stage3_prefetch_bucket_size = 0;
  EXPECT_EQ(estimate_rank({kPsi, L}, 1, c).buffers.device, 2 * (L + L + 2 * L));
  // Optimizer offload (every sub-group): each gradient has a reduced shard of its own; offload_param
  // stages the largest layer's shard in the first step.
  c = knobs(3, OffloadDevice::cpu, OffloadDevice::cpu);
  c.zero_optimization.reduce_bucket_size = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  const std::int64_t r = (L + kNd - 1) / kNd, rm = (m + kNd - 1) / kNd;
  const std::int64_t first = L + r + m + (L + r + m + rm);
  const std::int64_t later = L + 50'000'000 + (L + r + m + rm) + coalesced(50'000'000 + m);
  EXPECT_EQ(estimate_rank({kPsi, L, 0, m}, kNd, c).buffers.device, 2 * std::max(first, later));
  // Stage 2 with optimizer offload: every gradient with its reduced shard, two new shards.
  c = knobs(2, OffloadDevice::cpu);
  c.zero_optimization.reduce_bucket_size = 0;
  c.zero_optimization.allgather_bucket_size = 1'000'000'000;
  EXPECT_EQ(estimate_rank({kPsi, L, 0, m}, kNd, c).buffers.device, 2 * (kPsi + kShard + 2 * kShard));
  // NVMe optimizer: buffer_count buffers of the largest sub-group's 12 bytes per element in
  // whole pages (120,000,000 bytes -> 120,000,512), then its 2-byte gradient (bf16, one
  // micro-batch), in whole pages (140,001,280), plus one gradient buffer (20,000,000 ->
  // 20,000,768).
  // The update pipeline stages one sub-group's bf16 gradient twice and its new bf16
  // parameters twice (20,000,000 bytes -> 20,000,768 each).
  c = knobs(3, OffloadDevice::nvme);
  c.zero_optimization.sub_group_size = 10'000'000;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, c).buffers.host, 3 * 140'001'280LL + 20'000'768LL + 4 * 20'000'768LL);
  // A known largest layer bounds the sub-group: ceil(8e6 / 8) = 1e6 elements: 12,000,000
  // bytes -> 12,001,280, + 2,000,000 -> 14,004,224; gradient buffer 2,002,944; pipeline
  // 2,000,000 -> 2,002,944.
  EXPECT_EQ(estimate_rank({kPsi, 8'000'000}, kNd, c).buffers.host,
            3 * 14'004'224LL + 2'002'944LL + 4 * 2'002'944LL);
  // Tiny sub-groups: a page of states, the gradient on the next page, one gradient page, four
  // pipeline pages.
  c.zero_optimization.sub_group_size = 7;  // rounds to the 16-element alignment
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, c).buffers.host, 3 * 8192 + 4096 + 4 * 4096);
  // Host optimizer: only the pipeline's staging.
  c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, c).buffers.host, 4 * 4096);
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.sub_group_size = 10'000'000;
  // NVMe parameters: the staging buffers in whole pages, no host cache (max_in_cpu is moot);
  // the new parameters go into the parameter tier, so the pipeline stages only gradients.
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.buffer_count = 2;
  c.zero_optimization.offload_param.buffer_size = 1'000'000;
  c.zero_optimization.offload_param.max_in_cpu = 5'000'000;
  EXPECT_EQ(estimate_rank({kPsi, 0}, kNd, c).buffers.host,
            3 * 140'001'280LL + 20'000'768LL + 2 * 2'002'944LL + 2 * 20'000'768LL);  // 2 MB in 489 pages
}

TEST(EstimatePlacement, RejectsBadInputs) {
  EXPECT_THROW(estimate_rank({0, 0}, 8, knobs(1)), zoe::ConfigError);
  EXPECT_THROW(estimate_rank({kPsi, -1}, 8, knobs(1)), zoe::ConfigError);
  EXPECT_THROW(estimate_rank({kPsi, 0}, 0, knobs(1)), zoe::ConfigError);
  EXPECT_THROW(estimate_rank({kPsi, 0}, 8, knobs(1, OffloadDevice::none, OffloadDevice::cpu)), zoe::ConfigError);
}
}  // namespace
