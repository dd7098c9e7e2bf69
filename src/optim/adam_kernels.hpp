// Internal: the per-ISA range kernels behind CpuAdam. Each ISA lives in its own translation unit,
// compiled with only that ISA's -m flags (src/optim/CMakeLists.txt), and is called only after
// CPUID says the CPU can run it. A kernel processes elements [begin, end) of one chunk; begin is
// a multiple of CpuAdam::kChunk, so vector loops stay aligned to the arrays' base alignment.
// Thread-safety: kernels write only their own range; distinct ranges may run concurrently.
#pragma once

#include <cstddef>

#include "kernels/adam_math.hpp"
#include "zoe/dtype.hpp"

namespace zoe::optim::detail {

struct AdamArgs {
  kernels::AdamCoeffs c;
  float* p;
  float* m;
  float* v;
  const void* grad;
  DType grad_dtype;
  void* out;  // null: no half output
  DType out_dtype;
  bool stream;         // non-temporal stores (all fp32 arrays 64-byte, out 32-byte aligned)
  bool bf16_convert;   // AVX-512 only: the CPU has vcvtneps2bf16 (AVX512_BF16)
};

struct KernelTable {
  void (*adam)(const AdamArgs& a, std::size_t begin, std::size_t end);
  /// The chunk partial of sum_squares for [begin, end) (end - begin <= kChunk), in the order
  /// CpuAdam::kSumLanes documents.
  double (*sum_squares)(const void* x, DType dtype, std::size_t begin, std::size_t end);
  bool (*all_finite)(const void* x, DType dtype, std::size_t begin, std::size_t end);
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

/// Software prefetch distance of the update loops, in elements (1 KiB of fp32 ahead on each of
/// the four input streams): keeps enough cache-line fills in flight while the divides and square
/// root of earlier elements execute. Prefetching past the array end is harmless (no fault).
inline constexpr std::size_t kPrefetchElements = 256;

/// Lanes of the sum_squares accumulators (CpuAdam::kSumLanes).
inline constexpr std::size_t kSumLanes = 32;

// Scalar pieces the vector kernels call for their tails (defined in adam_scalar.cpp, compiled
// without ISA flags; vector TUs call no inline math of their own, so no AVX-512 copy of a shared
// inline function can be picked by the linker for the scalar path).
/// adam_update over [begin, end) with ordinary stores.
void adam_scalar_range(const AdamArgs& a, std::size_t begin, std::size_t end);
/// acc[(i - begin) % kSumLanes] += double(x[i])^2 for i in [begin, end), in index order.
void sum_squares_scalar_lanes(double* acc, const void* x, DType dtype, std::size_t begin, std::size_t end);
/// acc[0] + acc[1] + ... + acc[kSumLanes - 1], left to right.
double reduce_lanes(const double* acc);
bool all_finite_scalar(const void* x, DType dtype, std::size_t begin, std::size_t end);

}  // namespace zoe::optim::detail
