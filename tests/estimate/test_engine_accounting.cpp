// zoe-estimate's per-rank model states equal what a real Engine allocates (its ledger,
// Engine::memory_report()), tier by tier: exactly when the flat layout needs no padding, within
// 1% otherwise; the NVMe tier's pinned staging equals the estimate's documented host buffers.
// Ranks are threads on the host device (its "device" tier is host memory, counted as device).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "src/common/host_memory.hpp"
#include "src/config/estimate.hpp"
#include "zoe/engine.hpp"

namespace {
using namespace zoe;
using estimate::ModelShape;
using estimate::RankEstimate;

struct Built {
  std::vector<MemoryReport> reports;  // per rank, after one step
};

// Registers one parameter per module with the given element counts, runs one micro-batch and
// one step (so every lazily built tier exists), and returns each rank's report.
Built build_engine(const Config& config, int world, const std::vector<std::int64_t>& module_numels) {
  Built b;
  b.reports.resize(world);
  auto ranks = make_local_ranks(world, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config, ctx);
    std::vector<ModuleId> modules;
    for (std::size_t i = 0; i < module_numels.size(); ++i) {
      std::vector<float> init(static_cast<std::size_t>(module_numels[i]), 0.01f);
      const ParamId p = e.add_parameter("w" + std::to_string(i), {module_numels[i]}, init);
      modules.push_back(e.add_module("m" + std::to_string(i), {p}));
    }
    for (ModuleId m : modules) ForwardScope f(e, m);
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) BackwardScope bw(e, *it);
    e.step();
    e.synchronize();
    b.reports[ctx.rank] = e.memory_report();
  });
  return b;
}

Config config(int stage, OffloadDevice optimizer, const std::string& nvme_dir) {
  Config c;
  c.bf16.enabled = true;
  c.zero_optimization.stage = stage;
  c.zero_optimization.offload_optimizer.device = optimizer;
  c.zero_optimization.offload_optimizer.nvme_path = nvme_dir;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zoe.optimizer_threads = 1;
  return c;
}

/// Every rank's model states equal the estimate tier by tier, and so do the host buffers (the
/// pinned NVMe staging); device buffers are working memory released after the step (at most).
void expect_reports_equal_the_estimate(const Built& built, const RankEstimate& est, int world) {
  for (int r = 0; r < world; ++r) {
    const MemoryReport& m = built.reports[r];
    EXPECT_EQ(m.device_model_states, est.model_states.device) << "rank " << r;
    EXPECT_EQ(m.host_model_states, est.model_states.host) << "rank " << r;
    EXPECT_EQ(m.nvme_model_states, est.model_states.nvme) << "rank " << r;
    EXPECT_EQ(m.host_buffers, est.buffers.host) << "rank " << r;
    EXPECT_LE(m.device_buffers, est.buffers.device) << "rank " << r;
  }
}

class EngineAccounting : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("zoe-estimate-engine-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(EngineAccounting, ModelStatesEqualTheEstimateWithoutPadding) {
  // 4 modules of 4096 elements on 4 ranks: every shard is 1024 elements, a multiple of the
  // layout's 16-element alignment, so the engine pads nothing.
  const int world = 4;
  const std::vector<std::int64_t> numels(4, 4096);
  const ModelShape shape{4 * 4096, 4096};
  struct Case { int stage; OffloadDevice optimizer; };
  const Case cases[] = {{0, OffloadDevice::none}, {1, OffloadDevice::none}, {2, OffloadDevice::none},
                        {3, OffloadDevice::none}, {1, OffloadDevice::cpu},  {2, OffloadDevice::cpu},
                        {3, OffloadDevice::cpu},  {2, OffloadDevice::nvme}, {3, OffloadDevice::nvme}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "stage " << c.stage << ", offload_optimizer " << static_cast<int>(c.optimizer));
    const Config cfg = config(c.stage, c.optimizer, dir_);
    expect_reports_equal_the_estimate(build_engine(cfg, world, numels), estimate::estimate_rank(shape, world, cfg), world);
  }
}

// Small modules sharing a group (zoe.small_module_threshold): 16 modules of 1,024 elements
// form one group of 16,384, larger than any module, and the offload's pinned staging holds a
// sub-group of its shard. The estimate sized that by the largest module (4 KiB pages of 512
// elements' staging) before it knew groups are shared.
TEST_F(EngineAccounting, SharedGroupsOfSmallModulesEqualTheEstimate) {
  const int world = 2;
  const std::vector<std::int64_t> numels(16, 1024);
  const ModelShape shape{16 * 1024, 1024};
  for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (int stage : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", offload_optimizer " << static_cast<int>(d));
      Config cfg = config(stage, d, dir_);
      cfg.zero_optimization.stage3_param_persistence_threshold = 100'000;  // (its default: groups are shared)
      expect_reports_equal_the_estimate(build_engine(cfg, world, numels), estimate::estimate_rank(shape, world, cfg), world);
    }
  }
}

// The byte-saving modes: bf16 optimizer states (8 bytes per element on the tier), gradients kept
// in host memory by the budget, and the update in backward's recycled gradient buffers (none on
// NVMe): the engine's report equals the estimate, tier by tier.
TEST_F(EngineAccounting, ByteSavingModesEqualTheEstimate) {
  const int world = 4;
  const std::vector<std::int64_t> numels(4, 4096);
  const ModelShape shape{4 * 4096, 4096};
  struct Case {
    int stage;
    OffloadDevice optimizer;
    OptimizerStateDType states;
    bool in_backward;
    std::int64_t budget, sub_group;
    OffloadDevice param = OffloadDevice::none;
    bool split_master = false;
  };
  const Case cases[] = {{2, OffloadDevice::nvme, OptimizerStateDType::bf16, false, 0, 1'000'000'000},
                        {3, OffloadDevice::cpu, OptimizerStateDType::bf16, false, 0, 1'000'000'000},
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, false, 1 << 20, 1'000'000'000},
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, true, 0, 1'000'000'000},
                        {3, OffloadDevice::nvme, OptimizerStateDType::bf16, true, 0, 256},
                        {2, OffloadDevice::nvme, OptimizerStateDType::fp32, true, 64 << 10, 256},
                        // The budget keeps the parameter shards first, then the gradients.
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, false, 1 << 30, 1'000'000'000, OffloadDevice::nvme},
                        {3, OffloadDevice::cpu, OptimizerStateDType::bf16, false, 1 << 30, 1'000'000'000, OffloadDevice::nvme},
                        // Split master weights: 2 bytes and a bit of master per element.
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, false, 0, 1'000'000'000, OffloadDevice::nvme, true},
                        {3, OffloadDevice::nvme, OptimizerStateDType::bf16, true, 1 << 30, 256, OffloadDevice::cpu, true},
                        // After the gradients (2 B x 4096), three sub-groups' states (12 B x 256 each).
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, false, 8192 + 3 * 256 * 12, 256},
                        // The shards first (2 B x 4096), then the gradients, then three sub-groups'
                        // states in host memory (fp32 masters), the rest split on NVMe.
                        {3, OffloadDevice::nvme, OptimizerStateDType::fp32, false, 2 * 8192 + 3 * 256 * 12, 256,
                         OffloadDevice::nvme, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "stage " << c.stage << ", offload_optimizer " << static_cast<int>(c.optimizer)
                                      << ", states " << static_cast<int>(c.states) << ", in backward " << c.in_backward
                                      << ", budget " << c.budget << ", sub-group " << c.sub_group << ", offload_param "
                                      << static_cast<int>(c.param) << ", split masters " << c.split_master);
    Config cfg = config(c.stage, c.optimizer, dir_);
    cfg.zoe.optimizer_state_dtype = c.states;
    cfg.zoe.update_in_backward = c.in_backward;
    cfg.zoe.host_memory_budget = c.budget;
    cfg.zero_optimization.sub_group_size = c.sub_group;
    cfg.zero_optimization.offload_param.device = c.param;
    cfg.zero_optimization.offload_param.nvme_path = dir_;
    cfg.zoe.split_master_weights = c.split_master;
    expect_reports_equal_the_estimate(build_engine(cfg, world, numels), estimate::estimate_rank(shape, world, cfg), world);
  }
}

TEST_F(EngineAccounting, FrozenParametersEqualTheEstimateExactly) {
  // 4 modules of a trainable 4096-element weight and a frozen 2048-element one on 4 ranks (no
  // padding): the estimate with frozen_parameters = 4 x 2048 is the engine's ledger exactly.
  const int world = 4;
  const ModelShape shape{4 * (4096 + 2048), 4096 + 2048, 4 * 2048};
  struct Case { int stage; OffloadDevice optimizer; };
  const Case cases[] = {{0, OffloadDevice::none}, {1, OffloadDevice::none}, {2, OffloadDevice::none},
                        {3, OffloadDevice::none}, {2, OffloadDevice::cpu},  {3, OffloadDevice::nvme}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "stage " << c.stage << ", offload_optimizer " << static_cast<int>(c.optimizer));
    const Config cfg = config(c.stage, c.optimizer, dir_);
    const RankEstimate est = estimate::estimate_rank(shape, world, cfg);
    std::vector<MemoryReport> reports(world);
    run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
      Engine e(cfg, ctx);
      std::vector<ModuleId> modules;
      for (int i = 0; i < 4; ++i) {
        const std::string n = std::to_string(i);
        const ParamId w = e.add_parameter("w" + n, {4096}, std::vector<float>(4096, 0.01f));
        const ParamId f = e.add_parameter("f" + n, {2048}, std::vector<float>(2048, 0.5f), ParamOptions{{}, 1.0, true});
        modules.push_back(e.add_module("m" + n, {w, f}));
      }
      for (ModuleId m : modules) ForwardScope f(e, m);
      for (auto it = modules.rbegin(); it != modules.rend(); ++it) BackwardScope bw(e, *it);
      e.step();
      e.synchronize();
      reports[ctx.rank] = e.memory_report();
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(reports[r].device_model_states, est.model_states.device) << "rank " << r;
      EXPECT_EQ(reports[r].host_model_states, est.model_states.host) << "rank " << r;
      EXPECT_EQ(reports[r].nvme_model_states, est.model_states.nvme) << "rank " << r;
    }
  }
}

TEST_F(EngineAccounting, ModelStatesWithinOnePercentWithPadding) {
  // Sizes that are not multiples of world x 16: each module's flat buffer is padded.
  const int world = 3;
  const std::vector<std::int64_t> numels = {37'001, 36'999, 513, 20'000};
  const ModelShape shape{37'001 + 36'999 + 513 + 20'000, 37'001};
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    const Config cfg = config(stage, stage == 0 ? OffloadDevice::none : OffloadDevice::cpu, dir_);
    const RankEstimate est = estimate::estimate_rank(shape, world, cfg);
    const Built built = build_engine(cfg, world, numels);
    for (int r = 0; r < world; ++r) {
      const MemoryReport& m = built.reports[r];
      const double engine = static_cast<double>(m.device_model_states + m.host_model_states + m.nvme_model_states);
      const double predicted = static_cast<double>(est.model_states.total());
      EXPECT_GE(engine, predicted) << "rank " << r;  // padding only adds
      EXPECT_LE(engine, predicted * 1.01) << "rank " << r;
      EXPECT_NEAR(static_cast<double>(m.device_model_states), static_cast<double>(est.model_states.device),
                  0.01 * predicted) << "rank " << r;
      EXPECT_NEAR(static_cast<double>(m.host_model_states), static_cast<double>(est.model_states.host),
                  0.01 * predicted) << "rank " << r;
    }
  }
}
}  // namespace

// zoe.host_memory_budget "auto": the engine resolves it from this machine's memory and the
// ranks on it; the estimate, given the same reading (with_host_memory_budget_resolved), places
// the same bytes on each tier. estimate_rank itself refuses an unresolved "auto".
TEST_F(EngineAccounting, AutoHostBudgetEqualsTheEstimateOfTheSameMachine) {
  const int world = 2;
  const std::vector<std::int64_t> numels(4, 4096);
  const ModelShape shape{4 * 4096, 4096};
  Config cfg = config(3, OffloadDevice::nvme, dir_);
  cfg.zero_optimization.offload_param.device = OffloadDevice::nvme;
  cfg.zero_optimization.offload_param.nvme_path = dir_;
  cfg.zoe.host_memory_budget = ZoeConfig::kHostMemoryBudgetAuto;
  EXPECT_THROW(estimate::estimate_rank(shape, world, cfg), UsageError);
  const Built built = build_engine(cfg, world, numels);
  const HostMemoryReading machine = read_host_memory();
  const Config resolved = estimate::with_host_memory_budget_resolved(cfg, machine.cgroup_room ? std::min(machine.available, *machine.cgroup_room) : machine.available,
                                                                     machine.total, world);
  ASSERT_GT(resolved.zoe.host_memory_budget, 1 << 20) << "this machine has under 1 MiB to spare per rank";
  expect_reports_equal_the_estimate(built, estimate::estimate_rank(shape, world, resolved), world);
  EXPECT_EQ(built.reports[0].nvme_model_states, 0);
}
