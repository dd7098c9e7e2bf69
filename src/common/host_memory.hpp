// What this machine's host memory can spare, for zoe.host_memory_budget "auto": the kernel's
// MemAvailable (memory a new allocation gets without swapping: free memory plus the page
// cache and slabs it can reclaim), capped by the cgroup's room when the process runs under a
// memory limit (cgroup v2 memory.max - memory.current, as in a container), less a reserve
// for everything else on the machine, shared by the ranks that run on it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zoe {

/// One reading of the machine's memory, in bytes.
struct HostMemoryReading {
  std::int64_t total = 0;      ///< MemTotal
  std::int64_t available = 0;  ///< MemAvailable
  /// The cgroup's room (memory.max - memory.current); empty without a limit.
  std::optional<std::int64_t> cgroup_room;
};

/// Reads /proc/meminfo and, when present, /sys/fs/cgroup/memory.max and memory.current.
/// Throws Error naming the file when /proc/meminfo cannot be read or lacks MemTotal /
/// MemAvailable. Thread-safe.
HostMemoryReading read_host_memory();

/// The budget one rank may take: (min(available, cgroup_room) - reserve) / ranks_on_machine,
/// at least 0, where reserve = max(total / 10, 2 GiB) is left for the trainer's own host
/// memory (data loading, activations it offloads), the pinned buffers and the OS. Bytes.
/// `ranks_on_machine` >= 1 (UsageError otherwise). Pure.
std::int64_t spare_host_memory_per_rank(const HostMemoryReading& m, int ranks_on_machine);

/// One line for the log: "<spare> MiB per rank (MemAvailable <a> MiB[, cgroup room <c> MiB],
/// <reserve> MiB kept back, <n> rank(s) on this machine)".
std::string describe_spare_host_memory(const HostMemoryReading& m, int ranks_on_machine);

}  // namespace zoe
