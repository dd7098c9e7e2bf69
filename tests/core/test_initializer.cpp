// Parameter initializers (Engine::add_parameter with a ParamInitializer, DeepSpeed's zero.Init):
// bitwise the same parameters and trajectory as handing over full arrays, for every stage and
// optimizer / parameter tier; each rank is asked for exactly the elements it keeps (stage 3:
// its shard) in calls of at most sub_group_size elements, on its own thread; an initializer
// that throws fails the first forward with the parameter's name and leaves no files behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/core/test_net.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::RunResult;
using zoe::test::bitwise_equal;
using zoe::test::train;

namespace {

constexpr std::int64_t kSubGroup = 64;  // smaller than every weight: chunks cross parameter boundaries

Config config(int stage, OffloadDevice optimizer, OffloadDevice params, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = kSubGroup;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.offload_optimizer.device = optimizer;
  c.zero_optimization.offload_optimizer.nvme_path = dir;
  c.zero_optimization.offload_optimizer.buffer_count = 3;
  c.zero_optimization.offload_param.device = params;
  c.zero_optimization.offload_param.nvme_path = dir;
  c.zero_optimization.offload_param.buffer_count = 3;
  c.zero_optimization.offload_param.buffer_size = 2048;
  return c;
}

float value(int param, std::int64_t i) { return zoe::test::hashed_uniform(static_cast<std::uint64_t>(param), i, 0.3f); }

// widths 16-32-32-8 and a tied head: weights of 512, 1024 and 256 elements, biases of 32 and 8.
NetSpec net(bool by_initializer) {
  NetSpec s{{16, 32, 32, 8}, true, 5};
  s.value = value;
  s.by_initializer = by_initializer;
  return s;
}
// Elements of the parameters of net(), in registration order.
const std::vector<std::int64_t> kNumels = {512, 32, 1024, 32, 256, 8, 8};
// The modules' groups: l0 {W0, b0}, l1 {W1, b1}, l2 {W2, b2}, head {head.bias} (W0 is l0's).
const std::vector<std::vector<int>> kGroups = {{0, 1}, {2, 3}, {4, 5}, {6}};

const char* name(OffloadDevice d) { return d == OffloadDevice::none ? "none" : d == OffloadDevice::cpu ? "cpu" : "nvme"; }

// What one rank's initializers were asked for: per parameter, (offset, count) calls.
struct Requests {
  std::mutex mu;
  std::map<std::pair<int, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> calls;  // (rank, param)
  std::map<int, std::thread::id> threads_seen;                                               // rank -> caller
  bool several_threads = false;
  void record(int rank, int param, std::int64_t offset, std::int64_t count) {
    std::lock_guard lock(mu);
    calls[{rank, param}].emplace_back(offset, count);
    auto [it, fresh] = threads_seen.emplace(rank, std::this_thread::get_id());
    if (!fresh && it->second != std::this_thread::get_id()) several_threads = true;
  }
};

// Rank r's live elements of parameter p under stage 3, computed from ZeRO's flat layout
// independently of the engine: parameters at 16-aligned offsets in their group's buffer,
// padded to a multiple of world x 16 and cut into equal shards.
std::int64_t expected_shard_elements(int param, int rank, int world) {
  for (const auto& group : kGroups) {
    std::int64_t end = 0, begin_of_param = -1;
    for (int p : group) {
      const std::int64_t off = (end + 15) / 16 * 16;
      if (p == param) begin_of_param = off;
      end = off + kNumels[p];
    }
    if (begin_of_param < 0) continue;
    const std::int64_t padded = (end + world * 16 - 1) / (world * 16) * (world * 16), shard = padded / world;
    const std::int64_t a = std::max(begin_of_param, shard * rank);
    const std::int64_t b = std::min(begin_of_param + kNumels[param], shard * (rank + 1));
    return std::max<std::int64_t>(0, b - a);
  }
  return -1;
}

}  // namespace

class Initializer : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Initializer, FiveStepsBitwiseEqualToFullArrays) {
  auto [stage, world] = GetParam();
  const std::string dir = zoe::test::temp_dir("init-eq");
  struct Tiers {
    OffloadDevice optimizer, params;
  };
  std::vector<Tiers> tiers = {{OffloadDevice::none, OffloadDevice::none},
                              {OffloadDevice::cpu, OffloadDevice::none},
                              {OffloadDevice::nvme, OffloadDevice::none}};
  if (stage == 3) {
    tiers.push_back({OffloadDevice::cpu, OffloadDevice::cpu});
    tiers.push_back({OffloadDevice::nvme, OffloadDevice::nvme});
  }
  for (const Tiers& t : tiers) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage << ", world " << world << ", optimizer " << name(t.optimizer)
                                      << ", params " << name(t.params));
    const Config c = config(stage, t.optimizer, t.params, dir);
    const RunResult arrays = train(c, net(false), world, 5, 16);
    Requests requests;
    NetSpec by_init = net(true);
    by_init.on_init = [&](int r, int p, std::int64_t o, std::int64_t n) { requests.record(r, p, o, n); };
    const RunResult init = train(c, by_init, world, 5, 16);
    EXPECT_TRUE(bitwise_equal(init, arrays));
    EXPECT_EQ(init.losses, arrays.losses);
    ASSERT_EQ(init.steps.size(), arrays.steps.size());
    for (std::size_t s = 0; s < init.steps.size(); ++s) EXPECT_EQ(init.steps[s].grad_norm, arrays.steps[s].grad_norm);
    EXPECT_LT(init.losses.back(), init.losses.front()) << "the model did not train";
    std::int64_t asked = 0;
    for (const auto& [key, calls] : requests.calls)
      for (auto [offset, count] : calls) {
        EXPECT_GE(count, 1);
        EXPECT_LE(count, kSubGroup);
        asked += count;
      }
    EXPECT_GT(asked, 0);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Engine, Initializer, ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2)));

// Stage 3 asks each rank for its shard's live elements only; stages 0-2 for every element.
// Every call is at most sub_group_size elements, on the rank's own thread, and the fp32
// master weights are the initializer's values exactly.
TEST(Initializer, EachRankIsAskedForExactlyTheElementsItKeeps) {
  for (int stage : {2, 3}) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", world " << world);
      const std::string dir = zoe::test::temp_dir("init-shard");
      const Config c = config(stage, OffloadDevice::nvme, OffloadDevice::none, dir);
      Requests requests;
      NetSpec spec = net(true);
      spec.on_init = [&](int r, int p, std::int64_t o, std::int64_t n) { requests.record(r, p, o, n); };
      std::vector<std::vector<std::vector<float>>> gathered(world);
      std::vector<std::thread::id> rank_threads(world);
      auto ranks = make_local_ranks(world, 60.0);
      run_ranks(ranks, [&](RankContext& ctx) {
        rank_threads[ctx.rank] = std::this_thread::get_id();
        Engine e(c, ctx);
        zoe::test::TestNet t(e, spec);
        for (ParamId p : t.params()) gathered[ctx.rank].push_back(e.gather_parameter(p));  // initialises
      });
      EXPECT_FALSE(requests.several_threads);
      for (int r = 0; r < world; ++r) EXPECT_EQ(requests.threads_seen[r], rank_threads[r]) << "rank " << r;
      for (int p = 0; p < static_cast<int>(kNumels.size()); ++p) {
        std::vector<int> times_asked(static_cast<std::size_t>(kNumels[p]), 0);
        for (int r = 0; r < world; ++r) {
          std::int64_t count = 0;
          for (auto [offset, n] : requests.calls[{r, p}]) {
            EXPECT_LE(n, kSubGroup);
            ASSERT_GE(offset, 0);
            ASSERT_LE(offset + n, kNumels[p]);
            for (std::int64_t i = offset; i < offset + n; ++i) ++times_asked[static_cast<std::size_t>(i)];
            count += n;
          }
          const std::int64_t expected = stage == 3 ? expected_shard_elements(p, r, world) : kNumels[p];
          EXPECT_EQ(count, expected) << "parameter " << p << ", rank " << r;
        }
        const int want = stage == 3 ? 1 : world;  // each element once in all, or once per rank
        EXPECT_TRUE(std::all_of(times_asked.begin(), times_asked.end(), [&](int n) { return n == want; }))
            << "parameter " << p;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(gathered[r][p].size(), static_cast<std::size_t>(kNumels[p]));
          for (std::int64_t i = 0; i < kNumels[p]; ++i)
            ASSERT_EQ(gathered[r][p][i], value(p, i)) << "parameter " << p << " element " << i << " rank " << r;
        }
      }
      EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
      std::filesystem::remove_all(dir);
    }
  }
}

// Nothing is asked at registration: initial values are produced at the first forward.
TEST(Initializer, NotCalledBeforeTheFirstForward) {
  auto ranks = make_local_ranks(1, 60.0);
  int calls = 0;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(3, OffloadDevice::none, OffloadDevice::none, ""), ctx);
    NetSpec spec = net(true);
    spec.on_init = [&](int, int, std::int64_t, std::int64_t) { ++calls; };
    zoe::test::TestNet t(e, spec);
    EXPECT_EQ(calls, 0);
    t.micro_batch(0, 4);
    EXPECT_GT(calls, 0);
    const int after_first = calls;
    e.step();
    t.micro_batch(4, 4);
    e.step();
    EXPECT_EQ(calls, after_first) << "initializers are called once";
  });
}

// A throwing initializer fails the first forward with an Error naming the parameter and the
// initializer's message; the engine then refuses further use, and its NVMe files go away.
TEST(Initializer, ThrowingInitializerNamesTheParameter) {
  struct Case {
    bool out_of_memory;
    OffloadDevice optimizer, params;
  };
  for (const Case k : {Case{false, OffloadDevice::none, OffloadDevice::none},
                       Case{false, OffloadDevice::nvme, OffloadDevice::nvme}, Case{true, OffloadDevice::cpu, OffloadDevice::none}}) {
    SCOPED_TRACE(::testing::Message() << "optimizer " << name(k.optimizer) << ", params " << name(k.params));
    const std::string dir = zoe::test::temp_dir("init-throw");
    auto ranks = make_local_ranks(1, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(3, k.optimizer, k.params, dir), ctx);
      NetSpec spec = net(true);
      spec.value = [&](int p, std::int64_t i) {
        if (p == 2 && i >= 700) {  // l1.weight, in its second half
          if (k.out_of_memory) throw std::bad_alloc();
          throw std::runtime_error("no weights today");
        }
        return value(p, i);
      };
      zoe::test::TestNet t(e, spec);
      try {
        t.micro_batch(0, 4);
        ADD_FAILURE() << "the first forward did not throw";
      } catch (const UsageError& err) {
        ADD_FAILURE() << "UsageError instead of the initializer's failure: " << err.what();
      } catch (const OutOfMemoryError& err) {
        EXPECT_TRUE(k.out_of_memory) << err.what();
        EXPECT_NE(err.message().find("'l1.weight'"), std::string::npos) << err.what();
      } catch (const Error& err) {
        EXPECT_FALSE(k.out_of_memory) << err.what();
        EXPECT_NE(err.message().find("'l1.weight'"), std::string::npos) << err.what();
        EXPECT_NE(err.message().find("no weights today"), std::string::npos) << err.what();
      }
      try {
        e.gather_parameter(t.params()[0]);
        ADD_FAILURE() << "the engine was used after its initialisation failed";
      } catch (const UsageError& err) {
        EXPECT_NE(err.message().find("initialisation failed earlier"), std::string::npos) << err.what();
        EXPECT_NE(err.message().find("l1.weight"), std::string::npos) << err.what();
      }
    });
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "NVMe files left behind in " << dir;
    std::filesystem::remove_all(dir);
  }
}

TEST(Initializer, EmptyInitializerIsRefused) {
  auto ranks = make_local_ranks(1, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(1, OffloadDevice::none, OffloadDevice::none, ""), ctx);
    EXPECT_THROW(e.add_parameter("w", {4}, ParamInitializer{}), UsageError);
    EXPECT_THROW(e.add_parameter("w", {-1}, [](std::int64_t, std::span<float>) {}), UsageError);
  });
}
