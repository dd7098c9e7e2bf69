// Optimizer offload to host memory and NVMe: the same parameters, bit for bit, as the run
// without offload, for stages 1-3 and world sizes 1, 2 and 4; accounting per tier; files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>

#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::bitwise_equal;
using zoe::test::train;

namespace {

std::string temp_dir(const std::string& tag) { return zoe::test::temp_dir("offload-" + tag); }

Config config(int stage, OffloadDevice offload, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = 64;  // several sub-groups per group: the pipeline runs
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  return c;
}

const NetSpec kNet{{16, 32, 32, 8}, true, 5};

}  // namespace

class OptimizerOffload : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(OptimizerOffload, TwentyStepsBitwiseEqualToNoOffload) {
  auto [stage, world] = GetParam();
  std::string dir = temp_dir("eq");
  RunResult ref = train(config(stage, OffloadDevice::none, dir), kNet, world, 20, 16);
  for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    RunResult r = train(config(stage, d, dir), kNet, world, 20, 16);
    EXPECT_TRUE(bitwise_equal(r, ref)) << "offload " << (d == OffloadDevice::cpu ? "cpu" : "nvme") << " stage "
                                       << stage << " world " << world;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Engine, OptimizerOffload,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 4)));

TEST(OptimizerOffload, FourMicroBatchesEqualTheNoOffloadReference) {
  std::string dir = temp_dir("gas");
  Config none = config(3, OffloadDevice::none, dir);
  none.gradient_accumulation_steps = 4;
  Config nvme = none;
  nvme.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  EXPECT_TRUE(bitwise_equal(train(nvme, kNet, 2, 5, 32), train(none, kNet, 2, 5, 32)));
  std::filesystem::remove_all(dir);
}

TEST(OptimizerOffload, StatesAreAccountedPerTier) {
  std::string dir = temp_dir("acct");
  const int world = 2;
  RunResult none = train(config(3, OffloadDevice::none, dir), kNet, world, 1, 16);
  RunResult cpu = train(config(3, OffloadDevice::cpu, dir), kNet, world, 1, 16);
  RunResult nvme = train(config(3, OffloadDevice::nvme, dir), kNet, world, 1, 16);
  for (int r = 0; r < world; ++r) {
    // Without offload the device holds 12 bytes/element of states and the 2-byte bf16
    // gradient shard; with it, the tier holds the states and, one micro-batch per step, the
    // bf16 gradient shard as reduced (14 bytes).
    const std::int64_t moved = none.memory[r].device_model_states - cpu.memory[r].device_model_states;
    ASSERT_EQ(moved % 14, 0);
    const std::int64_t elements = moved / 14;
    EXPECT_GT(elements, 0);
    EXPECT_EQ(cpu.memory[r].host_model_states, 14 * elements);
    EXPECT_EQ(nvme.memory[r].nvme_model_states, 14 * elements);
    EXPECT_EQ(nvme.memory[r].host_model_states, 0);
    // Host memory holds only the staging buffers: buffer_count x (the largest sub-group's
    // states, 64 x 12 bytes in a page, then its bf16 gradient in the next page) plus one
    // gradient page; the update pipeline's two pages for bf16 gradients on their way to the
    // tier and two for new bf16 parameters on their way to the device (64 x 2 bytes each).
    EXPECT_EQ(nvme.memory[r].host_buffers, 3 * 8192 + 4096 + 4 * 4096);
    EXPECT_EQ(cpu.memory[r].host_buffers, 4 * 4096);
    EXPECT_EQ(nvme.memory[r].device_model_states, cpu.memory[r].device_model_states);
  }
  std::filesystem::remove_all(dir);
}

// zoe.pinned_budget_bytes bounds every pinned consumer of a rank together: the NVMe tier's
// staging, the update pipeline's and the gradient sink's. Each pool alone fits a budget one byte
// short of their sum, so only a shared budget refuses it.
TEST(OptimizerOffload, PinnedBudgetBoundsAllPoolsTogether) {
  std::string dir = temp_dir("budget");
  Config c = config(3, OffloadDevice::nvme, dir);
  RunResult free_run = train(c, kNet, 1, 3, 16);
  const std::int64_t pinned = free_run.memory[0].host_pinned_peak;
  EXPECT_EQ(pinned, 3 * 8192 + 4096 + 4 * 4096);  // as StatesAreAccountedPerTier counts them
  c.zoe.pinned_budget_bytes = pinned;
  EXPECT_TRUE(bitwise_equal(train(c, kNet, 1, 3, 16), free_run));
  c.zoe.pinned_budget_bytes = pinned - 1;
  try {
    train(c, kNet, 1, 3, 16);
    ADD_FAILURE() << "a budget of " << pinned - 1 << " bytes was accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zoe.pinned_budget_bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget of " + std::to_string(pinned - 1) + " bytes"), std::string::npos) << what;
  }
  std::filesystem::remove_all(dir);
}

TEST(OptimizerOffload, TwoEnginesOnOneNvmePathDoNotClobberEachOther) {
  std::string dir = temp_dir("two");
  Config c = config(2, OffloadDevice::nvme, dir);
  RunResult ref = train(config(2, OffloadDevice::none, dir), kNet, 2, 10, 16);
  // Futures, not bare threads: an engine error fails the test instead of aborting the binary.
  auto fa = std::async(std::launch::async, [&] { return train(c, kNet, 2, 10, 16); });
  auto fb = std::async(std::launch::async, [&] { return train(c, kNet, 2, 10, 16); });
  fa.wait();
  fb.wait();
  RunResult a = fa.get(), b = fb.get();
  EXPECT_TRUE(bitwise_equal(a, ref));
  EXPECT_TRUE(bitwise_equal(b, ref));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// offload_optimizer.ratio < 1: the first sub-groups stay on the device optimizer, the rest on
// the CPU optimizer; the two are the same math, so the parameters are those of no offload.
TEST(OptimizerOffload, PartialRatioSplitsSubGroupsAndKeepsTheBits) {
  std::string dir = temp_dir("ratio");
  const int world = 2;
  for (int stage : {1, 2, 3}) {
    RunResult ref = train(config(stage, OffloadDevice::none, dir), kNet, world, 20, 16);
    Config all_cpu = config(stage, OffloadDevice::cpu, dir);
    RunResult full = train(all_cpu, kNet, world, 1, 16);
    RunResult none = train(config(stage, OffloadDevice::none, dir), kNet, world, 1, 16);
    for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
      Config c = config(stage, d, dir);
      c.zero_optimization.offload_optimizer.ratio = 0.5;
      RunResult r = train(c, kNet, world, 20, 16);
      EXPECT_TRUE(bitwise_equal(r, ref)) << "ratio 0.5, stage " << stage;
      for (int k = 0; k < world; ++k) {
        // The states of the device sub-groups stay on the device (12 bytes/element), the
        // offloaded ones move with their bf16 gradient (one micro-batch: 14 bytes/element); at stages 2-3 a group
        // with a device sub-group also keeps its 2-byte gradient shard on the device.
        const std::int64_t grad_shard = stage >= 2 ? 2 : 0;
        const std::int64_t moved = none.memory[k].device_model_states - full.memory[k].device_model_states;
        ASSERT_EQ(moved % (12 + grad_shard), 0);
        const std::int64_t shard = moved / (12 + grad_shard);
        const std::int64_t offloaded = d == OffloadDevice::cpu ? r.memory[k].host_model_states
                                                                : r.memory[k].nvme_model_states;
        ASSERT_EQ(offloaded % 14, 0);
        const std::int64_t on_device = shard - offloaded / 14;  // elements
        const std::int64_t device_extra = r.memory[k].device_model_states - full.memory[k].device_model_states;
        EXPECT_GT(on_device, 0) << "some sub-groups stay on the device";
        EXPECT_GT(offloaded, 0) << "some sub-groups are offloaded";
        EXPECT_GE(device_extra, 12 * on_device) << "stage " << stage << " rank " << k;
        EXPECT_LE(device_extra, 12 * on_device + grad_shard * shard) << "stage " << stage << " rank " << k;
        EXPECT_EQ((device_extra - 12 * on_device) % 32, 0);  // whole 16-element bf16 shards
      }
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// fp16 compute, one micro-batch per step: the tier keeps the reduced fp16 gradient shard as it
// arrived (2 bytes per element, widened exactly by the update) instead of an fp32 copy. The
// parameters, losses, norms, loss scales and skipped steps are those of the device optimizer,
// bit for bit, at stages 2-3 and 1-2 ranks, with the same dynamic loss scaling in both runs:
// 2^8 to start, doubled every 3 good steps, halved at the first overflow (the poisoned step 4,
// whose inf reaches the tier in fp16 and must skip it there too).
TEST(OptimizerOffload, Fp16OneMicroBatchKeepsTheReducedGradientExactly) {
  std::string dir = temp_dir("fp16");
  auto fp16 = [&](int stage, OffloadDevice d) {
    Config c = config(stage, d, dir);
    c.bf16.enabled = false;
    c.fp16.enabled = true;
    c.fp16.initial_scale_power = 8;
    c.fp16.loss_scale_window = 3;
    c.fp16.hysteresis = 1;
    return c;
  };
  constexpr int kPoisoned = 4;
  for (int stage : {2, 3})
    for (int world : {1, 2}) {
      const std::string what = "stage " + std::to_string(stage) + " world " + std::to_string(world);
      SCOPED_TRACE(what);
      const RunResult ref = train(fp16(stage, OffloadDevice::none), kNet, world, 10, 16, kPoisoned);
      // The reference does what the comment says: its loss scale moved both ways and it took
      // all but the poisoned step.
      ASSERT_EQ(ref.steps.size(), 10u);
      EXPECT_EQ(ref.steps[0].loss_scale, 256.0);
      EXPECT_EQ(ref.steps[3].loss_scale, 512.0);
      EXPECT_TRUE(ref.steps[kPoisoned].skipped);
      EXPECT_EQ(ref.steps[kPoisoned + 1].loss_scale, ref.steps[kPoisoned].loss_scale / 2);
      int skipped = 0;
      for (const StepResult& st : ref.steps) skipped += st.skipped ? 1 : 0;
      EXPECT_EQ(skipped, 1);
      EXPECT_FALSE(bitwise_equal(ref, train(fp16(stage, OffloadDevice::none), kNet, world, 0, 16)))
          << "the run must change the parameters";
      RunResult by_tier[2];
      for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
        const char* tier = d == OffloadDevice::cpu ? "cpu" : "nvme";
        const RunResult r = train(fp16(stage, d), kNet, world, 10, 16, kPoisoned);
        EXPECT_TRUE(bitwise_equal(r, ref))
            << tier << ": first difference: " << zoe::test::describe_first_difference(r.params, ref.params);
        EXPECT_EQ(r.losses, ref.losses) << tier;
        ASSERT_EQ(r.steps.size(), ref.steps.size()) << tier;
        for (std::size_t i = 0; i < r.steps.size(); ++i) {
          EXPECT_EQ(r.steps[i].skipped, ref.steps[i].skipped) << tier << " step " << i;
          EXPECT_EQ(r.steps[i].loss_scale, ref.steps[i].loss_scale) << tier << " step " << i;
          if (!ref.steps[i].skipped) EXPECT_EQ(r.steps[i].grad_norm, ref.steps[i].grad_norm) << tier << " step " << i;
        }
        by_tier[d == OffloadDevice::cpu ? 0 : 1] = r;
      }
      for (int k = 0; k < world; ++k) {
        // 12 bytes of states and the 2-byte fp16 gradient per element leave the device for the
        // tier (an fp32 gradient there would make it 16).
        const std::int64_t moved = ref.memory[k].device_model_states - by_tier[0].memory[k].device_model_states;
        ASSERT_EQ(moved % 14, 0) << "rank " << k;
        EXPECT_GT(moved, 0) << "rank " << k;
        EXPECT_EQ(by_tier[0].memory[k].host_model_states, moved) << "rank " << k;
        EXPECT_EQ(by_tier[1].memory[k].nvme_model_states, moved) << "rank " << k;
        EXPECT_EQ(by_tier[1].memory[k].host_model_states, 0) << "rank " << k;
      }
    }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

// The offloaded fp32 gradients carry the norm, the overflow check and clipping: with a poisoned
// (inf) step and clipping on, offload to host or NVMe equals the device run bit for bit, also
// with 3 micro-batches accumulating in fp32.
TEST(OptimizerOffload, OffloadedGradientsGiveTheSameNormOverflowAndClipping) {
  std::string dir = temp_dir("grads");
  for (int gas : {1, 3}) {
    Config none = config(2, OffloadDevice::none, dir);
    none.gradient_clipping = 0.05;
    none.gradient_accumulation_steps = gas;
    const RunResult ref = train(none, kNet, 2, 8, 12 * gas, 3);
    int skipped = 0;
    for (const StepResult& st : ref.steps) skipped += st.skipped ? 1 : 0;
    EXPECT_EQ(skipped, 1) << "the poisoned step is skipped";
    EXPECT_LT(ref.steps[0].clip_coef, 1.0) << "clipping is active, norm " << ref.steps[0].grad_norm;
    for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
      Config c = none;
      c.zero_optimization.offload_optimizer.device = d;
      const RunResult r = train(c, kNet, 2, 8, 12 * gas, 3);
      EXPECT_TRUE(bitwise_equal(r, ref)) << "gas " << gas << " offload " << static_cast<int>(d);
      ASSERT_EQ(r.steps.size(), ref.steps.size());
      for (std::size_t i = 0; i < r.steps.size(); ++i) {
        EXPECT_EQ(r.steps[i].skipped, ref.steps[i].skipped) << i;
        EXPECT_EQ(r.steps[i].grad_norm, ref.steps[i].grad_norm) << "step " << i;
        EXPECT_EQ(r.steps[i].clip_coef, ref.steps[i].clip_coef) << "step " << i;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// The tier's gradient add runs CpuAdam::add_grad in the optimizer's arena (zoe.optimizer_threads),
// on the gradient sink's I/O worker, beside the update pipeline's step of other groups. With 2
// threads and sub-groups of several 32768-element add_grad blocks (so the add is split over the
// threads), with clipping and 2 accumulated micro-batches (cast, then fp32 add), host and NVMe
// offload still equal the device optimizer bit for bit, norms included.
TEST(OptimizerOffload, MultithreadedGradientAddKeepsTheBits) {
  std::string dir = temp_dir("mt");
  const NetSpec wide{{256, 320, 256, 8}, false, 7};  // 81920 + 81920 + ... elements per weight
  for (int gas : {1, 2}) {
    Config none = config(3, OffloadDevice::none, dir);
    none.zoe.optimizer_threads = 2;
    none.zero_optimization.sub_group_size = 70000;  // 2 sub-groups per large shard, 3 blocks each
    none.gradient_clipping = 0.1;
    none.gradient_accumulation_steps = gas;
    const RunResult ref = train(none, wide, 1, 6, 8 * gas);
    EXPECT_LT(ref.steps[0].clip_coef, 1.0) << "clipping is active, norm " << ref.steps[0].grad_norm;
    for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
      Config c = none;
      c.zero_optimization.offload_optimizer.device = d;
      const RunResult r = train(c, wide, 1, 6, 8 * gas);
      EXPECT_TRUE(bitwise_equal(r, ref)) << "gas " << gas << " offload " << static_cast<int>(d);
      ASSERT_EQ(r.steps.size(), ref.steps.size());
      for (std::size_t i = 0; i < r.steps.size(); ++i) {
        EXPECT_EQ(r.steps[i].grad_norm, ref.steps[i].grad_norm) << "gas " << gas << " step " << i;
        EXPECT_EQ(r.steps[i].clip_coef, ref.steps[i].clip_coef) << "gas " << gas << " step " << i;
      }
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}
