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
/// Sum of squares in fp64 in the fixed order of kernels::kSumSquaresChunk.
double sum_squares(const void* x, DType dtype, std::size_t n);
bool all_finite(const void* x, DType dtype, std::size_t n);
/// Device::adam_step's loop: kernels::adam_update per element, split over oneTBB threads
/// (elementwise, so the split never changes a bit).
void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
               DType grad_dtype, void* out, DType out_dtype, std::size_t n);

}  // namespace zoe::host_ops
