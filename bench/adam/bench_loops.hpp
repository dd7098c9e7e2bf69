// The two reference loops zoe-adam-bench compares CpuAdam::step with. Both run over the same
// kChunk chunks as CpuAdam, in a oneTBB arena of the given size.
#pragma once

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>

namespace zoe::bench {

/// STREAM-style bound of the Adam access pattern: reads p, m, v, g (4 fp32 arrays of n) and
/// writes p, m, v back in place (x = x + 0 * g with a run-time zero, so values are unchanged),
/// 28 bytes per element, with the widest vectors the CPU has. nontemporal: streaming stores.
void stream_bound_pass(tbb::task_arena& arena, float* p, float* m, float* v, const float* g, std::size_t n,
                       bool nontemporal);

/// A plain Adam loop as one would write it without care for speed (scalar C++, -O3, no ISA
/// flags), same math as CpuAdam; out (bf16 bits) may be null.
void plain_adam_pass(tbb::task_arena& arena, std::int64_t step, float* p, float* m, float* v, const float* g,
                     std::uint16_t* out, std::size_t n);

}  // namespace zoe::bench
