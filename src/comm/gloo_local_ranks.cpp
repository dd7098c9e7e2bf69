#include "src/comm/gloo_local_ranks.hpp"

#include <exception>
#include <thread>

#include "src/common/check.hpp"
#include "src/device/host_device.hpp"

namespace zoe {

std::vector<RankContext> make_gloo_local_ranks(int world_size, HostCommOptions options) {
  ZOE_CHECK_USAGE(world_size >= 1, "make_gloo_local_ranks: world_size must be >= 1, got ", world_size);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<RankContext> ranks(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  // Every rank must join concurrently: Gloo's rendezvous waits for all of them.
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto device = std::make_shared<HostDevice>(host_device_options_from_environment());
        ranks[r] = {r, world_size, device, std::make_shared<HostCommunicator>(device, store, r, world_size, options),
                    world_size};
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

}  // namespace zoe
