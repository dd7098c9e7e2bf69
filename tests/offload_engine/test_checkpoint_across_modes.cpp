// Checkpoints between the exact modes. Each of zoe.update_in_backward, zoe.host_memory_budget and
// zoe.split_master_weights (and all three together) trains bitwise as the plain step with fp32
// masters, and a checkpoint holds fp32 masters and states whatever the mode, so a checkpoint of
// any of them must load into any other and continue as the unbroken plain run: parameters and
// losses bit for bit, for every ordered pair of modes (stage 3, 2 ranks, bf16 compute, the
// optimizer and the parameters on NVMe, one micro-batch per step).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
using zoe::test::Params;
using zoe::test::RunResult;
using zoe::test::checkpoint_run;
using zoe::test::expect_bitwise;
using zoe::test::train;

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;  // k steps in one mode, k in the next; the reference runs 2k unbroken

struct Mode {
  const char* name;
  bool in_backward = false;
  bool split = false;
  std::int64_t budget = 0;  // zoe.host_memory_budget: shards first, then gradients, then states
  // What the budget keeps, per rank: bytes in host memory and bytes it takes off NVMe.
  std::int64_t host = 0, off_nvme = 0;
};

// Per rank (2 ranks, padding to 32 elements) zoe::test::kCheckpointNet's groups hold 80, 80 and
// 16 elements (l0 with the tied head's weight, l1, head.bias): 352 bytes of bf16 shards on the
// parameter tier and five sub-groups of 64, 16, 64, 16 and 16 elements on the optimizer tier
// (2-byte gradients as reduced, 12 bytes of fp32 states per element; 10 on NVMe with split
// masters). Both budgets keep every shard and a part of the rest:
//  - 600: then the gradients of the first two sub-groups (128 + 32 bytes); the third's (128)
//    does not fit the 88 left, so it and every state stay on NVMe;
//  - 1200 with the update in backward (its gradients wait in recycled buffers and take none of
//    the budget): then the first sub-group's states (768 bytes, fp32 masters in host memory,
//    640 bytes of split states off NVMe); the second's (192) do not fit the 80 left.
const std::vector<Mode> kModes{
    {"plain"},
    {"update_in_backward", true},
    {"host_memory_budget", false, false, 600, 352 + 160, 352 + 160},
    {"split_master_weights", false, true},
    {"update_in_backward + split_master_weights + host_memory_budget", true, true, 1200, 352 + 768, 352 + 640},
};

Config config_of(const Mode& m, const std::string& dir) {
  Config c = zoe::test::checkpoint_config(3, OffloadDevice::nvme, dir);  // bf16, NVMe under dir/nvme
  c.optimizer.weight_decay = 0.01;
  c.zero_optimization.offload_param.device = OffloadDevice::nvme;
  c.zero_optimization.offload_param.nvme_path = c.zero_optimization.offload_optimizer.nvme_path;
  c.zero_optimization.offload_param.buffer_size = 4096;  // elements: the largest shard fits (1e8 pins 200 MB a buffer)
  c.zero_optimization.stage3_param_persistence_threshold = 0;  // every shard on the tier
  c.zoe.update_in_backward = m.in_backward;
  c.zoe.split_master_weights = m.split;
  c.zoe.host_memory_budget = m.budget;
  return c;
}

}  // namespace

// The budgets keep what kModes says, a part of what they could take, on every rank: otherwise
// the pairs below would test "everything in host memory" or "everything on NVMe".
TEST(CheckpointAcrossModes, TheBudgetsKeepSomeButNotAll) {
  const std::string dir = zoe::test::temp_dir("ckpt-modes-placement");
  std::filesystem::create_directories(dir + "/nvme");
  for (const Mode& m : kModes) {
    if (m.budget == 0) continue;
    SCOPED_TRACE(m.name);
    // Against the same mode without a budget (the update in backward's recycled gradient
    // buffers are host memory outside the budget). One step: the report is filled at the build.
    const Mode without_budget{"", m.in_backward, m.split};
    const RunResult base = train(config_of(without_budget, dir), zoe::test::kCheckpointNet, kWorld, 1, 16);
    const RunResult r = train(config_of(m, dir), zoe::test::kCheckpointNet, kWorld, 1, 16);
    for (int k = 0; k < kWorld; ++k) {
      EXPECT_EQ(r.memory[k].host_model_states - base.memory[k].host_model_states, m.host) << "rank " << k;
      EXPECT_EQ(base.memory[k].nvme_model_states - r.memory[k].nvme_model_states, m.off_nvme) << "rank " << k;
      EXPECT_GT(r.memory[k].nvme_model_states, 0) << "rank " << k << ": everything kept in host memory";
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/nvme")) << "NVMe files left behind";
  std::filesystem::remove_all(dir);
}

// For every ordered pair (A, B), A's checkpoint after k steps loaded into a new engine in mode B
// continues for k steps as the plain run of 2k steps: the same parameters and losses, bit for
// bit. The first k steps of each mode are checked against the plain run too, so a failure says
// whether the mode or the checkpoint moved a bit.
TEST(CheckpointAcrossModes, EveryPairContinuesAsTheUnbrokenPlainRun) {
  const std::string dir = zoe::test::temp_dir("ckpt-modes");
  std::filesystem::create_directories(dir + "/nvme");
  std::vector<double> reference_losses;
  const Params reference = checkpoint_run(config_of(kModes[0], dir), kWorld, 0, 2 * kSteps, "", "",
                                          zoe::test::kCheckpointNet, &reference_losses);
  ASSERT_EQ(reference_losses.size(), static_cast<std::size_t>(2 * kSteps));
  const std::vector<double> first_losses(reference_losses.begin(), reference_losses.begin() + kSteps);
  const std::vector<double> last_losses(reference_losses.begin() + kSteps, reference_losses.end());

  std::vector<std::string> saved;
  Params plain_half;
  for (std::size_t a = 0; a < kModes.size(); ++a) {
    SCOPED_TRACE(std::string("first half in ") + kModes[a].name);
    std::vector<double> losses;
    saved.push_back(dir + "/ckpt-" + std::to_string(a));
    const Params half = checkpoint_run(config_of(kModes[a], dir), kWorld, 0, kSteps, "", saved.back(),
                                       zoe::test::kCheckpointNet, &losses);
    if (a == 0) plain_half = half;
    expect_bitwise(half, plain_half, std::string(kModes[a].name) + " after " + std::to_string(kSteps) + " steps");
    EXPECT_EQ(losses, first_losses);
  }
  // The last k steps move the parameters: a resume that trained nothing could not pass.
  EXPECT_NE(zoe::test::describe_first_difference(plain_half, reference), "none");
  for (std::size_t a = 0; a < kModes.size(); ++a)
    for (std::size_t b = 0; b < kModes.size(); ++b) {
      const std::string pair = std::string(kModes[a].name) + " -> " + kModes[b].name;
      SCOPED_TRACE(pair);
      std::vector<double> losses;
      const Params resumed = checkpoint_run(config_of(kModes[b], dir), kWorld, kSteps, 2 * kSteps, saved[a], "",
                                            zoe::test::kCheckpointNet, &losses);
      expect_bitwise(resumed, reference, pair);
      EXPECT_EQ(losses, last_losses) << pair;
    }
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/nvme")) << "NVMe files left behind";
  std::filesystem::remove_all(dir);
}
