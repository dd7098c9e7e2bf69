// DeepSpeed's communication keys do what DeepSpeed's do: reduce_bucket_size sets
// how many gradient collectives a step issues (consecutive groups reduced together), stage 3
// fetches all-gather a module's groups in one collective and the prefetched groups in one
// more (stage3_prefetch_bucket_size), allgather_bucket_size splits the stage 1-2 gather of an
// updated shard (and bounds the groups gathered together), overlap_comm false makes backward wait for the reduction; bytes and results
// stay bitwise those of the unbucketed run. Ranks are threads (local communicator).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/communicator.hpp"
#include "tests/core/forwarding_communicator.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::bitwise_equal;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::train;

namespace {

// Three layers 64 -> 64: groups of 64·64 + 64 = 4160 elements each, a multiple of 16 × 2, so
// no padding at world size 2. Backward completes them in the order l2, l1, l0.
constexpr std::int64_t kGroup = 64 * 64 + 64;
NetSpec three_layers() { return NetSpec{{64, 64, 64, 64}, false, 5}; }

Config config(int stage, std::int64_t reduce_bucket_size, int gas = 1) {
  Config c;
  c.zero_optimization.stage = stage;
  c.gradient_accumulation_steps = gas;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zero_optimization.reduce_bucket_size = reduce_bucket_size;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  c.zoe.comm_timeout_s = 30;
  return c;
}

std::int64_t gradient_calls(const TrafficReport& t, int stage) {
  return stage == 0 ? t.all_reduce_calls : t.reduce_scatter_calls;
}
std::int64_t gradient_bytes(const TrafficReport& t, int stage) {
  return stage == 0 ? t.all_reduce_bytes : t.reduce_scatter_bytes;
}

struct BucketCase {
  std::int64_t size;
  int collectives;  // per round of l2, l1, l0
};
// DeepSpeed's rule: the bucket is reduced before a group that would take it past the size
// joins; 0 makes every group a bucket of its own.
const std::vector<BucketCase> kCases = {{kGroup, 3},  {2 * kGroup - 1, 3}, {2 * kGroup, 2},
                                        {3 * kGroup, 1}, {500'000'000, 1}};

// The ranks' communicator without its in-place grouped collectives (as NCCL and Gloo run
// them): the engine then packs a coalesced gather or a bucket into one buffer.
void packing(RankContext& r) {
  r.comm = std::make_shared<test::ForwardingCommunicator>(r.comm, test::ForwardingCommunicator::Tags::kept);
}

}  // namespace

// A coalesced all-gather and a bucket of several groups reduce in place (ranks as threads:
// each part straight between the groups' own buffers) or packed through one buffer (NCCL,
// Gloo) with the same bits, collectives and bytes; in place holds no staging buffers, so its
// device peak is lower at stage 3. Stages 2-3, one and two micro-batches (the shards land in
// the gradient shards or are accumulated), with and without offloaded sub-groups.
TEST(Buckets, InPlaceAndPackedGroupingAgreeBitwise) {
  for (int stage : {2, 3}) {
    for (int gas : {1, 2}) {
      for (bool offload : {false, true}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + " gas " + std::to_string(gas) + (offload ? " offloaded" : ""));
        Config c = config(stage, 500'000'000, gas);
        if (offload) {
          c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
          c.zero_optimization.offload_optimizer.ratio = 0.5;  // device and offloaded sub-groups
          c.zero_optimization.sub_group_size = 1024;
        }
        const RunResult in_place = train(c, three_layers(), 2, 3, 16);
        const RunResult packed = train(c, three_layers(), 2, 3, 16, -1, packing);
        EXPECT_TRUE(bitwise_equal(in_place, packed));
        for (int rk = 0; rk < 2; ++rk) {
          const TrafficReport &a = in_place.traffic[rk], &b = packed.traffic[rk];
          // Stage 2's updated shards: in place one grouped all-gather for the three groups,
          // packed one per group (no staging buffer of allgather_bucket_size elements); a
          // group with a CPU-offloaded part keeps its own gather (the next forward waits for
          // that group's CPU update only).
          const bool together = stage == 2 && !offload;
          EXPECT_EQ(a.all_gather_calls, together ? 1 : b.all_gather_calls);
          if (stage == 2) EXPECT_EQ(b.all_gather_calls, 3);
          EXPECT_EQ(a.reduce_scatter_calls, b.reduce_scatter_calls);
          EXPECT_EQ(a.reduce_scatter_calls, gas);  // one bucket per round
          EXPECT_EQ(a.calls - a.all_gather_calls, b.calls - b.all_gather_calls);
          EXPECT_EQ(a.bytes_sent, b.bytes_sent);
          EXPECT_LE(in_place.memory[rk].device_peak, packed.memory[rk].device_peak);
          if (stage == 3) EXPECT_LT(in_place.memory[rk].device_peak, packed.memory[rk].device_peak);
        }
      }
    }
  }
}

TEST(Buckets, ReduceBucketSizeSetsTheGradientCollectivesBitwise) {
  for (int stage = 0; stage <= 3; ++stage) {
    const RunResult alone = train(config(stage, 0), three_layers(), 2, 3, 16);
    for (int rk = 0; rk < 2; ++rk) EXPECT_EQ(gradient_calls(alone.traffic[rk], stage), 3) << "stage " << stage;
    for (const BucketCase& b : kCases) {
      const RunResult r = train(config(stage, b.size), three_layers(), 2, 3, 16);
      EXPECT_TRUE(bitwise_equal(r, alone)) << "stage " << stage << " reduce_bucket_size " << b.size;
      for (int rk = 0; rk < 2; ++rk) {
        const TrafficReport &t = r.traffic[rk], &t0 = alone.traffic[rk];
        EXPECT_EQ(gradient_calls(t, stage), b.collectives) << "stage " << stage << " reduce_bucket_size " << b.size;
        // The communicator's own count moves by the same number; the bytes do not move.
        EXPECT_EQ(t0.calls - t.calls, 3 - b.collectives) << "stage " << stage;
        EXPECT_EQ(gradient_bytes(t, stage), gradient_bytes(t0, stage)) << "stage " << stage;
        EXPECT_EQ(t.bytes_sent, t0.bytes_sent) << "stage " << stage;
        EXPECT_EQ(r.memory[rk].device_buffers, 0) << "bucket buffers left after the step, stage " << stage;
      }
    }
  }
}

// Stages 2-3 reduce each micro-batch (a round per micro-batch); stages 0-1 once, after the last.
TEST(Buckets, EachMicroBatchIsARoundAtStagesTwoAndThree) {
  for (int stage = 0; stage <= 3; ++stage) {
    const RunResult alone = train(config(stage, 0, 2), three_layers(), 2, 3, 16);
    const RunResult one = train(config(stage, 500'000'000, 2), three_layers(), 2, 3, 16);
    EXPECT_TRUE(bitwise_equal(one, alone)) << "stage " << stage;
    const int rounds = stage >= 2 ? 2 : 1;
    EXPECT_EQ(gradient_calls(alone.traffic[0], stage), 3 * rounds) << "stage " << stage;
    EXPECT_EQ(gradient_calls(one.traffic[0], stage), rounds) << "stage " << stage;
  }
}

TEST(Buckets, OffloadedGradientsStayBitwise) {
  for (int stage : {2, 3}) {
    for (int gas : {1, 2}) {
      Config c = config(stage, 0, gas);
      c.zero_optimization.offload_optimizer.device = OffloadDevice::cpu;
      c.zero_optimization.offload_optimizer.ratio = 0.5;  // device and offloaded sub-groups
      c.zero_optimization.sub_group_size = 1024;
      const RunResult alone = train(c, three_layers(), 2, 3, 16);
      for (std::int64_t size : {2 * kGroup, std::int64_t{500'000'000}}) {
        c.zero_optimization.reduce_bucket_size = size;
        EXPECT_TRUE(bitwise_equal(train(c, three_layers(), 2, 3, 16), alone))
            << "stage " << stage << " gas " << gas << " reduce_bucket_size " << size;
      }
    }
  }
}

// Stages 1-2: DeepSpeed's all_gather_dp_groups cuts a group's updated shard into
// max(1, shard · world / allgather_bucket_size) pieces, aligned down (16 elements in zoe),
// the last taking the rest. A shard here is 2080 elements.
TEST(Buckets, AllgatherBucketSizeSplitsTheGatherOfUpdatedShards) {
  for (int stage : {1, 2}) {
    const RunResult whole = train(config(stage, 0), three_layers(), 2, 3, 16);
    // The three groups' updated shards, each within allgather_bucket_size, together in one
    // grouped all-gather at the first one's next use (ranks as threads: in place).
    EXPECT_EQ(whole.traffic[0].all_gather_calls, 1) << "the groups that gather whole, together";
    // kGroup: each group fills the bucket alone, one gather each; smaller: each group's shard
    // in pieces, as DeepSpeed's all_gather_dp_groups.
    for (auto [size, per_group] : {std::pair<std::int64_t, int>{kGroup, 1}, {1040, 4}, {1000, 4}, {100, 41}}) {
      Config c = config(stage, 0);
      c.zero_optimization.allgather_bucket_size = size;
      const RunResult r = train(c, three_layers(), 2, 3, 16);
      EXPECT_TRUE(bitwise_equal(r, whole)) << "stage " << stage << " allgather_bucket_size " << size;
      EXPECT_EQ(r.traffic[0].all_gather_calls, 3 * per_group) << "stage " << stage << " allgather_bucket_size " << size;
      EXPECT_EQ(r.traffic[0].all_gather_bytes, whole.traffic[0].all_gather_bytes) << "stage " << stage;
    }
  }
}

namespace {
// Stage 3, world 2: trains two steps and returns, for the second (which prefetches along the
// first's order), how many collectives each begin_forward of l0, l1, l2 issued and, in
// `gathered`, how many groups they all-gathered.
std::vector<std::int64_t> fetches_of_second_step(const Config& c, RunResult* result = nullptr,
                                                 std::vector<std::int64_t>* gathered = nullptr) {
  auto ranks = make_local_ranks(2, 30.0);
  std::vector<std::int64_t> per_forward;
  std::vector<std::vector<float>> params;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    test::TestNet net(e, three_layers());
    CommStats before;
    std::vector<std::int64_t> mine, groups;
    for (int s = 0; s < 2; ++s) {
      before = ctx.comm->stats();
      net.on_forward = [&](int) {
        const CommStats now = ctx.comm->stats();
        // A group's all-gather counts 4160 bf16 elements x (2 - 1) / 2 = 4160 bytes.
        if (s == 1) {
          mine.push_back(now.calls - before.calls);
          groups.push_back((now.all_gather_bytes - before.all_gather_bytes) / kGroup);
        }
        before = now;
      };
      net.micro_batch(16 * s + 8 * ctx.rank, 8);
      e.step();
    }
    e.synchronize();
    if (ctx.rank == 0) {
      per_forward = mine;
      if (gathered) *gathered = groups;
      for (ParamId p : net.params()) params.push_back(e.gather_parameter(p));
    } else {
      for (ParamId p : net.params()) e.gather_parameter(p);
    }
  });
  if (result) result->params = params;
  return per_forward;
}
}  // namespace

// DeepSpeed's fetch_sub_module: one all-gather of the module's own groups, then one of the
// groups it prefetches along the recorded order, up to stage3_prefetch_bucket_size elements.
TEST(Buckets, Stage3FetchIssuesOneGatherAndOnePrefetch) {
  Config c = config(3, 0);
  c.zero_optimization.stage3_prefetch_bucket_size = 0;
  RunResult none, all, one;
  std::vector<std::int64_t> groups;
  EXPECT_EQ(fetches_of_second_step(c, &none, &groups), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_EQ(groups, (std::vector<std::int64_t>{1, 1, 1}));
  // Everything ahead in one collective: l1 and l2 at l0; l0 (for its backward) at l1, l1 at
  // l2 (each was released after its forward: stage3_max_reuse_distance 0).
  c.zero_optimization.stage3_prefetch_bucket_size = 500'000'000;
  EXPECT_EQ(fetches_of_second_step(c, &all, &groups), (std::vector<std::int64_t>{2, 1, 1}));
  EXPECT_EQ(groups, (std::vector<std::int64_t>{3, 1, 1}));
  // One group's worth: the bucket is full after the first group (DeepSpeed's loop stops once
  // it holds the size): l0 prefetches l1, l1 prefetches l2, l2 prefetches l1 for backward.
  c.zero_optimization.stage3_prefetch_bucket_size = kGroup;
  EXPECT_EQ(fetches_of_second_step(c, &one, &groups), (std::vector<std::int64_t>{2, 1, 1}));
  EXPECT_EQ(groups, (std::vector<std::int64_t>{2, 1, 1}));
  EXPECT_TRUE(bitwise_equal(all, none));
  EXPECT_TRUE(bitwise_equal(one, none));
}

// A module over two groups (tied weights: the head uses l0's W) fetches both with one
// all-gather; with parameter offload too, NVMe included (2 read buffers: chunks of two).
TEST(Buckets, Stage3ModuleOfTwoGroupsGathersOnce) {
  const NetSpec tied{{8, 8, 8, 8}, true, 9};
  Config c = config(3, 0);
  c.zero_optimization.stage3_prefetch_bucket_size = 0;
  const RunResult ref = train(c, tied, 2, 3, 16);
  // Forward l0, l1, l2, head (l0's group again and its own) and backward in reverse: 8 fetches.
  EXPECT_EQ(ref.traffic[0].all_gather_calls, 8);
  const std::string dir = test::temp_dir("buckets");
  for (OffloadDevice where : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    Config o = c;
    o.zero_optimization.offload_param.device = where;
    o.zero_optimization.offload_param.nvme_path = dir;
    o.zero_optimization.offload_param.buffer_count = 3;
    o.zero_optimization.offload_param.buffer_size = 4096;  // elements: room for the largest shard
    o.zero_optimization.stage3_prefetch_bucket_size = 500'000'000;
    const RunResult r = train(o, tied, 2, 3, 16);
    EXPECT_TRUE(bitwise_equal(r, ref)) << (where == OffloadDevice::cpu ? "cpu" : "nvme");
  }
}

// overlap_comm false: DeepSpeed reduces on the compute stream, so backward goes on only after
// the reduction. Rank 1 ends its backward 300 ms late; rank 0's reduction cannot finish
// before rank 1 issued it, so rank 0's end_backward returns only after that (and, with
// overlap, long before).
TEST(Buckets, WithoutOverlapCommBackwardWaitsForTheReduction) {
  for (bool overlap : {false, true}) {
    auto ranks = make_local_ranks(2, 30.0);
    std::atomic<bool> rank1_ended{false};
    bool seen_by_rank0 = false;
    run_ranks(ranks, [&](RankContext& ctx) {
      Config c = config(2, 500'000'000);
      c.bf16.enabled = false;
      c.zero_optimization.overlap_comm = overlap;
      Engine e(c, ctx);
      std::vector<float> w(64, 0.5f);
      ModuleId a = e.add_module("a", {e.add_parameter("w", {64}, w)});
      { ForwardScope f(e, a); }
      {
        BackwardScope b(e, a);
        for (int i = 0; i < 64; ++i) b.tensors().grads[0].as<float>()[i] = 1.0f;
        if (ctx.rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          rank1_ended = true;
        }
      }  // end_backward
      if (ctx.rank == 0) seen_by_rank0 = rank1_ended.load();
      e.step();
    });
    EXPECT_EQ(seen_by_rank0, !overlap) << "overlap_comm " << overlap;
  }
}

namespace {
// Two ranks, one module of 64 elements per name, forward in order; rank 0 runs backward in
// reverse, rank 1 in forward order, so their buckets differ. Returns each rank's error.
std::vector<std::string> errors_of_different_backward_orders(const std::vector<std::string>& names) {
  auto ranks = make_local_ranks(2, 5.0);
  std::vector<std::string> errors(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(2, 500'000'000), ctx);
    std::vector<float> w(64, 0.5f);
    std::vector<ModuleId> mods;
    for (const std::string& name : names) mods.push_back(e.add_module(name, {e.add_parameter("w" + name, {64}, w)}));
    try {
      for (ModuleId m : mods) ForwardScope f(e, m);
      std::vector<ModuleId> order = mods;
      if (ctx.rank == 0) std::reverse(order.begin(), order.end());
      for (ModuleId m : order) BackwardScope s(e, m);
      e.step();
    } catch (const std::exception& ex) {
      errors[static_cast<std::size_t>(ctx.rank)] = ex.what();
    }
  });
  return errors;
}
}  // namespace

// Ranks whose backward order differs fill their buckets differently: the first collective
// that differs fails on every rank naming the groups of both buckets.
TEST(Buckets, DifferentBackwardOrdersFailNamingTheBuckets) {
  const std::vector<std::string> errors = errors_of_different_backward_orders({"A", "B"});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("gradients of 2 groups ('B', 'A')"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("gradients of 2 groups ('A', 'B')"), std::string::npos) << errors[r];
  }
}

// A bucket of many groups is named by its first four groups and a count: the label stays short
// (and cheap to build) whatever the bucket holds.
TEST(Buckets, ABucketOfManyGroupsNamesItsFirstFour) {
  const std::vector<std::string> errors = errors_of_different_backward_orders({"A", "B", "C", "D", "E", "F"});
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("gradients of 6 groups ('F', 'E', 'D', 'C' and 2 more)"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("gradients of 6 groups ('A', 'B', 'C', 'D' and 2 more)"), std::string::npos) << errors[r];
  }
}

namespace {
double relative_difference(const RunResult& a, const RunResult& b) {  // ||a - b|| / ||b|| over every parameter
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    for (std::size_t j = 0; j < a.params[i].size(); ++j) {
      const double x = a.params[i][j], y = b.params[i][j];
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  return std::sqrt(diff / norm);
}
}  // namespace

// prescale_gradients divides each gradient by the world size before the reduction, and
// gradient_predivide_factor f by f before and world / f after (DeepSpeed's engine). Dividing
// by a power of two is exact, so at world 2 and 4 (f = 2) the run is bitwise the plain one;
// by 3 it is not (the division rounds), which shows the division happens before the sum,
// yet it stays within a few fp32 roundings of it.
TEST(Buckets, PrescaleGradientsDividesBeforeTheReduction) {
  for (int stage : {0, 1, 2, 3}) {
    Config plain = config(stage, kGroup);
    plain.bf16.enabled = false;  // fp32 compute: the roundings of the division show alone
    const RunResult base = train(plain, three_layers(), 2, 4, 8);
    Config pre = plain;
    pre.prescale_gradients = true;
    EXPECT_TRUE(bitwise_equal(train(pre, three_layers(), 2, 4, 8), base)) << "stage " << stage;
    Config two = plain;
    two.gradient_predivide_factor = 2.0;
    EXPECT_TRUE(bitwise_equal(train(two, three_layers(), 2, 4, 8), base)) << "stage " << stage;
    Config three = plain;
    three.gradient_predivide_factor = 3.0;
    const RunResult by_three = train(three, three_layers(), 2, 4, 8);
    EXPECT_FALSE(bitwise_equal(by_three, base)) << "stage " << stage << ": the pre-division had no effect";
    EXPECT_LT(relative_difference(by_three, base), 1e-5) << "stage " << stage;
    // prescale_gradients wins over the factor, as in DeepSpeed.
    three.prescale_gradients = true;
    EXPECT_TRUE(bitwise_equal(train(three, three_layers(), 2, 4, 8), base)) << "stage " << stage;
  }
}

// A module whose parameters are all frozen leaves its trainable group empty and unused: it has
// no gradients to wait for, so the round completes (and the bucket is reduced) at the last
// backward, not only at step().
TEST(Buckets, AModuleOfFrozenParametersOnlyDoesNotHoldBackTheRound) {
  for (int stage : {2, 3}) {
    auto ranks = make_local_ranks(2, 30.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(stage, 500'000'000), ctx);
      const ParamId w = e.add_parameter("w", {64}, std::vector<float>(64, 0.5f));
      const ParamId f = e.add_parameter("f", {32}, std::vector<float>(32, 0.25f), ParamOptions{std::nullopt, 1.0, true});
      const ModuleId a = e.add_module("a", {w});
      const ModuleId b = e.add_module("b", {f});
      for (int s = 0; s < 2; ++s) {
        { ForwardScope fa(e, a); }
        { ForwardScope fb(e, b); }
        { BackwardScope bb(e, b); }
        const std::int64_t before = ctx.comm->stats().reduce_scatter_bytes;
        {
          BackwardScope ba(e, a);
          for (std::int64_t i = 0; i < 64; ++i) test::add(ba.tensors().grads[0], i, 0.125f);
        }
        EXPECT_GT(ctx.comm->stats().reduce_scatter_bytes, before) << "stage " << stage << " step " << s
                                                                  << ": the bucket waited for step()";
        e.step();
      }
    });
  }
}
