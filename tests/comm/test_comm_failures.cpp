// Failure paths of the host communicator: a rank that never issues a collective makes
// the others time out with an error naming the collective and the missing rank (not a
// hang); a rank missing at rendezvous is listed; bad arguments are usage errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/comm/host_communicator.hpp"
#include "src/device/host_device.hpp"
#include "zoe/engine.hpp"

using namespace zoe;
using ::testing::HasSubstr;

namespace {
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(HostCommFailures, MissingRankTimesOutNamingOperationAndRank) {
  auto ranks = make_local_ranks(3, 0.4);
  std::vector<std::string> errors(3);
  run_ranks(ranks, [&](RankContext& ctx) {
    if (ctx.rank == 2) return;  // rank 2 never issues the collective
    auto stream = ctx.device->create_stream();
    std::vector<float> send(2 * 3), recv(2);
    ctx.comm->reduce_scatter(send.data(), recv.data(), 2, DType::f32, ReduceOp::sum, *stream);
    try {
      ctx.device->synchronize(*stream);
    } catch (const TimeoutError& e) {
      errors[ctx.rank] = e.what();
    }
    // The communicator is unusable afterwards, and says why.
    ctx.comm->barrier(*stream);
    std::string later = error_of([&] { ctx.device->synchronize(*stream); });
    EXPECT_THAT(later, HasSubstr("unusable after an earlier failure"));
    EXPECT_THAT(later, HasSubstr("reduce_scatter"));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("reduce_scatter")) << errors[r];
    EXPECT_THAT(errors[r], HasSubstr("rank 2")) << errors[r];
    EXPECT_THAT(errors[r], HasSubstr("timed out after 0.4 s")) << errors[r];
  }
}

TEST(HostCommFailures, RankMissingAtRendezvousIsListed) {
  auto store = std::make_shared<InMemoryStore>();
  HostCommOptions options;
  options.timeout = std::chrono::milliseconds(300);
  std::string error = error_of([&] {
    HostCommunicator comm(std::make_shared<HostDevice>(), store, 0, 3, options);
  });
  EXPECT_THAT(error, HasSubstr("2 rank(s) did not arrive within 0.3 s: rank(s) 1, 2")) << error;
}

TEST(HostCommFailures, BadArguments) {
  EXPECT_THROW(make_local_ranks(0), UsageError);
  EXPECT_THROW(make_local_ranks(2, -1.0), UsageError);
  auto ranks = make_local_ranks(2, 10.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    auto s = ctx.device->create_stream();
    float x = 0;
    EXPECT_THROW(ctx.comm->broadcast(&x, 1, DType::f32, 2, *s), UsageError);
  });
  EXPECT_THROW(run_ranks(ranks, [](RankContext& ctx) {
                 if (ctx.rank == 1) throw IoError("/f", 0, 1, 5, "read", __FILE__, __LINE__);
               }),
               IoError);
}
