// make_local_ranks and run_ranks of include/zoe/ranks.hpp: ranks as threads, connected
// by a LocalCommunicator group (multi-process runs use HostCommunicator, rendezvous.cpp).
#include <cmath>
#include <exception>
#include <string>
#include <thread>

#include "src/comm/host_communicator.hpp"  // timeout_from_seconds
#include "src/comm/local_ranks.hpp"
#include "src/comm/local_communicator.hpp"
#include "src/common/boundary_errors.hpp"
#include "src/common/check.hpp"
#include "src/device/host_device.hpp"
#include "zoe/ranks.hpp"

namespace zoe {

std::chrono::milliseconds timeout_from_seconds(double timeout_s) {
  // At most 30 days: steady_clock's deadline (now + timeout, int64 nanoseconds) must not overflow.
  ZOE_CHECK_USAGE(std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= 30.0 * 86400.0,
                  "collective timeout must be a positive number of seconds, at most 2592000 (30 days), got ",
                  timeout_s);
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(timeout_s * 1000.0)));
}

std::vector<RankContext> make_local_ranks(int world_size, double timeout_s) {
  return detail::at_public_boundary("make_local_ranks", [&] {
    return make_local_ranks_on(world_size, host_device_options_from_environment(), timeout_s);
  });
}

std::vector<RankContext> make_local_ranks_on(int world_size, const HostDeviceOptions& options, double timeout_s) {
  ZOE_CHECK_USAGE(world_size >= 1, "make_local_ranks: world_size must be >= 1, got ", world_size);
  validate(options);
  // Threads share one address space: the in-process communicator reads peers' buffers
  // directly (no sockets), with the same results bit for bit as Gloo's.
  auto group = make_local_group(world_size, timeout_from_seconds(timeout_s));
  std::vector<RankContext> ranks(world_size);
  for (int r = 0; r < world_size; ++r) {
    auto device = std::make_shared<HostDevice>(options);
    ranks[r] = {r, world_size, device, std::make_shared<LocalCommunicator>(device, group, r), world_size};
  }
  return ranks;
}

namespace {
std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
bool is_rank_failure(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const RankFailedError&) {
    return true;
  } catch (...) {
    return false;
  }
}
}  // namespace

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
        // The rank is gone: its peers' collectives must not wait for it until the timeout.
        if (contexts[i].comm) contexts[i].comm->abort(describe(errors[i]));
      }
    });
  }
  for (auto& t : threads) t.join();
  // The root cause first: a peer's RankFailedError only repeats it.
  for (auto& e : errors)
    if (e && !is_rank_failure(e)) std::rethrow_exception(e);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace zoe
