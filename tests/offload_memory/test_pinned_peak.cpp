// Peak pinned host memory with optimizer states on NVMe: after several steps the process has
// held exactly buffer_count staging buffers per rank, each the largest sub-group's states
// (12 bytes/element: master, exp_avg, exp_avg_sq) rounded up to 4096 bytes, and no more
// however large the model. Documented extras: the update pipeline's four one-sub-group staging
// buffers (bf16 gradients and parameters on their way between device and host); otherwise the
// NVMe tier's PinnedPool is the only pinned allocation of an engine (finalize and read_master
// lease one of its buffers). The
// pool's process-wide counters (offload::pinned_stats) are the measurement, counted whether
// mlock succeeded or fell back to pageable memory (RLIMIT_MEMLOCK is 8 MiB here).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "src/offload/pinned_pool.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::train;

namespace {

constexpr int kBufferCount = 4;
constexpr std::int64_t kSubGroupSize = 1000;  // the engine cuts 992 = 1000 rounded down to 16

std::int64_t round_up(std::int64_t v, std::int64_t a) { return (v + a - 1) / a * a; }

// One rank's optimizer elements: per module (a layer: weight in x out, bias out), the
// parameters at 16-element-aligned offsets, padded to 16 x world, divided by world.
std::int64_t shard_elements(const NetSpec& net, int world) {
  std::int64_t total = 0;
  for (std::size_t l = 0; l + 1 < net.widths.size(); ++l) {
    const std::int64_t in = net.widths[l], out = net.widths[l + 1];
    total += round_up(round_up(in * out, 16) + round_up(out, 16), 16 * world) / world;
  }
  return total;
}

Config nvme_config(const std::string& dir) {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = kSubGroupSize;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = kBufferCount;
  return c;
}

class PinnedPeak : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("zoe-pinned-peak-" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// The largest sub-group has 992 elements: its states, 992 x 12 = 11904 bytes, fill a page
// boundary at 12288, then its fp32 gradient (3968 bytes): 16256, rounded up to 16384. One more
// pinned buffer stages gradient writes: 3968 bytes in one 4096-byte page.
constexpr std::size_t kStagingBytes = 16384;
constexpr std::size_t kGradientBuffer = 4096;
// The update pipeline's staging (src/core/update/gradient_sink.hpp, update_pipeline.hpp): two pages
// for bf16 gradients on their way to the tier, two for new bf16 parameters on their way to the
// device (992 x 2 bytes each).
constexpr std::size_t kPipelineStaging = 4 * 4096;
constexpr std::size_t kPinnedPerRank = kBufferCount * kStagingBytes + kGradientBuffer + kPipelineStaging;

}  // namespace

TEST_F(PinnedPeak, OneRankHoldsExactlyBufferCountStagingBuffers) {
  // 64x64 layers: 4160 elements per group, five sub-groups, so the pipeline fills all
  // four buffers (reads of k+1, k+2 in flight while k-1 is written back).
  const NetSpec net{{64, 64, 64, 8}, false, 3};
  ASSERT_EQ(offload::pinned_stats().region_bytes, 0u);
  offload::reset_pinned_peaks();
  RunResult r = train(nvme_config(dir_), net, 1, 6, 8);
  const offload::PinnedStats s = offload::pinned_stats();
  EXPECT_EQ(s.peak_region_bytes, kPinnedPerRank);
  // All four staging buffers are leased at once; the gradient buffer may overlap them or not.
  EXPECT_GE(s.peak_leased_bytes, kBufferCount * kStagingBytes);
  EXPECT_LE(s.peak_leased_bytes, kPinnedPerRank);
  EXPECT_EQ(s.region_bytes, 0u) << "pinned memory left after the engine was destroyed";
  EXPECT_EQ(s.leased_bytes, 0u);
  EXPECT_EQ(r.memory[0].host_buffers, static_cast<std::int64_t>(kPinnedPerRank));
  EXPECT_EQ(r.memory[0].host_pinned_peak, static_cast<std::int64_t>(kPinnedPerRank));
  EXPECT_EQ(r.memory[0].host_model_states, 0);
  // master, exp_avg, exp_avg_sq and the bf16 gradient (one micro-batch: kept as reduced).
  EXPECT_EQ(r.memory[0].nvme_model_states, 14 * shard_elements(net, 1));
  EXPECT_EQ(r.steps.size(), 6u);
  EXPECT_FALSE(r.steps.back().skipped);
}

TEST_F(PinnedPeak, TwoRanksAndAFourTimesLargerModelHoldTheSameBuffersPerRank) {
  // 128 wide: 8256-element shards, nine sub-groups per group; 256 wide: 34.
  for (const NetSpec& net : {NetSpec{{128, 128, 128, 8}, false, 3}, NetSpec{{256, 256, 256, 8}, false, 3}}) {
    offload::reset_pinned_peaks();
    RunResult r = train(nvme_config(dir_), net, 2, 4, 8);
    const offload::PinnedStats s = offload::pinned_stats();
    // Both ranks' pools live in this process; their leases overlap in time by chance.
    EXPECT_EQ(s.peak_region_bytes, 2 * kPinnedPerRank) << "widths " << net.widths[0];
    EXPECT_GE(s.peak_leased_bytes, kBufferCount * kStagingBytes);
    EXPECT_LE(s.peak_leased_bytes, 2 * kPinnedPerRank);
    EXPECT_EQ(s.region_bytes, 0u);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(r.memory[rank].host_buffers, static_cast<std::int64_t>(kPinnedPerRank));
      EXPECT_EQ(r.memory[rank].nvme_model_states, 14 * shard_elements(net, 2));
    }
  }
}

TEST_F(PinnedPeak, ReadsRunAheadAcrossGroupsOfOneSubGroupEach) {
  // 30-wide layers: every group (at most 930 elements) is one sub-group. The update pipeline
  // streams the whole step's sub-groups through one pass, so the first iteration already has
  // all four staging buffers reading (groups 0-3); a pass per group would hold at most two.
  const NetSpec net{{30, 30, 30, 30, 30, 8}, false, 3};
  offload::reset_pinned_peaks();
  RunResult r = train(nvme_config(dir_), net, 1, 3, 8);
  const offload::PinnedStats s = offload::pinned_stats();
  EXPECT_GE(s.peak_leased_bytes, kBufferCount * kStagingBytes);
  EXPECT_EQ(s.peak_region_bytes, kPinnedPerRank);
  EXPECT_EQ(s.region_bytes, 0u);
  EXPECT_FALSE(r.steps.back().skipped);
}
