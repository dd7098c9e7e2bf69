// Ranks as threads on host devices of a chosen model: the internal form of
// make_local_ranks (include/zoe/ranks.hpp), which uses the environment's options
// (ZOE_HOST_MEMORY..., src/device/host_device_options.hpp). Tests and benches that need a
// discrete host device whatever the environment call this.
#pragma once

#include <vector>

#include "src/device/host_device_options.hpp"
#include "zoe/ranks.hpp"

namespace zoe {

/// `world_size` ranks, element i is rank i, each on its own HostDevice(device) and connected
/// by one LocalCommunicator group whose collectives time out after `timeout_s` seconds.
/// Throws UsageError if world_size < 1, timeout_s is not a positive finite number, or the
/// options are invalid. Thread-safety: may be called from any thread; each call builds a
/// separate group.
std::vector<RankContext> make_local_ranks_on(int world_size, const HostDeviceOptions& device,
                                             double timeout_s = 300.0);

}  // namespace zoe
