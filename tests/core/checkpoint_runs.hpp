// Training runs for the checkpoint tests: `world` ranks (threads) train steps [from, to) of
// TestNet on a global batch of 16 samples per step (rank r takes 16 / world of them), after
// loading a checkpoint and before saving one if asked; rank 0's gathered fp32 parameters come
// back.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/core/test_net.hpp"

namespace zoe::test {

inline const NetSpec kCheckpointNet{{8, 16, 8}, true, 11};

inline Config checkpoint_config(int stage, OffloadDevice offload, const std::string& dir, bool bf16 = true) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = bf16;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 64;
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path = dir + "/nvme";
  return c;
}

using Params = std::vector<std::vector<float>>;

/// `losses`, if given, gets rank 0's mean micro-batch loss of each step trained.
inline Params checkpoint_run(const Config& c, int world, int from, int to, const std::string& load,
                             const std::string& save, const NetSpec& net_spec = kCheckpointNet,
                             std::vector<double>* losses = nullptr) {
  auto ranks = make_local_ranks(world, 60.0);
  Params out;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, net_spec);
    if (!load.empty()) e.load_checkpoint(load);
    EXPECT_EQ(e.global_step(), from);
    const int per_rank = 16 / world;
    for (int s = from; s < to; ++s) {
      const double loss = net.micro_batch(s * 16 + ctx.rank * per_rank, per_rank);
      e.step();
      if (losses && ctx.rank == 0) losses->push_back(loss);
    }
    if (!save.empty()) e.save_checkpoint(save);
    Params p;
    for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
    if (ctx.rank == 0) out = p;
  });
  return out;
}

inline void expect_bitwise(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  bool differ = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    const bool same = std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) == 0;
    EXPECT_TRUE(same) << what << ": param " << i;
    differ = differ || !same;
  }
  if (differ) ADD_FAILURE() << what << ": first difference: " << describe_first_difference(a, b);
}

// The largest |a - b| / max(|a|, |b|, 1e-3) over every element.
inline double max_relative(const Params& a, const Params& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      const double x = a[i][k], y = b[i][k];
      worst = std::max(worst, std::abs(x - y) / std::max({std::abs(x), std::abs(y), 1e-3}));
    }
  return worst;
}

// ||a - b|| / ||a|| over all parameters (fp64).
inline double norm_relative(const Params& a, const Params& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      d += (static_cast<double>(a[i][k]) - b[i][k]) * (static_cast<double>(a[i][k]) - b[i][k]);
      n += static_cast<double>(a[i][k]) * a[i][k];
    }
  return std::sqrt(d / n);
}

}  // namespace zoe::test
