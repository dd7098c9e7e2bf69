// make_local_ranks and run_ranks of include/zoe/engine.hpp: ranks as threads.
#include <cmath>
#include <exception>
#include <thread>

#include "src/comm/host_communicator.hpp"
#include "src/common/check.hpp"
#include "src/device/host_device.hpp"
#include "zoe/engine.hpp"

namespace zoe {

std::chrono::milliseconds timeout_from_seconds(double timeout_s) {
  ZOE_CHECK_USAGE(std::isfinite(timeout_s) && timeout_s > 0, "collective timeout must be a positive number of ",
                  "seconds, got ", timeout_s);
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(timeout_s * 1000.0)));
}

std::vector<RankContext> make_local_ranks(int world_size, double timeout_s) {
  ZOE_CHECK_USAGE(world_size >= 1, "make_local_ranks: world_size must be >= 1, got ", world_size);
  HostCommOptions options;
  options.timeout = timeout_from_seconds(timeout_s);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<RankContext> ranks(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  // Every rank must join concurrently: Gloo's rendezvous waits for all of them.
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto device = std::make_shared<HostDevice>();
        ranks[r] = {r, world_size, device, std::make_shared<HostCommunicator>(device, store, r, world_size, options)};
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return ranks;
}

void run_ranks(const std::vector<RankContext>& ranks, const std::function<void(RankContext&)>& fn) {
  std::vector<RankContext> contexts = ranks;  // fn receives a mutable copy sharing device and comm
  std::vector<std::exception_ptr> errors(contexts.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(contexts[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace zoe
