// A rank that fails (Communicator::abort) makes its peers fail fast: on both host backends
// (LocalCommunicator; Gloo's HostCommunicator, whose side channel is the rendezvous store) a
// peer blocked in a collective throws RankFailedError naming the failed rank and its cause in
// well under a second, although the collective timeout is 300 s; later collectives fail at
// once; the root cause is never overwritten by a peer's RankFailedError; run_ranks aborts for
// a rank whose function throws and rethrows that rank's exception, not its peers'.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/gloo_local_ranks.hpp"
#include "src/comm/rank_failure.hpp"
#include "zoe/engine.hpp"

using namespace zoe;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

namespace {
constexpr double kTimeoutS = 300.0;  // what a peer would wait without the abort
// A peer must learn of the failure within this (the store is read every 100 ms).
constexpr auto kFast = std::chrono::seconds(5);

std::vector<RankContext> ranks_of(bool gloo, int world) {
  if (!gloo) return make_local_ranks(world, kTimeoutS);
  HostCommOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<long long>(kTimeoutS * 1000));
  return make_gloo_local_ranks(world, o);
}

struct Outcome {
  std::string what = "(no error)";
  int failed_rank = -2;  // RankFailedError::failed_rank(), -1 for another error
  std::string cause;
  Clock::duration after_abort{};  // from the abort to this rank's error
};
}  // namespace

// Rank 1 aborts while ranks 0 and 2 wait in an all_reduce it never issues: both throw
// RankFailedError naming rank 1 and the cause within kFast; rank 1's own later collective
// throws CommError saying it aborted; the peers' later collectives fail at once too.
TEST(RankFailure, PeersBlockedInACollectiveFailFastNamingTheRankAndCause) {
  for (bool gloo : {false, true}) {
    SCOPED_TRACE(gloo ? "Gloo HostCommunicator" : "LocalCommunicator");
    auto ranks = ranks_of(gloo, 3);
    std::vector<Outcome> out(3);
    std::atomic<int> waiting{0};
    std::atomic<long long> aborted_at{0};
    const std::string cause = "NVMe store '/x/zoe-rank1.swap': tensor 'optim.sg0' failed its CRC32C check";
    run_ranks(ranks, [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      std::vector<float> buf(1000, 1.0f);
      if (ctx.rank == 1) {
        while (waiting.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the peers are blocked now
        aborted_at = Clock::now().time_since_epoch().count();
        ctx.comm->abort(cause);
        ctx.comm->barrier(*stream);
        try {
          ctx.device->synchronize(*stream);
        } catch (const CommError& e) {
          out[1].what = e.what();
        }
        return;
      }
      ctx.comm->all_reduce(buf.data(), buf.data(), buf.size(), DType::f32, ReduceOp::sum, *stream);
      ++waiting;
      try {
        ctx.device->synchronize(*stream);
      } catch (const RankFailedError& e) {
        out[ctx.rank].after_abort = Clock::now() - Clock::time_point(Clock::duration(aborted_at.load()));
        out[ctx.rank] = {e.what(), e.failed_rank(), e.cause(), out[ctx.rank].after_abort};
      } catch (const std::exception& e) {
        out[ctx.rank].what = e.what();
        out[ctx.rank].failed_rank = -1;
      }
      // The communicator is unusable afterwards, and says why.
      auto t0 = Clock::now();
      ctx.comm->barrier(*stream);
      std::string later;
      try {
        ctx.device->synchronize(*stream);
      } catch (const std::exception& e) {
        later = e.what();
      }
      EXPECT_LT(Clock::now() - t0, kFast);
      EXPECT_THAT(later, HasSubstr("rank 1 failed: " + cause)) << later;
    });
    for (int r : {0, 2}) {
      EXPECT_EQ(out[r].failed_rank, 1) << out[r].what;
      EXPECT_EQ(out[r].cause, cause);
      EXPECT_THAT(out[r].what, HasSubstr("all_reduce (collective #0) on rank " + std::to_string(r) +
                                         ": rank 1 failed: " + cause))
          << out[r].what;
      EXPECT_LT(out[r].after_abort, kFast)
          << std::chrono::duration<double>(out[r].after_abort).count() << " s after the abort";
    }
    EXPECT_THAT(out[1].what, HasSubstr("barrier (collective #0) on rank 1: this rank aborted the communicator: " + cause))
        << out[1].what;
  }
}

// A peer that joins a collective only after the failure fails at once as well; a second
// abort (the peer's own, after its RankFailedError) does not replace the root cause.
TEST(RankFailure, LaterCollectivesAndSecondAbortsKeepTheFirstCause) {
  for (bool gloo : {false, true}) {
    SCOPED_TRACE(gloo ? "Gloo HostCommunicator" : "LocalCommunicator");
    auto ranks = ranks_of(gloo, 2);
    std::atomic<bool> aborted{false};
    std::vector<std::string> errors(2);
    run_ranks(ranks, [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      float x = 1.0f;
      if (ctx.rank == 0) {
        ctx.comm->abort("the root cause");
        aborted = true;
        return;
      }
      while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      // Gloo learns it through the store: wait until the watcher has read it.
      std::this_thread::sleep_for(std::chrono::milliseconds(gloo ? 400 : 0));
      auto t0 = Clock::now();
      ctx.comm->all_gather(&x, &x, 1, DType::f32, *stream);
      try {
        ctx.device->synchronize(*stream);
      } catch (const std::exception& e) {
        errors[1] = e.what();
      }
      EXPECT_LT(Clock::now() - t0, kFast);
      ctx.comm->abort(errors[1]);  // what the Engine does with its RankFailedError
    });
    EXPECT_THAT(errors[1], HasSubstr("on rank 1: rank 0 failed: the root cause")) << errors[1];
  }
}

// run_ranks: a rank whose function throws aborts its communicator, so the others do not wait
// for it; the rank's own exception is rethrown, not the peers' RankFailedError (rank 0 comes
// first by index, and its error is only the consequence).
TEST(RankFailure, RunRanksAbortsForAThrowingRankAndRethrowsItsError) {
  for (bool gloo : {false, true}) {
    SCOPED_TRACE(gloo ? "Gloo HostCommunicator" : "LocalCommunicator");
    auto ranks = ranks_of(gloo, 2);
    std::string peer_error;
    auto t0 = Clock::now();
    try {
      run_ranks(ranks, [&](RankContext& ctx) {
        if (ctx.rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw std::runtime_error("rank 1's trainer threw");
        }
        auto stream = ctx.device->create_stream();
        float x = 1.0f;
        ctx.comm->all_reduce(&x, &x, 1, DType::f32, ReduceOp::sum, *stream);
        try {
          ctx.device->synchronize(*stream);
        } catch (const RankFailedError& e) {
          peer_error = e.what();
          throw;
        }
      });
      ADD_FAILURE() << "run_ranks did not throw";
    } catch (const RankFailedError& e) {
      ADD_FAILURE() << "rethrew the peer's error: " << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "rank 1's trainer threw");
    }
    EXPECT_LT(Clock::now() - t0, kFast);
    EXPECT_THAT(peer_error, HasSubstr("rank 1 failed: rank 1's trainer threw")) << peer_error;
  }
}

TEST(RankFailure, LongCausesAreCut) {
  std::string cause(10000, 'x');
  std::string cut = cut_cause(cause);
  EXPECT_EQ(cut, std::string(kMaxCauseChars, 'x') + "... (6000 more characters)");
  EXPECT_EQ(cut_cause("short"), "short");
}
