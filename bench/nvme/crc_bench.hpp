// zoe-nvme-bench's CRC32C case: every byte the NVMe store moves is checksummed, so CRC32C must
// keep up with memory. Each CRC32C path this CPU runs against a plain read pass over the same
// buffer (64-bit XOR, which the compiler vectorises), interleaved in the same run, both timed by
// the thread's CPU clock (one thread each; time given to other processes is left out).
#pragma once

#include <cstddef>

namespace zoe::bench {

/// Times every supported CRC32C path and the read pass over a `bytes` buffer (filled, faulted
/// in), `repetitions` rounds, the order alternating per round; prints per path the median GB/s
/// and the median per-round ratio to the read pass (min and max too), one JSON line each with
/// `json` (the active path's line has "active": true), else a text line.
void report_crc32c(std::size_t bytes, int repetitions, bool json);

}  // namespace zoe::bench
