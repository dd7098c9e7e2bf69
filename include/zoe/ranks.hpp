// The ranks an Engine runs on: one RankContext (device and communicator) per data-parallel
// rank, made as threads of this process (make_local_ranks), from a launcher's environment
// (rank_from_environment), or from a device of the caller's choice (make_host_device,
// best_available_device). Declared apart from zoe/engine.hpp because src/device and
// src/comm implement them and sit below the engine (docs/architecture.md, "Dependency rule");
// zoe/engine.hpp includes this header, so a trainer needs only that one.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "zoe/error.hpp"  // what they throw

namespace zoe {

class Device;        // opaque: memory, streams, copies (host or CUDA backend)
class Communicator;  // opaque: collectives (host/Gloo or NCCL backend)

/// The host device: device memory is host memory, streams are in-order executors.
/// ZOE_HOST_MEMORY=discrete makes it model a GPU's separate memory instead (copies on
/// copy-engine threads, host code kept out of device memory; ZOE_HOST_COPY_GBPS,
/// ZOE_HOST_COPY_LATENCY_US): a testing aid, see docs/architecture.md. Throws ConfigError
/// for an invalid value of those variables.
std::shared_ptr<Device> make_host_device();
/// The CUDA device `ordinal` if a GPU is usable, else the host device (logged).
std::shared_ptr<Device> best_available_device(int ordinal = 0);

/// One rank's device and communicator.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<Device> device;
  std::shared_ptr<Communicator> comm;
  /// Ranks that run on this machine (this one included), >= 1: what zoe.host_memory_budget
  /// "auto" divides the machine's spare memory by. make_local_ranks: world_size;
  /// rank_from_environment: LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun)
  /// or SLURM_NTASKS_PER_NODE (srun), else world_size (every rank counted as local).
  int local_world_size = 1;
};

/// `world_size` ranks as threads of this process, each with its own host device and a
/// communicator of one in-process group (no sockets: each rank reads its peers' buffers
/// directly, with results bitwise equal to the multi-process Gloo backend's). Element i
/// is rank i; run each rank's collectives from its own thread (run_ranks). `timeout_s`
/// (seconds) bounds how long a collective waits for every rank to join; it then throws
/// TimeoutError naming the collective and the missing rank. Throws UsageError if
/// world_size < 1 or timeout_s is not a positive finite number. The devices follow
/// ZOE_HOST_MEMORY as make_host_device() does.
std::vector<RankContext> make_local_ranks(int world_size, double timeout_s = 300.0);

/// This process's rank from the launcher's environment (torchrun: RANK/WORLD_SIZE/
/// LOCAL_RANK/MASTER_ADDR/MASTER_PORT; mpirun: OMPI_COMM_WORLD_*; srun: SLURM_*), on the
/// best available device. The ranks meet through torchrun's agent store when torchrun sets
/// TORCHELASTIC_USE_AGENT_STORE=True, else through a store rank 0 serves at MASTER_PORT, or,
/// for mpirun on one host without MASTER_ADDR, on a local socket named after the job id.
/// Throws Error listing what was found (and saying what to set) when variables are missing,
/// TimeoutError when the store or a peer is not reached within `timeout_s` seconds.
RankContext rank_from_environment(double timeout_s = 300.0);

/// Calls fn(ctx) on one thread per rank and joins them. A rank whose fn throws aborts its
/// communicator with the exception's message (its peers' collectives then throw
/// RankFailedError naming it at once instead of waiting out the timeout). Rethrows the first
/// exception (by rank) that is not a RankFailedError, else the first one.
void run_ranks(const std::vector<RankContext>& ranks, const std::function<void(RankContext&)>& fn);

}  // namespace zoe
