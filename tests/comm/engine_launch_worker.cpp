// A small ZeRO-3 training job (tests/core/test_net.hpp's MLP, bf16, 20 steps of 16 samples on 2
// ranks) run either as one rank of a launcher's job (rank_from_environment: torchrun, mpirun)
// or as 2 ranks that are threads of this process. Rank 0 writes its per-step losses and the
// final fp32 parameters to OUT as raw bytes, so run_under_launcher.sh compares the launcher's
// run with the threads' run bit for bit (the host communicators give identical bits).
// Usage: engine_launch_worker launcher|threads OUT
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "tests/core/test_net.hpp"
#include "zoe/engine.hpp"

using namespace zoe;

namespace {
constexpr int kWorld = 2, kSteps = 20, kGlobalBatch = 16;

Config config() {
  Config c;
  c.zero_optimization.stage = 3;
  c.bf16.enabled = true;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  return c;
}
test::NetSpec spec() { return test::NetSpec{{8, 16, 16, 8}, false, 7}; }

void write(const std::string& path, const std::vector<double>& losses, const std::vector<std::vector<float>>& params) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(losses.data()), static_cast<std::streamsize>(losses.size() * sizeof(double)));
  for (const auto& p : params)
    out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

// One rank's run, the loop of test::train: micro-batch k of step s is samples
// [s * global + rank * micro, + micro).
void run_rank(RankContext& ctx, std::vector<double>& losses, std::vector<std::vector<float>>& params) {
  Engine engine(config(), ctx);
  test::TestNet net(engine, spec());
  const int micro = kGlobalBatch / ctx.world_size;
  for (int s = 0; s < kSteps; ++s) {
    std::int64_t first = static_cast<std::int64_t>(s) * kGlobalBatch + ctx.rank * micro;
    double loss = net.micro_batch(first, micro, engine.loss_scale());
    engine.step();
    losses.push_back(loss);
  }
  engine.synchronize();
  for (ParamId p : net.params()) params.push_back(engine.gather_parameter(p));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "launcher") != 0 && std::strcmp(argv[1], "threads") != 0)) {
    std::fprintf(stderr, "usage: %s launcher|threads OUT\n", argv[0]);
    return 2;
  }
  try {
    std::vector<double> losses;
    std::vector<std::vector<float>> params;
    int rank = 0;
    if (std::strcmp(argv[1], "launcher") == 0) {
      RankContext ctx = rank_from_environment(60.0);
      if (ctx.world_size != kWorld) {
        std::fprintf(stderr, "engine_launch_worker: expected %d ranks, the launcher started %d\n", kWorld,
                     ctx.world_size);
        return 2;
      }
      rank = ctx.rank;
      run_rank(ctx, losses, params);
    } else {
      test::RunResult r = test::train(config(), spec(), kWorld, kSteps, kGlobalBatch);
      losses = r.losses;
      params = r.params;
    }
    if (rank == 0) write(argv[2], losses, params);
    std::printf("engine_launch_worker %s rank %d: loss %.6f -> %.6f over %d steps\n", argv[1], rank, losses.front(),
                losses.back(), kSteps);
    // One rank's loss is noisy; the threads' run (rank 0's, as test::train reports it) must fall
    // over the 20 steps, and the launcher's run must equal it bit for bit (the script checks).
    if (std::strcmp(argv[1], "threads") == 0 && !(losses.back() < losses.front())) {
      std::fprintf(stderr, "engine_launch_worker: the loss did not fall\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_launch_worker: %s\n", e.what());
    return 1;
  }
}
