// spare_host_memory_per_rank (zoe.host_memory_budget "auto"): MemAvailable, capped by a
// cgroup's room, less max(MemTotal / 10, 2 GiB), shared by the ranks on the machine; and a
// reading of this machine's /proc/meminfo.
#include <gtest/gtest.h>

#include "src/common/host_memory.hpp"
#include "zoe/error.hpp"

using namespace zoe;

namespace {
constexpr std::int64_t kGiB = std::int64_t{1} << 30;
}

TEST(HostMemory, SpareIsAvailableLessTheReserveSharedByTheRanks) {
  // 64 GiB machine, 40 available: 6.4 GiB (a tenth) kept back, 33.6 GiB over 2 ranks.
  const HostMemoryReading m{64 * kGiB, 40 * kGiB, std::nullopt};
  EXPECT_EQ(spare_host_memory_per_rank(m, 1), 40 * kGiB - 64 * kGiB / 10);
  EXPECT_EQ(spare_host_memory_per_rank(m, 2), (40 * kGiB - 64 * kGiB / 10) / 2);
  // A small machine keeps 2 GiB back, not a tenth.
  EXPECT_EQ(spare_host_memory_per_rank(HostMemoryReading{8 * kGiB, 6 * kGiB, std::nullopt}, 1), 4 * kGiB);
  // A cgroup limit with less room than MemAvailable caps it.
  EXPECT_EQ(spare_host_memory_per_rank(HostMemoryReading{64 * kGiB, 40 * kGiB, 10 * kGiB}, 1), 10 * kGiB - 64 * kGiB / 10);
  // Less available than the reserve: nothing, never negative.
  EXPECT_EQ(spare_host_memory_per_rank(HostMemoryReading{64 * kGiB, 5 * kGiB, std::nullopt}, 4), 0);
  EXPECT_THROW(spare_host_memory_per_rank(m, 0), UsageError);
  EXPECT_EQ(describe_spare_host_memory(HostMemoryReading{8 * kGiB, 6 * kGiB, 7 * kGiB}, 2),
            "2048 MiB per rank (MemAvailable 6144 MiB, cgroup room 7168 MiB, 2048 MiB kept back, 2 ranks on this machine)");
}

TEST(HostMemory, ReadsThisMachine) {
  const HostMemoryReading m = read_host_memory();
  EXPECT_GT(m.total, 0);
  EXPECT_GT(m.available, 0);
  EXPECT_LE(m.available, m.total);
  if (m.cgroup_room) EXPECT_GE(*m.cgroup_room, 0);
}
