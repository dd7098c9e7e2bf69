// The recommendation rule: stage 1, else 2, else 3, then CPU offload, then NVMe; one line why.
// 7.5B parameters on 64 ranks, 8 per node, shard s = 117,187,500 elements. Needs worked out by
// hand (bytes): the gradient bucket 2 x (2 x 5e8 + 5e8 / 64) = 2.015625e9 (its gradients, their
// flattened copy, the reduced shards); at stage 3 also the prefetch 1e8 and a coalesced
// gather's staging 2 x (5e7 + 781,250) = 101,562,500. GPU: stage 1 31.40625e9 + 2.015625e9 =
// 33.421875e9; stage 2 16.640625e9 + 2.015625e9; stage 3 1.875e9 + 2.2171875e9; optimizer
// offloaded 2s + 2.2171875e9 = 2.4515625e9 (parameter and gradient shards); parameters
// offloaded too 2.2171875e9.
#include <gtest/gtest.h>

#include "tests/estimate/estimate_test_util.hpp"
#include "zoe/error.hpp"

namespace {
using namespace zoe::estimate;

constexpr std::int64_t kPsi = 7'500'000'000;

Cluster cluster(std::int64_t gpu, std::int64_t host, std::int64_t nvme) {
  Cluster c;
  c.world_size = 64;
  c.gpus_per_node = 8;
  c.gpu_bytes = gpu;
  c.host_bytes_per_node = host;
  c.nvme_bytes_per_node = nvme;
  c.gpu_headroom = 0;
  c.host_headroom = 0;
  return c;
}

// Small NVMe staging so the NVMe rows need less host memory than the CPU rows: optimizer
// buffers 2 x 240,001,024 bytes (12 x 1e7 in whole pages), parameter staging 5 x 1e6 x 2
// bytes, no host parameter cache. Host per node: optimizer nvme 1,920,008,192; + params cpu
// 3,795,008,192; params nvme 2,000,008,192 (CPU rows: 11.25e9 and 13.125e9).
zoe::Config small_nvme_buffers() {
  zoe::Config c = mixed_precision_knobs();
  c.zero_optimization.sub_group_size = 10'000'000;
  c.zero_optimization.offload_optimizer.buffer_count = 2;
  c.zero_optimization.offload_param.buffer_size = 1'000'000;
  c.zero_optimization.offload_param.max_in_cpu = 0;
  return c;
}

std::string recommended(const Plan& p) { return p.recommended ? p.rows[*p.recommended].label : "none"; }

TEST(EstimateRecommend, RowsCoverEveryStageAndOffload) {
  const Plan p = plan({kPsi, 0}, cluster(80e9, 1e12, 0), mixed_precision_knobs());
  ASSERT_EQ(p.rows.size(), 13u);
  EXPECT_EQ(p.rows[0].label, "stage 0 (plain DP)");
  EXPECT_EQ(p.rows[3].label, "stage 1, optimizer nvme");
  EXPECT_EQ(p.rows[12].label, "stage 3, optimizer nvme, params nvme");
  EXPECT_EQ(p.rows[1].device_bytes, 33'421'875'000);
  EXPECT_EQ(p.rows[4].device_bytes, 18'656'250'000);
  EXPECT_EQ(p.rows[7].device_bytes, 4'092'187'500);
  // Optimizer offload takes the fp32 gradient shard along: the GPU keeps the parameter shard.
  EXPECT_EQ(p.rows[8].device_bytes, 2'451'562'500);
  EXPECT_EQ(p.rows[9].device_bytes, 2'217'187'500);
  // 8 ranks x (12 + 2: the bf16 gradient of one micro-batch) bytes x s, plus the update pipeline's pinned staging of one 1e7-element
  // sub-group in bf16 (20,000,768 bytes in whole pages): four buffers, two with the parameters
  // offloaded too (their new values go into the parameter tier).
  EXPECT_EQ(p.rows[8].host_bytes_per_node, 8LL * 14 * 117'187'500 + 8LL * 4 * 20'000'768);
  EXPECT_EQ(p.rows[9].host_bytes_per_node, 8LL * 16 * 117'187'500 + 8LL * 2 * 20'000'768);
  EXPECT_EQ(p.rows[10].nvme_bytes_per_node, 8LL * 14 * 117'187'500);
}

TEST(EstimateRecommend, StageOneWhenTheWholeStateFits) {
  const Plan p = plan({kPsi, 0}, cluster(40e9, 1e12, 0), mixed_precision_knobs());
  EXPECT_EQ(recommended(p), "stage 1");
  EXPECT_NE(p.why.find("whole model state fits on one GPU"), std::string::npos) << p.why;
}

TEST(EstimateRecommend, StageTwoWhenParamsAndGradientsFit) {
  const Plan p = plan({kPsi, 0}, cluster(20e9, 1e12, 0), mixed_precision_knobs());
  EXPECT_EQ(recommended(p), "stage 2");
  EXPECT_NE(p.why.find("stage 1 does not (needs 31.13 GiB per GPU, 18.63 GiB usable)"), std::string::npos) << p.why;
}

TEST(EstimateRecommend, HeadroomIsLeftForActivations) {
  Cluster c = cluster(40e9, 1e12, 0);
  c.gpu_headroom = 0.2;  // 32e9 usable < stage 1's 33.42e9
  EXPECT_EQ(recommended(plan({kPsi, 0}, c, mixed_precision_knobs())), "stage 2");
}

TEST(EstimateRecommend, StageThreeThenCpuThenNvme) {
  const Plan s3 = plan({kPsi, 0}, cluster(5e9, 1e12, 0), mixed_precision_knobs());
  EXPECT_EQ(recommended(s3), "stage 3");
  EXPECT_NE(s3.why.find("1.5x the traffic"), std::string::npos) << s3.why;
  EXPECT_EQ(recommended(plan({kPsi, 0}, cluster(3e9, 1e12, 0), mixed_precision_knobs())), "stage 3, optimizer cpu");
  EXPECT_EQ(recommended(plan({kPsi, 0}, cluster(2.3e9, 1e12, 0), mixed_precision_knobs())),
            "stage 3, optimizer cpu, params cpu");
  // Host memory too small for the CPU tier (16.875e9 per node): NVMe.
  const Plan n1 = plan({kPsi, 0}, cluster(2.3e9, 10e9, 100e9), small_nvme_buffers());
  EXPECT_EQ(recommended(n1), "stage 3, optimizer nvme, params cpu");
  EXPECT_NE(n1.why.find("stage 3, optimizer nvme does not (needs 2.28 GiB per GPU, 2.14 GiB usable)"),
            std::string::npos) << n1.why;
  EXPECT_EQ(recommended(plan({kPsi, 0}, cluster(2.3e9, 4e9, 100e9), small_nvme_buffers())),
            "stage 3, optimizer nvme, params nvme");
}

TEST(EstimateRecommend, NothingFitsSaysWhy) {
  const Plan p = plan({kPsi, 0}, cluster(1e9, 1e12, 1e12), mixed_precision_knobs());
  EXPECT_FALSE(p.recommended.has_value());
  EXPECT_EQ(p.why.rfind("nothing fits: even stage 3, optimizer nvme, params nvme", 0), 0u) << p.why;
  EXPECT_NE(p.why.find("per GPU"), std::string::npos) << p.why;
}

TEST(EstimateRecommend, FewerRanksThanGpusPerNodeShareOneNode) {
  Cluster c = cluster(1.2e9, 1e12, 0);
  c.world_size = 4;
  const Plan p = plan({kPsi, 0}, c, mixed_precision_knobs());
  const std::int64_t s = kPsi / 4;
  // States and shards, plus two pinned pipeline buffers of one 1e7-element bf16 sub-group each.
  EXPECT_EQ(p.rows[9].host_bytes_per_node, 4 * 16 * s + 4 * 2 * 20'000'768);
}

TEST(EstimateRecommend, RejectsAnInvalidCluster) {
  const zoe::Config k = mixed_precision_knobs();
  Cluster c = cluster(1e9, 1e9, 0);
  c.world_size = 0;
  EXPECT_THROW(plan({kPsi, 0}, c, k), zoe::ConfigError);
  c = cluster(-1, 1e9, 0);
  EXPECT_THROW(plan({kPsi, 0}, c, k), zoe::ConfigError);
  c = cluster(1e9, 1e9, 0);
  c.gpu_headroom = 1.0;
  EXPECT_THROW(plan({kPsi, 0}, c, k), zoe::ConfigError);
}
}  // namespace

TEST(EstimateRecommend, UpdateTimingKeysChangeNoRow) {
  // zoe.update_in_backward / zoe.delayed_update say when the update runs; the rows do not model it:
  // a config with either gives every row the bytes of the same config without it (and the rows
  // without offload, which could not take the key, are still planned).
  zoe::Config with = small_nvme_buffers();
  with.zero_optimization.stage = 3;
  with.zero_optimization.offload_optimizer.device = zoe::OffloadDevice::nvme;
  with.zero_optimization.offload_optimizer.nvme_path = "/tmp";
  with.gradient_clipping = 0;
  zoe::Config without = with;
  with.zoe.update_in_backward = true;
  const Plan a = plan({kPsi, 0}, cluster(80e9, 1e12, 1e13), with), b = plan({kPsi, 0}, cluster(80e9, 1e12, 1e13), without);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].device_bytes, b.rows[i].device_bytes) << a.rows[i].label;
    EXPECT_EQ(a.rows[i].host_bytes_per_node, b.rows[i].host_bytes_per_node) << a.rows[i].label;
    EXPECT_EQ(a.rows[i].nvme_bytes_per_node, b.rows[i].nvme_bytes_per_node) << a.rows[i].label;
  }
  with.zoe.update_in_backward = false;
  with.zoe.delayed_update = true;
  EXPECT_EQ(plan({kPsi, 0}, cluster(80e9, 1e12, 1e13), with).rows.size(), a.rows.size());
}

TEST(EstimateRecommend, ByteSavingKeysApplyWhereTheRowCanTakeThem) {
  // A config with bf16 states, split masters and a host budget (the scale demo's kind) is planned
  // on every row: each key counts where the row's layout can take it, and the rows that could
  // not take it are planned as the same config without it.
  zoe::Config with = small_nvme_buffers();
  with.zero_optimization.stage = 3;
  with.zero_optimization.offload_optimizer.device = zoe::OffloadDevice::nvme;
  with.zero_optimization.offload_optimizer.nvme_path = "/tmp";
  with.zero_optimization.offload_param.device = zoe::OffloadDevice::nvme;
  with.zero_optimization.offload_param.nvme_path = "/tmp";
  const zoe::Config without = with;
  with.zoe.optimizer_state_dtype = zoe::OptimizerStateDType::bf16;
  with.zoe.split_master_weights = true;
  const Cluster cl = cluster(80e9, 1e12, 1e13);
  const Plan a = plan({kPsi, 0}, cl, with), b = plan({kPsi, 0}, cl, without);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    const RankEstimate &x = a.rows[i].rank, &y = b.rows[i].rank;
    SCOPED_TRACE(a.rows[i].label);
    const std::int64_t saved = y.optimizer_states.host + y.optimizer_states.nvme - x.optimizer_states.host -
                               x.optimizer_states.nvme;
    const std::int64_t e = x.trainable_shard_elements;
    if (x.offload_optimizer == zoe::OffloadDevice::none) {
      EXPECT_EQ(saved, 0);
    } else if (x.stage == 3 && x.offload_param != zoe::OffloadDevice::none &&
               x.offload_optimizer == zoe::OffloadDevice::nvme) {
      EXPECT_EQ(saved, 4 * e + 2 * e) << "bf16 moments and split masters (the rounded-up bit rides in exp_avg_sq)";
    } else {
      EXPECT_EQ(saved, 4 * e) << "bf16 moments";
    }
  }
  // A host budget counts on the rows with an NVMe tier; the others are planned without it.
  zoe::Config budget = without;
  budget.zoe.host_memory_budget = std::int64_t{1} << 30;
  const Plan c = plan({kPsi, 0}, cl, budget);
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const RankEstimate &x = c.rows[i].rank, &y = b.rows[i].rank;
    SCOPED_TRACE(c.rows[i].label);
    const bool nvme = x.offload_optimizer == zoe::OffloadDevice::nvme ||
                      (x.stage == 3 && x.offload_param == zoe::OffloadDevice::nvme);
    // Whole elements: up to one element's bytes (12 of states) short of the budget.
    const std::int64_t moved = x.model_states.host - y.model_states.host;
    EXPECT_EQ(y.model_states.nvme - x.model_states.nvme, moved);
    if (nvme) {
      EXPECT_LE(moved, std::int64_t{1} << 30);
      EXPECT_GT(moved, (std::int64_t{1} << 30) - 12);
    } else {
      EXPECT_EQ(moved, 0);
    }
  }
}
