// One rank of a multi-process job, started the way a user starts a trainer (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment; see run_two_processes.sh).
// Runs each collective once over TCP between processes and checks the results against a
// direct computation. Exit status 0 when every check passes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "kernels/half.hpp"
#include "src/comm/communicator.hpp"
#include "src/device/device.hpp"
#include "zoe/engine.hpp"

using namespace zoe;

namespace {
float value(int rank, std::size_t i) { return float(int(i % 97) - 48) * 0.37f + float(rank) * 1.25f; }
int failures = 0;
void check(bool ok, const char* what, std::size_t i) {
  if (!ok && failures++ < 10) std::fprintf(stderr, "mismatch in %s at element %zu\n", what, i);
}
}  // namespace

int main() {
  try {
    RankContext ctx = rank_from_environment(30.0);
    Device& dev = *ctx.device;
    Communicator& comm = *ctx.comm;
    const int n = ctx.world_size, me = ctx.rank;
    const std::size_t count = 100003;
    auto stream = dev.create_stream();

    std::vector<float> mine(count * n), gathered(count * n), scattered(count), reduced(count);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(me, i);
    std::vector<std::uint16_t> mine_bf16(count * n), scattered_bf16(count);
    for (std::size_t i = 0; i < mine.size(); ++i) mine_bf16[i] = kernels::f32_to_bf16(mine[i]);
    std::vector<float> bcast(count, float(me));
    std::vector<double> sums = {double(me) + 0.1, 1.0};

    comm.all_gather(mine.data(), gathered.data(), count, DType::f32, *stream);
    comm.reduce_scatter(mine.data(), scattered.data(), count, DType::f32, ReduceOp::avg, *stream);
    comm.reduce_scatter(mine_bf16.data(), scattered_bf16.data(), count, DType::bf16, ReduceOp::sum, *stream);
    comm.all_reduce(mine.data(), reduced.data(), count, DType::f32, ReduceOp::sum, *stream);
    comm.broadcast(bcast.data(), count, DType::f32, n - 1, *stream);
    comm.all_reduce_f64(sums.data(), sums.size(), *stream);
    comm.barrier(*stream);
    dev.synchronize(*stream);

    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) check(gathered[r * count + i] == value(r, i), "all_gather", i);
    for (std::size_t i = 0; i < count; ++i) {
      std::size_t g = me * count + i;
      float sum = value(0, g), sum_b = kernels::bf16_to_f32(kernels::f32_to_bf16(value(0, g))), all = value(0, i);
      for (int r = 1; r < n; ++r) {
        sum += value(r, g);
        sum_b += kernels::bf16_to_f32(kernels::f32_to_bf16(value(r, g)));
        all += value(r, i);
      }
      check(scattered[i] == sum / float(n), "reduce_scatter avg fp32", i);
      check(scattered_bf16[i] == kernels::f32_to_bf16(sum_b), "reduce_scatter sum bf16", i);
      check(reduced[i] == all, "all_reduce sum fp32", i);
      check(bcast[i] == float(n - 1), "broadcast", i);
    }
    double expect = 0.1;
    for (int r = 1; r < n; ++r) expect += double(r) + 0.1;
    check(sums[0] == expect && sums[1] == double(n), "all_reduce_f64", 0);
    CommStats s = comm.stats();
    std::printf("rank %d of %d: %s, %lld bytes counted\n", me, n, failures ? "FAILED" : "all collectives match",
                static_cast<long long>(s.total()));
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
