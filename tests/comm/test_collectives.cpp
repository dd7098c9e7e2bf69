// Host collectives, ranks as threads, on both host backends (LocalCommunicator from
// make_local_ranks, and Gloo's HostCommunicator): every collective x world sizes 1-4 x
// element counts 0, 1, 7, 1M+3 x fp32/bf16 against a direct computation, the
// determinism contract (rank-order sums, identical bits everywhere, all-reduce slice ==
// reduce-scatter), exact byte counters; and the two backends give identical bits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/half.hpp"
#include "src/comm/communicator.hpp"
#include "src/comm/gloo_local_ranks.hpp"
#include "src/device/device.hpp"
#include "zoe/engine.hpp"

using namespace zoe;
namespace k = zoe::kernels;

namespace {
constexpr std::size_t kCounts[] = {0, 1, 7, (1u << 20) + 3};

enum class Backend { local, gloo };
std::string backend_name(Backend b) { return b == Backend::local ? "Local" : "Gloo"; }

// One group per backend and world size, built once: creating Gloo meshes is slow.
std::vector<RankContext>& ranks_of(Backend backend, int world) {
  static std::map<std::pair<Backend, int>, std::vector<RankContext>> groups;
  auto key = std::make_pair(backend, world);
  auto it = groups.find(key);
  if (it == groups.end()) {
    HostCommOptions options;
    options.timeout = std::chrono::seconds(60);
    it = groups.emplace(key, backend == Backend::local ? make_local_ranks(world, 60.0)
                                                       : make_gloo_local_ranks(world, options)).first;
  }
  return it->second;
}

// Rank r's value for element i: a pseudo-random fp32 in [-2, 2) with a full mantissa,
// so sums round and their order is visible in the bits.
float value(int r, std::size_t i, std::uint32_t salt) {
  std::uint64_t z = (std::uint64_t(r) << 40) ^ (std::uint64_t(i) * 0x9E3779B97F4A7C15ull) ^ salt;
  z ^= z >> 31;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return float(std::int64_t(z >> 40) - (1ll << 23)) / float(1 << 22);
}

// A host buffer of n elements of dtype, element i = v(i) rounded to dtype.
template <class F>
std::vector<char> make(DType t, std::size_t n, F v) {
  std::vector<char> b(n * dtype_size(t) + 1);
  for (std::size_t i = 0; i < n; ++i) {
    float x = v(i);
    if (t == DType::f32) std::memcpy(b.data() + 4 * i, &x, 4);
    else {
      std::uint16_t h = t == DType::bf16 ? k::f32_to_bf16(x) : k::f32_to_f16(x);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}
float get(const void* b, DType t, std::size_t i) {
  if (t == DType::f32) return static_cast<const float*>(b)[i];
  std::uint16_t h = static_cast<const std::uint16_t*>(b)[i];
  return t == DType::bf16 ? k::bf16_to_f32(h) : k::f16_to_f32(h);
}
std::uint32_t bits_of_rounded(float x, DType t) {
  if (t == DType::f32) return k::f32_bits(x);
  return t == DType::bf16 ? k::f32_to_bf16(x) : k::f32_to_f16(x);
}
std::uint32_t bits_at(const void* b, DType t, std::size_t i) {
  if (t == DType::f32) return k::f32_bits(static_cast<const float*>(b)[i]);
  return static_cast<const std::uint16_t*>(b)[i];
}

// Direct computation of a reduction of element values v(r) over ranks: fp32 sum in rank
// order, divided by N for avg, rounded once.
template <class F>
std::uint32_t reference_reduce(int world, DType t, bool avg, F v) {
  float acc = 0.0f;
  for (int r = 0; r < world; ++r) {
    float x = get(make(t, 1, [&](std::size_t) { return v(r); }).data(), t, 0);
    acc = r == 0 ? x : acc + x;
  }
  if (avg) acc = acc / float(world);
  return bits_of_rounded(acc, t);
}

struct Case {
  int world;
  std::size_t count;
  DType dtype;
};
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int w = 1; w <= 4; ++w)
    for (std::size_t c : kCounts)
      for (DType t : {DType::f32, DType::bf16}) cases.push_back({w, c, t});
  return cases;
}
std::string describe(const Case& c) {
  return "world " + std::to_string(c.world) + ", count " + std::to_string(c.count) + ", " +
         std::string(dtype_name(c.dtype));
}
// Sparse checking of huge buffers keeps the suite fast: every element for small counts,
// the first/last 4096 and every 61st otherwise.
bool check_index(std::size_t i, std::size_t n) { return n < 10000 || i < 4096 || i + 4096 >= n || i % 61 == 0; }
}  // namespace

class Collectives : public ::testing::TestWithParam<Backend> {
 protected:
  std::vector<RankContext>& group(int world) { return ranks_of(GetParam(), world); }
};
INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::Values(Backend::local, Backend::gloo),
                         [](const auto& info) { return backend_name(info.param); });

TEST_P(Collectives, AllGather) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(describe(c));
    run_ranks(group(c.world), [&](RankContext& ctx) {
      Device& dev = *ctx.device;
      auto stream = dev.create_stream();
      auto send = make(c.dtype, c.count, [&](std::size_t i) { return value(ctx.rank, i, 1); });
      std::vector<char> recv(c.count * c.world * dtype_size(c.dtype) + 1, 0);
      ctx.comm->all_gather(send.data(), recv.data(), c.count, c.dtype, *stream);
      dev.synchronize(*stream);
      for (int r = 0; r < c.world; ++r)
        for (std::size_t i = 0; i < c.count; ++i)
          if (check_index(i, c.count))
            ASSERT_EQ(bits_at(recv.data(), c.dtype, r * c.count + i),
                      bits_of_rounded(value(r, i, 1), c.dtype)) << "rank " << ctx.rank << " block " << r << " i " << i;
    });
  }
}

TEST_P(Collectives, ReduceScatterSumAndAvg) {
  for (const Case& c : all_cases()) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      SCOPED_TRACE(describe(c) + (op == ReduceOp::sum ? ", sum" : ", avg"));
      run_ranks(group(c.world), [&](RankContext& ctx) {
        Device& dev = *ctx.device;
        auto stream = dev.create_stream();
        auto send = make(c.dtype, c.count * c.world, [&](std::size_t i) { return value(ctx.rank, i, 2); });
        std::vector<char> recv(c.count * dtype_size(c.dtype) + 1, 0);
        ctx.comm->reduce_scatter(send.data(), recv.data(), c.count, c.dtype, op, *stream);
        dev.synchronize(*stream);
        for (std::size_t i = 0; i < c.count; ++i) {
          if (!check_index(i, c.count)) continue;
          std::size_t g = ctx.rank * c.count + i;
          ASSERT_EQ(bits_at(recv.data(), c.dtype, i),
                    reference_reduce(c.world, c.dtype, op == ReduceOp::avg, [&](int r) { return value(r, g, 2); }))
              << "rank " << ctx.rank << " i " << i;
        }
      });
    }
  }
}

TEST_P(Collectives, AllReduceInAndOutOfPlace) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(describe(c));
    run_ranks(group(c.world), [&](RankContext& ctx) {
      Device& dev = *ctx.device;
      auto stream = dev.create_stream();
      auto send = make(c.dtype, c.count, [&](std::size_t i) { return value(ctx.rank, i, 3); });
      std::vector<char> recv(send.size(), 0);
      std::vector<char> inplace = send;
      ctx.comm->all_reduce(send.data(), recv.data(), c.count, c.dtype, ReduceOp::sum, *stream);
      ctx.comm->all_reduce(inplace.data(), inplace.data(), c.count, c.dtype, ReduceOp::avg, *stream);
      dev.synchronize(*stream);
      for (std::size_t i = 0; i < c.count; ++i) {
        if (!check_index(i, c.count)) continue;
        auto v = [&](int r) { return value(r, i, 3); };
        ASSERT_EQ(bits_at(recv.data(), c.dtype, i), reference_reduce(c.world, c.dtype, false, v)) << i;
        ASSERT_EQ(bits_at(inplace.data(), c.dtype, i), reference_reduce(c.world, c.dtype, true, v)) << i;
      }
    });
  }
}

TEST_P(Collectives, AllReduceF64) {
  for (int w = 1; w <= 4; ++w) {
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000)}) {
      run_ranks(group(w), [&](RankContext& ctx) {
        auto stream = ctx.device->create_stream();
        std::vector<double> x(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = double(value(ctx.rank, i, 4)) / 3.0;
        ctx.comm->all_reduce_f64(x.data(), n, *stream);
        ctx.device->synchronize(*stream);
        for (std::size_t i = 0; i < n; ++i) {
          double ref = double(value(0, i, 4)) / 3.0;
          for (int r = 1; r < w; ++r) ref += double(value(r, i, 4)) / 3.0;
          ASSERT_EQ(std::memcmp(&x[i], &ref, 8), 0) << "world " << w << " i " << i << ": " << x[i] << " vs " << ref;
        }
      });
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  for (const Case& c : all_cases()) {
    for (int root = 0; root < c.world; ++root) {
      SCOPED_TRACE(describe(c) + ", root " + std::to_string(root));
      run_ranks(group(c.world), [&](RankContext& ctx) {
        auto stream = ctx.device->create_stream();
        auto buf = make(c.dtype, c.count, [&](std::size_t i) { return value(ctx.rank, i, 5); });
        ctx.comm->broadcast(buf.data(), c.count, c.dtype, root, *stream);
        ctx.device->synchronize(*stream);
        for (std::size_t i = 0; i < c.count; ++i)
          if (check_index(i, c.count))
            ASSERT_EQ(bits_at(buf.data(), c.dtype, i), bits_of_rounded(value(root, i, 5), c.dtype)) << i;
      });
    }
  }
}

TEST_P(Collectives, BarrierWaitsForEveryRank) {
  for (int w = 1; w <= 4; ++w) {
    std::atomic<int> arrived{0};
    run_ranks(group(w), [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * ctx.rank));
      ++arrived;
      ctx.comm->barrier(*stream);
      ctx.device->synchronize(*stream);
      EXPECT_EQ(arrived.load(), w);
    });
  }
}

// The contract the engine's bitwise stage-equality tests rest on: every rank gets the
// same bits, and all_reduce's part r equals reduce_scatter's result on rank r.
TEST_P(Collectives, AllReduceSliceEqualsReduceScatterBitwise) {
  for (int w = 1; w <= 4; ++w) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        const std::size_t count = 1001;  // per-rank slice; odd so all_reduce's parts differ from it
        std::vector<std::vector<char>> ar(w), rs(w);
        run_ranks(group(w), [&](RankContext& ctx) {
          auto stream = ctx.device->create_stream();
          auto send = make(t, count * w, [&](std::size_t i) { return value(ctx.rank, i, 6) * 7.0f; });
          ar[ctx.rank].assign(send.size(), 0);
          rs[ctx.rank].assign(count * dtype_size(t), 0);
          ctx.comm->all_reduce(send.data(), ar[ctx.rank].data(), count * w, t, op, *stream);
          ctx.comm->reduce_scatter(send.data(), rs[ctx.rank].data(), count, t, op, *stream);
          ctx.device->synchronize(*stream);
        });
        std::size_t es = dtype_size(t);
        for (int r = 0; r < w; ++r) {
          ASSERT_EQ(std::memcmp(ar[r].data(), ar[0].data(), count * w * es), 0) << "rank " << r << " differs";
          ASSERT_EQ(std::memcmp(ar[0].data() + r * count * es, rs[r].data(), count * es), 0)
              << "world " << w << " " << dtype_name(t) << " rank " << r;
        }
      }
    }
  }
}

TEST_P(Collectives, CollectivesOnSeveralStreamsRunInIssueOrder) {
  // Issued alternately on two streams: each rank runs them in issue order, so they match.
  run_ranks(group(3), [&](RankContext& ctx) {
    Device& dev = *ctx.device;
    auto a = dev.create_stream();
    auto b = dev.create_stream();
    std::vector<std::vector<float>> bufs(10, std::vector<float>(3 * 100));
    std::vector<std::vector<float>> mine(10);
    for (int j = 0; j < 10; ++j) mine[j].assign(100, float(ctx.rank * 10 + j));
    for (int j = 0; j < 10; ++j) {
      if (j % 2 == 0) dev.host_func(*a, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
      ctx.comm->all_gather(mine[j].data(), bufs[j].data(), 100, DType::f32, j % 2 ? *b : *a);
    }
    dev.synchronize(*a);
    dev.synchronize(*b);
    for (int j = 0; j < 10; ++j)
      for (int r = 0; r < 3; ++r) ASSERT_EQ(bufs[j][r * 100 + 99], float(r * 10 + j));
  });
}

TEST_P(Collectives, ByteCountersAreExact) {
  // S = full buffer bytes, N = 3: all_gather/reduce_scatter add floor(S*2/3), all_reduce
  // floor(2*S*2/3), broadcast S; all_reduce_f64 counts as an all_reduce of 8*count bytes.
  run_ranks(group(3), [&](RankContext& ctx) {
    Communicator& comm = *ctx.comm;
    auto stream = ctx.device->create_stream();
    comm.reset_stats();
    std::vector<char> a(4096), b(4096);
    std::vector<double> d(5);
    comm.all_gather(a.data(), b.data(), 7, DType::f32, *stream);            // S = 84  -> 56
    comm.reduce_scatter(a.data(), b.data(), 7, DType::bf16, ReduceOp::sum, *stream);  // S = 42 -> 28
    comm.all_reduce(a.data(), b.data(), 10, DType::f32, ReduceOp::sum, *stream);  // 2*40*2/3 -> 53
    comm.all_reduce_f64(d.data(), 5, *stream);                               // 2*40*2/3 -> 53
    comm.broadcast(a.data(), 5, DType::bf16, 1, *stream);                    // 10
    comm.barrier(*stream);
    ctx.device->synchronize(*stream);
    CommStats s = comm.stats();
    EXPECT_EQ(s.all_gather_bytes, 56);
    EXPECT_EQ(s.reduce_scatter_bytes, 28);
    EXPECT_EQ(s.all_reduce_bytes, 106);
    EXPECT_EQ(s.broadcast_bytes, 10);
    EXPECT_EQ(s.calls, 5);
    EXPECT_EQ(s.total(), 56 + 28 + 106 + 10);
    comm.reset_stats();
    EXPECT_EQ(comm.stats().total(), 0);
  });
  // World size 1 moves nothing but broadcast's S.
  run_ranks(group(1), [&](RankContext& ctx) {
    auto stream = ctx.device->create_stream();
    ctx.comm->reset_stats();
    std::vector<char> a(64), b(64);
    ctx.comm->all_gather(a.data(), b.data(), 4, DType::f32, *stream);
    ctx.comm->all_reduce(a.data(), b.data(), 4, DType::f32, ReduceOp::sum, *stream);
    ctx.device->synchronize(*stream);
    EXPECT_EQ(ctx.comm->stats().total(), 0);
    EXPECT_EQ(ctx.comm->stats().calls, 2);
  });
}

// A grouped all-gather / reduce-scatter gives every part the bits of its own collective
// (parts of 0, 1, 7 and 1003 elements in separate buffers, one part in place), counts the
// same bytes, and one call where the backend groups in place (else one per part).
TEST_P(Collectives, GroupedEqualTheirPartsCollectivesBitwise) {
  const std::vector<std::size_t> counts = {7, 0, 1003, 1, 64};
  for (int w = 1; w <= 4; ++w) {
    for (DType t : {DType::f32, DType::bf16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        SCOPED_TRACE("world " + std::to_string(w) + ", " + std::string(dtype_name(t)) + (op == ReduceOp::avg ? ", avg" : ", sum"));
        run_ranks(group(w), [&](RankContext& ctx) {
          Communicator& comm = *ctx.comm;
          auto stream = ctx.device->create_stream();
          const std::size_t es = dtype_size(t);
          std::vector<std::vector<char>> sends, recvs, rs_sends, rs_recvs, one_ag, one_rs;
          for (std::size_t k = 0; k < counts.size(); ++k) {
            const std::size_t n = counts[k];
            sends.push_back(make(t, n, [&](std::size_t i) { return value(ctx.rank, i, 20 + k); }));
            rs_sends.push_back(make(t, n * w, [&](std::size_t i) { return value(ctx.rank, i, 40 + k); }));
            recvs.emplace_back(n * w * es + 1, 0);
            rs_recvs.emplace_back(n * es + 1, 0);
            one_ag.emplace_back(n * w * es + 1, 0);
            one_rs.emplace_back(n * es + 1, 0);
          }
          // Part 2 of the all-gather in place: its send is this rank's block of its recv.
          std::memcpy(recvs[2].data() + ctx.rank * counts[2] * es, sends[2].data(), counts[2] * es);
          std::vector<GroupedPart> ag, rs;
          for (std::size_t k = 0; k < counts.size(); ++k) {
            const void* send = k == 2 ? static_cast<const void*>(recvs[2].data() + ctx.rank * counts[2] * es) : sends[k].data();
            ag.push_back({send, recvs[k].data(), counts[k]});
            rs.push_back({rs_sends[k].data(), rs_recvs[k].data(), counts[k]});
          }
          comm.reset_stats();
          comm.all_gather_grouped(ag, t, *stream);
          comm.reduce_scatter_grouped(rs, t, op, *stream);
          ctx.device->synchronize(*stream);
          const CommStats grouped = comm.stats();
          comm.reset_stats();
          for (std::size_t k = 0; k < counts.size(); ++k) {
            comm.all_gather(sends[k].data(), one_ag[k].data(), counts[k], t, *stream);
            comm.reduce_scatter(rs_sends[k].data(), one_rs[k].data(), counts[k], t, op, *stream);
          }
          ctx.device->synchronize(*stream);
          const CommStats single = comm.stats();
          for (std::size_t k = 0; k < counts.size(); ++k) {
            ASSERT_EQ(std::memcmp(recvs[k].data(), one_ag[k].data(), counts[k] * w * es), 0) << "all-gather part " << k;
            ASSERT_EQ(std::memcmp(rs_recvs[k].data(), one_rs[k].data(), counts[k] * es), 0) << "reduce-scatter part " << k;
          }
          // And against the direct computation, for one element of each kind.
          if (counts[2] > 0) {
            ASSERT_EQ(bits_at(recvs[2].data(), t, (w - 1) * counts[2] + 5), bits_of_rounded(value(w - 1, 5, 22), t));
            const std::size_t g = ctx.rank * counts[2] + 9;
            ASSERT_EQ(bits_at(rs_recvs[2].data(), t, 9),
                      reference_reduce(w, t, op == ReduceOp::avg, [&](int r) { return value(r, g, 42); }));
          }
          EXPECT_EQ(grouped.all_gather_bytes, single.all_gather_bytes);
          EXPECT_EQ(grouped.reduce_scatter_bytes, single.reduce_scatter_bytes);
          const std::int64_t per_kind = comm.gathers_parts_in_place() ? 1 : static_cast<std::int64_t>(counts.size());
          EXPECT_EQ(grouped.calls, 2 * per_kind);
        });
      }
    }
  }
}

// The in-place layouts NCCL allows, and reduce_scatter writing over the start of its own
// send buffer (not its slice; a zero-copy backend must not let peers read it after).
TEST_P(Collectives, AliasedBuffers) {
  const std::size_t count = 1003;
  for (int w = 1; w <= 3; ++w) {
    SCOPED_TRACE("world " + std::to_string(w));
    run_ranks(group(w), [&](RankContext& ctx) {
      auto stream = ctx.device->create_stream();
      const std::size_t es = 4;
      // all_gather in place: send is this rank's block of recv.
      std::vector<char> gathered(count * w * es, 0);
      auto mine = make(DType::f32, count, [&](std::size_t i) { return value(ctx.rank, i, 7); });
      std::memcpy(gathered.data() + ctx.rank * count * es, mine.data(), count * es);
      ctx.comm->all_gather(gathered.data() + ctx.rank * count * es, gathered.data(), count, DType::f32, *stream);
      // reduce_scatter in place (recv = this rank's slice) and over the buffer's start.
      auto a = make(DType::f32, count * w, [&](std::size_t i) { return value(ctx.rank, i, 8); });
      auto b = a;
      ctx.comm->reduce_scatter(a.data(), a.data() + ctx.rank * count * es, count, DType::f32, ReduceOp::sum,
                               *stream);
      ctx.comm->reduce_scatter(b.data(), b.data(), count, DType::f32, ReduceOp::avg, *stream);
      ctx.device->synchronize(*stream);
      for (std::size_t i = 0; i < count; ++i) {
        for (int r = 0; r < w; ++r)
          ASSERT_EQ(bits_at(gathered.data(), DType::f32, r * count + i), bits_of_rounded(value(r, i, 7), DType::f32));
        auto v = [&](int r) { return value(r, ctx.rank * count + i, 8); };
        ASSERT_EQ(bits_at(a.data(), DType::f32, ctx.rank * count + i), reference_reduce(w, DType::f32, false, v));
        ASSERT_EQ(bits_at(b.data(), DType::f32, i), reference_reduce(w, DType::f32, true, v));
      }
    });
  }
}

// The zero-copy backend and Gloo's give identical bits for every reducing collective, at
// counts that do not divide evenly into all_reduce's parts.
TEST(CollectiveBackends, LocalAndGlooAgreeBitwise) {
  for (int w = 1; w <= 4; ++w) {
    for (DType t : {DType::bf16, DType::f16, DType::f32}) {
      for (std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(65537)}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          SCOPED_TRACE("world " + std::to_string(w) + ", " + std::string(dtype_name(t)) + ", count " +
                       std::to_string(count) + (op == ReduceOp::avg ? ", avg" : ", sum"));
          const std::size_t es = dtype_size(t), ar_count = count * w + 1;
          // results[backend][rank]: reduce_scatter's slice, then all_reduce's buffer.
          std::vector<std::vector<char>> results[2];
          for (Backend b : {Backend::local, Backend::gloo}) {
            auto& out = results[int(b)];
            out.assign(w, {});
            run_ranks(ranks_of(b, w), [&](RankContext& ctx) {
              auto stream = ctx.device->create_stream();
              auto send = make(t, ar_count, [&](std::size_t i) { return value(ctx.rank, i, 9) * 7.0f; });
              std::vector<char> rs(count * es), ar(ar_count * es);
              ctx.comm->reduce_scatter(send.data(), rs.data(), count, t, op, *stream);
              ctx.comm->all_reduce(send.data(), ar.data(), ar_count, t, op, *stream);
              ctx.device->synchronize(*stream);
              rs.insert(rs.end(), ar.begin(), ar.end());
              out[ctx.rank] = std::move(rs);
            });
          }
          for (int r = 0; r < w; ++r) {
            ASSERT_EQ(results[0][r].size(), results[1][r].size());
            ASSERT_EQ(std::memcmp(results[0][r].data(), results[1][r].data(), results[0][r].size()), 0)
                << "rank " << r << " differs between the Local and Gloo backends";
          }
        }
      }
    }
  }
}
