// An Engine call that fails on one rank makes the other ranks fail within seconds, with an
// error naming that rank and its cause (the Engine aborts its communicator), although the
// collective timeout is 300 s: a CRC32C failure of one rank's NVMe swap file in the middle of
// training, and a parameter initializer that throws on one rank only. The failing rank keeps
// its thread (and its Engine) alive afterwards, so nothing but the abort can release the peer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/core/swap_corruption.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using ::testing::HasSubstr;
using zoe::test::NetSpec;
using zoe::test::TestNet;
using Clock = std::chrono::steady_clock;

namespace {
constexpr double kTimeoutS = 300.0;  // zoe.comm_timeout_s's default: what the peer waited before
constexpr auto kFast = std::chrono::seconds(5);
const NetSpec kNet{{8, 16, 8}, true, 11};

// What each rank saw.
struct Seen {
  std::string what = "(no error)";
  int failed_rank = -2;  // RankFailedError::failed_rank(); -1 for another error
  std::string cause;
  Clock::time_point at{};
};

void record(Seen& seen, const std::exception& e) {
  seen.at = Clock::now();
  seen.what = e.what();
  seen.failed_rank = -1;
  if (auto* r = dynamic_cast<const RankFailedError*>(&e)) {
    seen.failed_rank = r->failed_rank();
    seen.cause = r->cause();
  }
}

// The failed rank stays until its peer has failed too (at most a minute).
void stay_until(const std::atomic<bool>& done) {
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (!done.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

// ZeRO-3 with the optimizer states on NVMe: after step 1, rank 1's swap file loses 16 bytes
// of optim.sg0. Rank 1's next update fails its CRC32C check; rank 0, blocked in a collective
// rank 1 will not issue, throws RankFailedError naming rank 1 and that error in well under
// kFast.
TEST(EngineRankFailure, CrcFailureOnOneRanksSwapFileFailsThePeerFast) {
  const std::string dir = zoe::test::temp_dir("rank-failure-crc");
  Config c;
  c.zero_optimization.stage = 3;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zoe.comm_timeout_s = kTimeoutS;
  c.zero_optimization.sub_group_size = 64;
  c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  auto ranks = make_local_ranks(2, kTimeoutS);
  Seen seen[2];
  std::atomic<int> synchronized{0};
  std::atomic<bool> peer_failed{false};
  std::string damaged;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    net.micro_batch(ctx.rank * 8, 8);
    e.step();
    e.synchronize();  // step 1's update is on disk
    ++synchronized;
    while (synchronized.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ctx.rank == 1) damaged = zoe::test::corrupt_first_swap_tensor(dir, 1);
    try {
      for (int s = 1; s < 20; ++s) {
        net.micro_batch(s * 16 + ctx.rank * 8, 8);
        e.step();
      }
      e.synchronize();
    } catch (const std::exception& err) {
      record(seen[ctx.rank], err);
    }
    if (ctx.rank == 0) peer_failed = true;
    else stay_until(peer_failed);
  });
  EXPECT_THAT(seen[1].what, HasSubstr("NVMe store '" + damaged + "': tensor 'optim.sg0'"));
  EXPECT_THAT(seen[1].what, HasSubstr("failed its CRC32C check"));
  EXPECT_EQ(seen[0].failed_rank, 1) << seen[0].what;
  EXPECT_THAT(seen[0].what, HasSubstr("on rank 0: rank 1 failed: "));
  EXPECT_THAT(seen[0].cause, HasSubstr("tensor 'optim.sg0'"));
  EXPECT_THAT(seen[0].cause, HasSubstr("failed its CRC32C check"));
  EXPECT_LT(seen[0].at - seen[1].at, kFast) << "rank 0 failed " << seconds(seen[0].at - seen[1].at)
                                            << " s after rank 1";
  std::filesystem::remove_all(dir);
}

// A parameter initializer that throws on rank 0 only (at the first forward): rank 1, waiting
// in that forward's all-gather, fails naming rank 0 and the initializer's message.
TEST(EngineRankFailure, InitializerFailureOnOneRankFailsThePeerFast) {
  Config c;
  c.zero_optimization.stage = 3;
  c.zoe.comm_timeout_s = kTimeoutS;
  NetSpec spec = kNet;
  spec.value = [](int, std::int64_t i) { return 0.001f * static_cast<float>(i % 7); };
  spec.by_initializer = true;
  spec.on_init = [](int rank, int, std::int64_t, std::int64_t) {
    if (rank == 0) throw std::runtime_error("injected initializer failure on rank 0");
  };
  auto ranks = make_local_ranks(2, kTimeoutS);
  Seen seen[2];
  std::atomic<bool> peer_failed{false};
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, spec);
    try {
      net.micro_batch(ctx.rank * 8, 8);
      e.step();
    } catch (const std::exception& err) {
      record(seen[ctx.rank], err);
    }
    if (ctx.rank == 1) peer_failed = true;
    else stay_until(peer_failed);
  });
  EXPECT_THAT(seen[0].what, HasSubstr("injected initializer failure on rank 0"));
  EXPECT_EQ(seen[1].failed_rank, 0) << seen[1].what;
  EXPECT_THAT(seen[1].what, HasSubstr("on rank 1: rank 0 failed: begin_forward: "));
  EXPECT_THAT(seen[1].cause, HasSubstr("injected initializer failure on rank 0"));
  EXPECT_LT(seen[1].at - seen[0].at, kFast) << "rank 1 failed " << seconds(seen[1].at - seen[0].at)
                                            << " s after rank 0";
}

// A call-rule UsageError changes nothing and does not abort: the trainer may go on, and both
// ranks still train together afterwards.
TEST(EngineRankFailure, UsageErrorsDoNotAbort) {
  Config c;
  c.zero_optimization.stage = 2;
  c.zoe.comm_timeout_s = 60;
  auto ranks = make_local_ranks(2, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kNet);
    if (ctx.rank == 1) EXPECT_THROW(e.end_forward(ModuleId{0}), UsageError);
    net.micro_batch(ctx.rank * 8, 8);
    EXPECT_NO_THROW(e.step());
  });
}
