// The host device's elementwise loops (single-threaded, run on a stream's thread) over
// the shared per-element math in kernels/elementwise.hpp. Exposed for tests and for
// code that needs the same math synchronously on the calling thread.
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>

#include "kernels/adam_math.hpp"
#include "zoe/dtype.hpp"

namespace zoe::host_ops {

void fill(void* dst, DType dtype, std::size_t n, float value);
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n);
void scale(void* x, DType dtype, std::size_t n, float factor);
void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n);
/// Sum of squares in fp64 in the order kernels::kSumSquaresChunk documents (chunks of lanes).
double sum_squares(const void* x, DType dtype, std::size_t n);
/// Device::adam_step's loop: kernels::adam_update per element, split over oneTBB threads
/// (elementwise, so the split never changes a bit).
void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
               DType grad_dtype, void* out, DType out_dtype, std::size_t n);
/// The builds of adam_step's loop (host_adam.cpp): one source compiled for the baseline
/// x86-64, AVX2 (+F16C) and AVX-512 (F/BW/VL/DQ), all giving the same bits.
enum class AdamIsa { baseline, avx2, avx512 };
/// Whether this CPU can run build `isa` (CPUID). Thread-safe.
bool adam_isa_available(AdamIsa isa);
/// The widest available build (decided once). Thread-safe.
AdamIsa best_adam_isa();
/// adam_step's loop on the calling thread with build `isa` (which must be available: else
/// the CPU faults): n elements, arguments as adam_step; `grad` is byte-addressed from its
/// first element, as is `out` (nullptr: no output).
void adam_range(AdamIsa isa, const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                const void* grad, DType grad_dtype, void* out, DType out_dtype, std::size_t n);
/// Software prefetch for loops over many small blocks (thousands of small modules' groups, each
/// in an allocation of its own), where a hardware prefetcher finds a stream only after its
/// first lines: the block kPrefetchAhead places ahead is asked for while this one is processed.
/// Hints only: no value changes. At most the first kPrefetchBytes of a block (a small group's
/// array whole; a large one's start, after which the hardware prefetcher has it).
inline constexpr std::size_t kPrefetchBytes = 4096;
/// How far ahead such a loop asks: one block of 256 elements is processed in less time than
/// its lines take to arrive. Measured (world 2, 4,000 modules of 256 fp32 elements, the CPU
/// time of a step over 400 steps, AMD EPYC Zen 5): two ahead in the grouped collectives and
/// the Adam batch x0.90 of one ahead, three or four ahead no better.
inline constexpr std::size_t kPrefetchAhead = 2;
/// body(i) for i in [0, n), in order, with prefetch(j) asked for block j kPrefetchAhead blocks
/// before body(j) runs (the first blocks' up front, block 0 excepted: its use follows at once).
template <class Prefetch, class Body>
void for_each_prefetched(std::size_t n, Prefetch&& prefetch, Body&& body) {
  for (std::size_t j = 1; j < n && j < kPrefetchAhead; ++j) prefetch(j);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) prefetch(i + kPrefetchAhead);
    body(i);
  }
}
void prefetch_read(const void* p, std::size_t bytes);
void prefetch_write(const void* p, std::size_t bytes);
/// Prefetch of the arrays adam_step with these arguments reads and writes. `out` may be null.
void prefetch_adam(const float* master, const float* exp_avg, const float* exp_avg_sq, const void* grad,
                   DType grad_dtype, const void* out, DType out_dtype, std::size_t n);

}  // namespace zoe::host_ops
