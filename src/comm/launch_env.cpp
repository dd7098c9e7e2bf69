#include "src/common/quote.hpp"
#include "src/comm/launch_env.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "src/common/check.hpp"

namespace zoe {
namespace {
struct VarSet {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local;
  const char* local_size;  // ranks on this host (srun: set only with --ntasks-per-node)
};
constexpr VarSet kSets[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

std::string found_list(const EnvLookup& lookup) {
  std::string out;
  auto add = [&](const char* name) {
    auto v = lookup(name);
    out += std::string(out.empty() ? "" : ", ") + name + "=" + (v ? detail::quoted(*v) : "(unset)");
  };
  for (const auto& s : kSets) {
    add(s.rank);
    add(s.size);
    add(s.local);
  }
  add("MASTER_ADDR");
  add("MASTER_PORT");
  add("TORCHELASTIC_USE_AGENT_STORE");
  add("OMPI_COMM_WORLD_LOCAL_SIZE");
  add("PMIX_NAMESPACE");
  return out;
}

[[noreturn]] void fail(const EnvLookup& lookup, const std::string& why) {
  ZOE_THROW(Error, "cannot tell this process's rank from the launcher's environment: ", why,
            ". Found: ", found_list(lookup),
            ". Start with torchrun --no_python, mpirun or srun, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT");
}

int parse_int(const EnvLookup& lookup, const char* name, const std::string& text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    fail(lookup, std::string(name) + "=" + detail::quoted(text) + " is not an integer");
  return value;
}
}  // namespace

LaunchEnv parse_launch_env(const EnvLookup& lookup) {
  std::vector<LaunchEnv> found;
  for (const auto& s : kSets) {
    auto rank = lookup(s.rank), size = lookup(s.size), local = lookup(s.local);
    if (!rank && !size) continue;
    if (!rank || !size)
      fail(lookup, std::string(s.launcher) + "'s set is incomplete: " + (rank ? s.size : s.rank) + " is unset");
    LaunchEnv e;
    e.launcher = s.launcher;
    e.rank = parse_int(lookup, s.rank, *rank);
    e.world_size = parse_int(lookup, s.size, *size);
    e.local_rank = local ? parse_int(lookup, s.local, *local) : 0;
    if (e.world_size < 1) fail(lookup, std::string(s.size) + " must be >= 1");
    if (e.rank < 0 || e.rank >= e.world_size)
      fail(lookup, std::string(s.rank) + "=" + *rank + " is not in [0, " + s.size + "=" + *size + ")");
    if (e.local_rank < 0) fail(lookup, std::string(s.local) + " must be >= 0");
    // Unsaid (or not a plain count): every rank counted as on this host, the cautious guess
    // for what a rank may take of this host's memory.
    e.local_world_size = e.world_size;
    if (auto local_size = lookup(s.local_size)) {
      const int n = parse_int(lookup, s.local_size, *local_size);
      if (n < 1 || n > e.world_size) fail(lookup, std::string(s.local_size) + " must be in [1, " + s.size + "]");
      e.local_world_size = n;
    }
    found.push_back(e);
  }
  if (found.empty()) fail(lookup, "no launcher variables are set");
  for (const auto& e : found)
    if (e.rank != found[0].rank || e.world_size != found[0].world_size)
      fail(lookup, found[0].launcher + " and " + e.launcher + " variables disagree");
  LaunchEnv env = found[0];
  auto addr = lookup("MASTER_ADDR"), port = lookup("MASTER_PORT");
  const bool have_master = addr && !addr->empty() && port;
  if (addr) env.master_addr = *addr;
  if (port) {
    env.master_port = parse_int(lookup, "MASTER_PORT", *port);
    if (env.master_port < 1 || env.master_port > 65535) fail(lookup, "MASTER_PORT must be in [1, 65535]");
  }
  if (auto restarts = lookup("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = parse_int(lookup, "TORCHELASTIC_RESTART_COUNT", *restarts);
    if (env.restart_count < 0) fail(lookup, "TORCHELASTIC_RESTART_COUNT must be >= 0");
  }
  bool agent_store = false;
  if (auto use = lookup("TORCHELASTIC_USE_AGENT_STORE")) {
    if (*use == "True" || *use == "true" || *use == "1") agent_store = true;
    else if (!(*use == "False" || *use == "false" || *use == "0" || use->empty()))
      fail(lookup, "TORCHELASTIC_USE_AGENT_STORE=" + detail::quoted(*use) + " is neither True nor False");
  }
  if (env.world_size == 1) return env;  // RendezvousKind::none
  if ((addr && !addr->empty()) != bool(port))
    fail(lookup, std::string(port ? "MASTER_PORT" : "MASTER_ADDR") + " is set but " +
                     (port ? "MASTER_ADDR" : "MASTER_PORT") + " is not: set both (rank 0's store address) or neither");

  if (agent_store) {
    if (!have_master)
      fail(lookup, "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR and MASTER_PORT (the address of torchrun's "
                   "store) are not both set");
    env.rendezvous = RendezvousKind::torch_agent_store;
    return env;
  }
  if (have_master) {
    env.rendezvous = RendezvousKind::zoe_store_tcp;
    return env;
  }
  if (env.launcher == "mpirun") {
    auto local_size = lookup("OMPI_COMM_WORLD_LOCAL_SIZE");
    const bool one_host = local_size && parse_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", *local_size) == env.world_size;
    auto job = lookup("PMIX_NAMESPACE");
    if (!job || job->empty()) job = lookup("OMPI_MCA_ess_base_jobid");
    if (!one_host)
      fail(lookup, "mpirun started ranks on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE < OMPI_COMM_WORLD_SIZE), so rank "
                   "0's store needs an address every host can reach: pass -x MASTER_ADDR=<rank 0's host name or IP> "
                   "-x MASTER_PORT=<a free TCP port there> to mpirun");
    if (!job || job->empty())
      fail(lookup, "mpirun on one host set no job id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid) to name the rendezvous "
                   "socket: pass -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=<a free TCP port> to mpirun");
    env.rendezvous = RendezvousKind::zoe_store_local;
    env.job_id = *job;
    return env;
  }
  fail(lookup, "MASTER_ADDR and MASTER_PORT (the rendezvous address, served by rank 0) must be set when the "
               "world size is > 1");
}

const char* rendezvous_name(RendezvousKind k) {
  switch (k) {
    case RendezvousKind::none: return "none";
    case RendezvousKind::zoe_store_tcp: return "zoe's store on MASTER_PORT";
    case RendezvousKind::torch_agent_store: return "torchrun's agent store";
    case RendezvousKind::zoe_store_local: return "zoe's store on a local socket";
  }
  return "?";
}

std::string agent_store_key_prefix(const LaunchEnv& env) {
  return "zoe/attempt_" + std::to_string(env.restart_count) + "/";
}

std::string local_socket_name(const LaunchEnv& env, unsigned uid) {
  std::string id = env.job_id;
  if (id.size() > 64) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bit
    for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    id = hex;
  }
  return "zoe-rdzv-" + std::to_string(uid) + "-" + id;
}

LaunchEnv launch_env_from_process() {
  return parse_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
}

}  // namespace zoe
