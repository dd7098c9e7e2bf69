#include "src/common/host_memory.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "src/common/check.hpp"

namespace zoe {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kMinReserve = std::int64_t{2} << 30;

// A cgroup v2 interface file's single number; empty for "max" or when absent.
std::optional<std::int64_t> cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::int64_t reserve_of(const HostMemoryReading& m) { return std::max(m.total / 10, kMinReserve); }

std::int64_t usable(const HostMemoryReading& m) {
  return m.cgroup_room ? std::min(m.available, *m.cgroup_room) : m.available;
}

}  // namespace

HostMemoryReading read_host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in.good()) ZOE_THROW(Error, "zoe.host_memory_budget \"auto\": cannot read /proc/meminfo");
  HostMemoryReading m;
  bool has_total = false, has_available = false;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    std::int64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") m.total = kib * 1024, has_total = true;
    if (key == "MemAvailable:") m.available = kib * 1024, has_available = true;
  }
  if (!has_total || !has_available)
    ZOE_THROW(Error, "zoe.host_memory_budget \"auto\": /proc/meminfo has no ", has_total ? "MemAvailable" : "MemTotal",
              " line");
  const std::optional<std::int64_t> max = cgroup_value("/sys/fs/cgroup/memory.max");
  const std::optional<std::int64_t> current = cgroup_value("/sys/fs/cgroup/memory.current");
  if (max && current) m.cgroup_room = std::max<std::int64_t>(*max - *current, 0);
  return m;
}

std::int64_t spare_host_memory_per_rank(const HostMemoryReading& m, int ranks_on_machine) {
  ZOE_CHECK_USAGE(ranks_on_machine >= 1, "spare_host_memory_per_rank: ranks_on_machine must be >= 1, got ",
                  ranks_on_machine);
  return std::max<std::int64_t>(usable(m) - reserve_of(m), 0) / ranks_on_machine;
}

std::string describe_spare_host_memory(const HostMemoryReading& m, int ranks_on_machine) {
  std::string s = detail::concat(spare_host_memory_per_rank(m, ranks_on_machine) / kMiB, " MiB per rank (MemAvailable ",
                                 m.available / kMiB, " MiB");
  if (m.cgroup_room) s += detail::concat(", cgroup room ", *m.cgroup_room / kMiB, " MiB");
  s += detail::concat(", ", reserve_of(m) / kMiB, " MiB kept back, ", ranks_on_machine,
                      ranks_on_machine == 1 ? " rank" : " ranks", " on this machine)");
  return s;
}

}  // namespace zoe
