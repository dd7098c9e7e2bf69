// Where this process sits in the job, read from the environment the user's launcher
// sets: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), mpirun (OMPI_COMM_WORLD_RANK / _SIZE /
// _LOCAL_RANK), srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), and how the ranks meet
// (RendezvousKind): through torchrun's agent store when torchrun says
// TORCHELASTIC_USE_AGENT_STORE=True, else through zoe's store served by rank 0 at
// MASTER_ADDR:MASTER_PORT, or, for mpirun on one host without MASTER_ADDR, on an abstract Unix
// socket named after the job id (PMIX_NAMESPACE, else OMPI_MCA_ess_base_jobid).
// Thread-safety: pure functions (the process variant reads the environment).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace zoe {

/// How the ranks of a multi-process job find each other (rendezvous.cpp builds the store).
enum class RendezvousKind : std::uint8_t {
  none,               // world size 1: no store
  zoe_store_tcp,      // rank 0 serves zoe's TcpStore on MASTER_PORT, the others connect to MASTER_ADDR:MASTER_PORT
  torch_agent_store,  // torchrun's agent serves a torch TCPStore at MASTER_ADDR:MASTER_PORT; every rank is a client
  zoe_store_local,    // one host, no MASTER_ADDR (mpirun): rank 0 serves zoe's TcpStore on an abstract Unix socket
};
/// A short phrase for logs, e.g. "torchrun's agent store".
const char* rendezvous_name(RendezvousKind k);

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;          // device ordinal on this host (0 if the launcher sets none)
  int local_world_size = 1;    // ranks on this host (world_size if the launcher does not say)
  std::string master_addr;     // empty when world_size == 1 and MASTER_ADDR is unset
  int master_port = 0;
  std::string launcher;        // "torchrun", "mpirun" or "srun": the variables used
  RendezvousKind rendezvous = RendezvousKind::none;
  std::string job_id;          // zoe_store_local: the launcher's job id (names the socket)
  int restart_count = 0;       // torchrun's TORCHELASTIC_RESTART_COUNT (0 if unset)
};

/// torch_agent_store: the prefix of zoe's keys in the agent's store, "zoe/attempt_<restart>/"
/// (the store outlives a restart of the workers, so each attempt keeps its own keys).
std::string agent_store_key_prefix(const LaunchEnv& env);
/// zoe_store_local: the abstract socket name "zoe-rdzv-<uid>-<job id>" (a job id longer than
/// 64 bytes is replaced by its FNV-1a hash in hex, keeping the name under the 107-byte limit).
std::string local_socket_name(const LaunchEnv& env, unsigned uid);

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Parses the launcher variables found through `lookup`. When several launchers' sets
/// are present they must agree. Throws Error listing every variable found when a set is
/// incomplete, a value is not an integer, rank is outside [0, world size), sets disagree,
/// TORCHELASTIC_USE_AGENT_STORE is not True/False, or, for a world size > 1,
/// MASTER_ADDR/MASTER_PORT are missing where they are needed (torchrun and srun always; mpirun
/// when the ranks span several hosts or no job id is set): the message says what to pass.
LaunchEnv parse_launch_env(const EnvLookup& lookup);

/// parse_launch_env over this process's environment.
LaunchEnv launch_env_from_process();

}  // namespace zoe
