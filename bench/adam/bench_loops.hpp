// The two reference loops zoe-adam-bench compares CpuAdam::step with. Both run over the same
// kChunk chunks as CpuAdam, in a oneTBB arena of the given size.
#pragma once

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>

#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {

/// STREAM-style bound of the Adam access pattern: reads p, m, v, g (4 fp32 arrays of n) and
/// writes p, m, v back in place (x = x + 0 * g with a run-time zero, so values are unchanged),
/// 28 bytes per element; with out (n uint16, may be null) also writes the top 16 bits of p there,
/// 30 bytes per element. Widest vectors the CPU has (active_isa(), like CpuAdam). Stores as
/// `stores` says (non-temporal only where p, m, v are 64-byte and out 32-byte aligned, the same
/// rule as CpuAdam::step), so the bound of each store kind is measured with that kind; with
/// stores.prefetch, prefetching as CpuAdam's kernels do (so a prefetching kernel has a
/// prefetching bound).
void stream_bound_pass(tbb::task_arena& arena, float* p, float* m, float* v, const float* g, std::uint16_t* out,
                       std::size_t n, optim::Stores stores);
/// The same bound for bf16 states (CpuAdam::step with OptimizerStateDType::bf16): m and v are n
/// uint16 each (bf16 bits), read and written back unchanged (widened, x + 0 * g, the top 16 bits
/// stored), so 4 + 4 (p) + 2 + 2 (m) + 2 + 2 (v) + 4 (g) = 20 bytes per element, 22 with out.
/// Non-temporal stores where p, m, v are 64-byte and out 32-byte aligned; prefetch as CpuAdam's
/// kernels do with bf16 states (the same element distance on every stream).
void stream_bound_pass(tbb::task_arena& arena, float* p, std::uint16_t* m, std::uint16_t* v, const float* g,
                       std::uint16_t* out, std::size_t n, optim::Stores stores);

/// A plain Adam loop as one would write it without care for speed (scalar C++, -O3, no ISA
/// flags), same math as CpuAdam; out (bf16 bits) may be null.
void plain_adam_pass(tbb::task_arena& arena, std::int64_t step, float* p, float* m, float* v, const float* g,
                     std::uint16_t* out, std::size_t n);
/// The same loop with bf16 states (m, v: n uint16 each, widened, updated, rounded back with
/// kernels::f32_to_bf16).
void plain_adam_pass(tbb::task_arena& arena, std::int64_t step, float* p, std::uint16_t* m, std::uint16_t* v,
                     const float* g, std::uint16_t* out, std::size_t n);

}  // namespace zoe::bench
