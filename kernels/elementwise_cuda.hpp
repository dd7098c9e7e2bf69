// Launchers of the CUDA kernels in elementwise.cu (built only when zoe has CUDA). Plain
// C++ so callers need no CUDA headers: `stream` is a cudaStream_t, the return value a
// cudaError_t (0 = success) from the launch. All run asynchronously on `stream`; the
// per-element math is kernels/elementwise.hpp and kernels/reduce.hpp, shared with the
// host device. n and count are elements.
#pragma once

#include <cstddef>

#include "kernels/adam_math.hpp"
#include "zoe/dtype.hpp"

namespace zoe::kernels::cuda {

int fill(void* dst, DType t, std::size_t n, float value, void* stream);
int cast(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n, void* stream);
int scale(void* x, DType t, std::size_t n, float factor, void* stream);
int accumulate(const void* src, DType src_t, float* acc, std::size_t n, void* stream);

/// Blocks of the first sum_squares pass; `partials` must hold this many doubles.
inline constexpr int kSumSquaresBlocks = 512;
/// *out = sum of squares in fp64. Deterministic: a fixed grid of kSumSquaresBlocks blocks,
/// each summing fixed element sets in a fixed order into `partials` (device memory),
/// then one block sums the partials in a fixed tree. Independent of timing and GPU model.
int sum_squares(const void* x, DType t, std::size_t n, double* out, double* partials, void* stream);

/// out[i] = reduction over ranks r of base[r*count + i] (kernels::reduce_ranks_strided).
/// `out` must not overlap `base`.
int reduce_ranks(const void* base, DType t, int world, std::size_t count, void* out, bool avg, void* stream);

/// out[i] = fp64 sum over ranks r, in rank order, of base[r*count + i]. `out` must not overlap `base`.
int reduce_ranks_f64(const double* base, int world, std::size_t count, double* out, void* stream);

/// Device::adam_step: kernels::adam_update per element (grid-stride), then out = master in
/// out_t (skipped when out is null). Compiled with --fmad=false so it matches the host bitwise.
int adam_step(const AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_t,
              void* out, DType out_t, std::size_t n, void* stream);

}  // namespace zoe::kernels::cuda
