// Ranks as threads of this process connected by Gloo over TCP loopback (HostCommunicator),
// the way make_local_ranks connected them before LocalCommunicator existed. Kept to
// compare the two backends (tests check they give identical bits; the comm bench
// compares their bandwidth); the engine's ranks-as-threads use make_local_ranks.
#pragma once

#include <vector>

#include "src/comm/host_communicator.hpp"
#include "zoe/ranks.hpp"

namespace zoe {

/// `world_size` (>= 1) ranks, element i is rank i, each with its own host device and a
/// HostCommunicator joined through one InMemoryStore (all ranks join concurrently, on
/// threads started here). Throws UsageError for world_size < 1, TimeoutError / CommError
/// if the Gloo mesh cannot be built within options.timeout.
/// Thread-safety: may be called from any thread; each call builds a separate group.
std::vector<RankContext> make_gloo_local_ranks(int world_size, HostCommOptions options = {});

}  // namespace zoe
