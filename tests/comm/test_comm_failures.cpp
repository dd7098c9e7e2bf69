// Failure paths of the host communicators (LocalCommunicator and Gloo's
// HostCommunicator): a rank that never issues a collective makes the others time out with
// an error naming the collective and the missing rank (not a hang); a rank missing at
// rendezvous is listed; mismatched collectives name both sides; bad arguments are usage
// errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/gloo_local_ranks.hpp"
#include "src/comm/host_communicator.hpp"
#include "src/comm/local_communicator.hpp"
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

// Each rank's error (empty if none) from issuing collectives on a stream of its own and
// synchronizing that stream, ranks as threads.
std::vector<std::string> rank_errors(int world, const std::function<void(RankContext&, Stream&)>& issue) {
  auto ranks = make_local_ranks(world, 60.0);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  run_ranks(ranks, [&](RankContext& ctx) {
    auto stream = ctx.device->create_stream();
    issue(ctx, *stream);
    errors[static_cast<std::size_t>(ctx.rank)] = error_of([&] { ctx.device->synchronize(*stream); });
  });
  return errors;
}
}  // namespace

// Both backends: the ranks that issued a collective time out naming it and the rank that
// did not, and their communicators stay unusable afterwards.
TEST(HostCommFailures, MissingRankTimesOutNamingOperationAndRank) {
  HostCommOptions gloo_options;
  gloo_options.timeout = std::chrono::milliseconds(400);
  for (bool local : {true, false}) {
    SCOPED_TRACE(local ? "LocalCommunicator" : "Gloo HostCommunicator");
    auto ranks = local ? make_local_ranks(3, 0.4) : make_gloo_local_ranks(3, gloo_options);
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
}

// A rank that arrives after its peer gave up fails at once, quoting the peer's failure,
// instead of waiting for a peer that will never come (and no peer reads its buffers).
TEST(LocalCommFailures, LateRankFailsFastAfterPeerTimedOut) {
  auto ranks = make_local_ranks(2, 0.3);
  std::atomic<bool> rank0_failed{false};
  std::string late_error;
  run_ranks(ranks, [&](RankContext& ctx) {
    auto stream = ctx.device->create_stream();
    std::vector<float> send(4, 1.0f), recv(8);
    if (ctx.rank == 1)
      while (!rank0_failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ctx.comm->all_gather(send.data(), recv.data(), 4, DType::f32, *stream);
    std::string error;
    try {
      ctx.device->synchronize(*stream);
    } catch (const TimeoutError& e) {  // the late rank's too: its collective cannot complete
      error = e.what();
    }
    if (ctx.rank == 0) {
      EXPECT_THAT(error, HasSubstr("all_gather (collective #0) on rank 0 timed out after 0.3 s waiting for rank 1"));
      rank0_failed = true;
    } else {
      late_error = error;
    }
  });
  EXPECT_THAT(late_error, HasSubstr("all_gather (collective #0) on rank 1: the group failed earlier"));
  EXPECT_THAT(late_error, HasSubstr("waiting for rank 1")) << "quotes rank 0's timeout";
}

// Grouped collectives whose parts differ between ranks (the same total) fail on every rank
// naming both sides' parts; a part whose buffers overlap other than in place is refused when
// issued, before any peer could read it.
TEST(LocalCommFailures, GroupedPartsThatDifferNameBoth) {
  std::vector<std::vector<float>> a(2, std::vector<float>(16)), b(2, std::vector<float>(32));  // per rank
  const auto errors = rank_errors(2, [&](RankContext& ctx, Stream& stream) {
    float* x = a[ctx.rank].data();
    float* y = b[ctx.rank].data();
    const std::vector<GroupedPart> parts = ctx.rank == 0 ? std::vector<GroupedPart>{{x, y, 3}, {x + 3, y + 6, 5}}
                                                         : std::vector<GroupedPart>{{x, y, 5}, {x + 5, y + 10, 3}};
    ctx.comm->all_gather_grouped(parts, DType::f32, stream);
  });
  for (const auto& e : errors)
    EXPECT_THAT(e, HasSubstr("rank 0 issued all_gather_grouped (collective #0, count 8 in 2 parts of 3, 5, fp32) but "
                             "rank 1 issued all_gather_grouped (collective #0, count 8 in 2 parts of 5, 3, fp32)")) << e;
  auto one = make_local_ranks(2, 60.0);
  run_ranks(one, [&](RankContext& ctx) {
    auto stream = ctx.device->create_stream();
    std::vector<float> a(16);
    const std::vector<GroupedPart> overlapping = {{a.data() + 1, a.data(), 4}};  // not this rank's block
    EXPECT_THAT(error_of([&] { ctx.comm->all_gather_grouped(overlapping, DType::f32, *stream); }),
                HasSubstr("all_gather_grouped: part 0's send and recv buffers overlap (only the in-place layout may)"));
    const std::vector<GroupedPart> in_place = {{a.data(), a.data() + 4 * ctx.rank, 4}};  // recv is this rank's slice
    ctx.comm->reduce_scatter_grouped(in_place, DType::f32, ReduceOp::sum, *stream);
    ctx.device->synchronize(*stream);
  });
}

// Different collectives, or different counts, at the same position: every rank throws a
// CommError naming both, at once (no timeout).
TEST(LocalCommFailures, MismatchedCollectivesNameBoth) {
  {
    std::vector<std::vector<float>> a(2, std::vector<float>(8)), b(2, std::vector<float>(8));  // per rank
    const auto errors = rank_errors(2, [&](RankContext& ctx, Stream& stream) {
      if (ctx.rank == 0) ctx.comm->all_gather(a[0].data(), b[0].data(), 4, DType::f32, stream);
      else ctx.comm->reduce_scatter(a[1].data(), b[1].data(), 4, DType::bf16, ReduceOp::avg, stream);
    });
    for (const auto& e : errors) {
      EXPECT_THAT(e, HasSubstr("mismatched collectives: rank 0 issued all_gather (collective #0, count 4, fp32) but "
                               "rank 1 issued reduce_scatter (collective #0, count 4, bf16, avg)")) << e;
    }
  }
  {
    auto ranks = make_local_ranks(3, 60.0);
    std::vector<std::string> errors(3);
    run_ranks(ranks, [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      std::vector<float> a(64);
      ctx.comm->barrier(*stream);
      ctx.comm->all_reduce(a.data(), a.data(), ctx.rank == 2 ? 5 : 6, DType::f32, ReduceOp::sum, *stream);
      errors[ctx.rank] = error_of([&] { ctx.device->synchronize(*stream); });
      // Later collectives fail at once too.
      ctx.comm->barrier(*stream);
      EXPECT_THAT(error_of([&] { ctx.device->synchronize(*stream); }), HasSubstr("mismatched collectives"));
    });
    for (const auto& e : errors) {
      EXPECT_THAT(e, HasSubstr("issued all_reduce (collective #1, count 6, fp32, sum) but rank 2 issued all_reduce "
                               "(collective #1, count 5, fp32, sum)")) << e;
    }
  }
}

// Same shape, different tags (two groups' gradients of one size): both host backends refuse
// to pair them, on every rank, naming both tags; equal tags pair and reduce as usual.
TEST(CommFailures, DifferentTagsNeverPairOnEitherHostBackend) {
  for (bool gloo : {false, true}) {
    HostCommOptions o;
    o.timeout = std::chrono::milliseconds(5000);
    auto ranks = gloo ? make_gloo_local_ranks(2, o) : make_local_ranks(2, 5.0);
    std::vector<std::string> errors(2);
    std::vector<std::vector<float>> sums(2);
    run_ranks(ranks, [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      auto tag = [&](int group) {
        CollectiveTag t;
        t.kind = CollectiveTag::Kind::grads;
        t.group = group;
        t.step = 3;
        t.micro_batch = 0;
        t.label = group == 0 ? "gradients of 'A'" : "gradients of 'B'";
        return t;
      };
      std::vector<float> a(4, 1.0f + ctx.rank);
      ctx.comm->tag_next(tag(0));
      ctx.comm->all_reduce(a.data(), a.data(), 4, DType::f32, ReduceOp::sum, *stream);
      ctx.device->synchronize(*stream);
      sums[ctx.rank] = a;
      ctx.comm->tag_next(tag(ctx.rank));  // rank 0: A, rank 1: B
      ctx.comm->all_reduce(a.data(), a.data(), 4, DType::f32, ReduceOp::sum, *stream);
      errors[ctx.rank] = error_of([&] { ctx.device->synchronize(*stream); });
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(sums[r], std::vector<float>(4, 3.0f)) << "equal tags must pair";
      EXPECT_THAT(errors[r], HasSubstr("mismatched collectives: rank 0 issued all_reduce (collective #1, count 4, fp32, "
                                       "sum, gradients of 'A', step 3, micro-batch 0) but rank 1 issued all_reduce "
                                       "(collective #1, count 4, fp32, sum, gradients of 'B', step 3, micro-batch 0)"))
          << (gloo ? "gloo" : "local");
    }
  }
}

TEST(LocalCommFailures, OneCommunicatorPerRank) {
  auto group = make_local_group(2, std::chrono::milliseconds(1000));
  auto device = std::make_shared<HostDevice>();
  LocalCommunicator first(device, group, 1);
  EXPECT_THROW(LocalCommunicator(device, group, 1), UsageError);
  EXPECT_THROW(LocalCommunicator(device, group, 2), UsageError);
  EXPECT_THROW(make_local_group(0, std::chrono::milliseconds(1000)), UsageError);
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
