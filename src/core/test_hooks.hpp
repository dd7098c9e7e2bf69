// Test-only hooks into the engine (never set in production code). Not thread-safe to
// change while an engine runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace zoe::core::test_hooks {
/// Called on the update thread after each group's optimizer update (argument: group index).
inline std::function<void(int)> after_group_update;
/// Entries of the recorded order the Gatherer's prefetch walks visited, summed over every
/// engine in the process (each Gatherer adds its count at the end of each step()): a test
/// divides it by the calls to show the walk is O(1) amortised per call, whatever the module
/// count.
inline std::atomic<std::int64_t> prefetch_entries_visited{0};
/// Updates that took a kept read of their shard (KeptShardReads::hand_over found one) and
/// kept reads given up for a gather's read buffer (free_one dropped one), over every engine in
/// the process.
inline std::atomic<std::int64_t> kept_shard_reads_taken{0};
inline std::atomic<std::int64_t> kept_shard_reads_dropped{0};
}  // namespace zoe::core::test_hooks
