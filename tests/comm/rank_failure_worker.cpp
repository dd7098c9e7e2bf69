// One rank of a two-process job whose other rank fails (see run_rank_failure.sh), started as a
// user's launcher starts a trainer (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Trains a small
// ZeRO-3 net with `comm_timeout_s` 300 s; argv[1] picks the failure:
//   crc   rank 1's NVMe swap file (optimizer states, in $ZOE_TEST_DIR/rank1) loses 16 bytes of
//         optim.sg0 after step 1: its next update fails its CRC32C check. Rank 1 then stays
//         alive (its sockets open) until killed, so only the side channel can tell rank 0.
//   init  rank 0's parameter initializer throws at the first forward; rank 0 exits at once
//         (it serves the rendezvous store, so its peer must have read the cause by then).
// Each rank prints "error_at_ms=<wall clock ms> <what()>" for its error, and
// "failed_rank=<R>" for a RankFailedError. Exit 3 after an error, 0 if none came.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/core/swap_corruption.hpp"
#include "tests/core/test_net.hpp"

using namespace zoe;

namespace {
long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "crc" && mode != "init") {
    std::fprintf(stderr, "usage: %s crc|init (with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ZOE_TEST_DIR)\n",
                 argv[0]);
    return 2;
  }
  const char* base = std::getenv("ZOE_TEST_DIR");
  RankContext ctx;
  try {
    ctx = rank_from_environment(300.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "setup failed: %s\n", e.what());
    return 2;
  }
  const std::string dir = std::string(base ? base : "/tmp") + "/rank" + std::to_string(ctx.rank);
  std::filesystem::create_directories(dir);
  Config c;
  c.zero_optimization.stage = 3;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zoe.comm_timeout_s = 300;
  c.zero_optimization.sub_group_size = 64;
  test::NetSpec spec{{8, 16, 8}, true, 11};
  if (mode == "crc") {
    c.zero_optimization.offload_optimizer.device = OffloadDevice::nvme;
    c.zero_optimization.offload_optimizer.nvme_path = dir;
  } else {
    spec.value = [](int, std::int64_t i) { return 0.001f * static_cast<float>(i % 7); };
    spec.by_initializer = true;
    spec.on_init = [](int rank, int, std::int64_t, std::int64_t) {
      if (rank == 0) throw std::runtime_error("injected initializer failure on rank 0");
    };
  }
  bool failed = false;
  {
    Engine e(c, ctx);
    test::TestNet net(e, spec);
    try {
      for (int s = 0; s < 20; ++s) {
        net.micro_batch(s * 16 + ctx.rank * 8, 8);
        e.step();
        if (s == 0 && mode == "crc") {
          e.synchronize();  // step 1's update is on disk; the next one reads it back
          if (ctx.rank == 1) std::printf("damaged %s\n", test::corrupt_first_swap_tensor(dir, 1).c_str());
        }
      }
      e.synchronize();
    } catch (const std::exception& err) {
      failed = true;
      std::printf("error_at_ms=%lld %s\n", wall_ms(), err.what());
      if (auto* r = dynamic_cast<const RankFailedError*>(&err)) std::printf("failed_rank=%d\n", r->failed_rank());
      std::fflush(stdout);
    }
    if (failed && mode == "crc" && ctx.rank == 1) {
      // Stay alive, sockets open, until the test kills this process.
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  std::printf("rank %d: %s\n", ctx.rank, failed ? "failed" : "no error");
  return failed ? 3 : 0;
}
