// Where this process sits in the job, read from the environment the user's launcher
// sets: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), mpirun (OMPI_COMM_WORLD_RANK / _SIZE /
// _LOCAL_RANK), srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); the rendezvous store
// address from MASTER_ADDR / MASTER_PORT (required when the world size is > 1).
// Thread-safety: pure functions (the process variant reads the environment).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace zoe {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;          // device ordinal on this host (0 if the launcher sets none)
  std::string master_addr;     // empty when world_size == 1 and MASTER_ADDR is unset
  int master_port = 0;
  std::string launcher;        // "torchrun", "mpirun" or "srun": the variables used
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Parses the launcher variables found through `lookup`. When several launchers' sets
/// are present they must agree. Throws Error listing every variable found when a set is
/// incomplete, a value is not an integer, rank is outside [0, world size), sets disagree,
/// or MASTER_ADDR/MASTER_PORT are missing for a world size > 1.
LaunchEnv parse_launch_env(const EnvLookup& lookup);

/// parse_launch_env over this process's environment.
LaunchEnv launch_env_from_process();

}  // namespace zoe
