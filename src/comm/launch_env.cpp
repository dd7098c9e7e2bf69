#include "src/comm/launch_env.hpp"

#include <charconv>
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
};
constexpr VarSet kSets[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

std::string found_list(const EnvLookup& lookup) {
  std::string out;
  auto add = [&](const char* name) {
    auto v = lookup(name);
    out += std::string(out.empty() ? "" : ", ") + name + "=" + (v ? "'" + *v + "'" : "(unset)");
  };
  for (const auto& s : kSets) {
    add(s.rank);
    add(s.size);
    add(s.local);
  }
  add("MASTER_ADDR");
  add("MASTER_PORT");
  return out;
}

[[noreturn]] void fail(const EnvLookup& lookup, const std::string& why) {
  ZOE_THROW(Error, "cannot tell this process's rank from the launcher's environment: ", why,
            ". Found: ", found_list(lookup),
            ". Start with torchrun --no-python, mpirun or srun, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT");
}

int parse_int(const EnvLookup& lookup, const char* name, const std::string& text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    fail(lookup, std::string(name) + "='" + text + "' is not an integer");
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
    found.push_back(e);
  }
  if (found.empty()) fail(lookup, "no launcher variables are set");
  for (const auto& e : found)
    if (e.rank != found[0].rank || e.world_size != found[0].world_size)
      fail(lookup, found[0].launcher + " and " + e.launcher + " variables disagree");
  LaunchEnv env = found[0];
  auto addr = lookup("MASTER_ADDR"), port = lookup("MASTER_PORT");
  if (env.world_size > 1 && (!addr || addr->empty() || !port))
    fail(lookup, "MASTER_ADDR and MASTER_PORT (the rendezvous address, served by rank 0) must be set when the "
                 "world size is > 1");
  if (addr) env.master_addr = *addr;
  if (port) {
    env.master_port = parse_int(lookup, "MASTER_PORT", *port);
    if (env.master_port < 1 || env.master_port > 65535) fail(lookup, "MASTER_PORT must be in [1, 65535]");
  }
  return env;
}

LaunchEnv launch_env_from_process() {
  return parse_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
}

}  // namespace zoe
