// Internal: the per-ISA range kernels behind CpuAdam. Each ISA lives in its own translation unit,
// compiled with only that ISA's -m flags (src/optim/CMakeLists.txt), and is called only after
// CPUID says the CPU can run it. A kernel processes elements [begin, end) of one chunk; begin is
// a multiple of CpuAdam::kChunk, so vector loops stay aligned to the arrays' base alignment.
// Thread-safety: kernels write only their own range; distinct ranges may run concurrently.
#pragma once

#include <cstddef>

#include "kernels/adam_math.hpp"
#include "kernels/elementwise.hpp"
#include "zoe/dtype.hpp"

namespace zoe::optim::detail {

struct AdamArgs {
  kernels::AdamCoeffs c;
  float* p;
  void* m;  // exp_avg: float (fp32 states) or uint16 bf16 bits (bf16_states)
  void* v;  // exp_avg_sq: likewise
  const void* grad;
  DType grad_dtype;
  void* out;  // null: no half output
  DType out_dtype;
  bool bf16_states;    // m and v are bf16 (widened on load, rounded to nearest even on store)
  bool stream;         // non-temporal stores for p, m, v and out (p, m, v 64-byte, out 32-byte aligned)
  bool stream_out;     // non-temporal stores for out only (out 32-byte aligned); p, m, v ordinary
  bool prefetch;       // software prefetch kPrefetchElements ahead on p, m, v and grad
  bool bf16_convert;   // AVX-512 only: the CPU has vcvtneps2bf16 (AVX512_BF16), for out and bf16 states
};

struct KernelTable {
  void (*adam)(const AdamArgs& a, std::size_t begin, std::size_t end);
  /// CpuAdam::sum_squares over [begin, end) (begin a multiple of kernels::kSumSquaresChunk):
  /// sums[k] = the sum of squares of the k-th kSumSquaresChunk-element chunk of the range in
  /// the lane order kernels::kSumSquaresChunk documents, as add_grad's sums and
  /// host_ops::sum_squares' chunks.
  void (*chunk_sums)(const void* x, DType dtype, std::size_t begin, std::size_t end, double* sums);
  /// CpuAdam::add_grad over [begin, end) (begin a multiple of kernels::kSumSquaresChunk):
  /// grad[i] = float(src[i]) (first) or grad[i] + float(src[i]) (fp32 add); sums[k] = the sum
  /// of squares of the k-th kSumSquaresChunk-element chunk of the range (in the lane order
  /// kernels::kSumSquaresChunk documents).
  /// Returns false if a written grad[i] is not finite; may return true then if that element's
  /// chunk sum is inf or NaN (the AVX-512 path: the caller checks the sums). stream:
  /// non-temporal stores of grad (grad 64-byte aligned; paths without a vector version ignore it).
  bool (*add_grad)(const void* src, DType src_dtype, float* grad, bool first, bool stream, std::size_t begin,
                   std::size_t end, double* sums);
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

/// Software prefetch distance of the update loops when AdamArgs::prefetch (a measured choice of
/// CpuAdam), in elements: 4 KiB of fp32 ahead on each of the four input streams (with bf16
/// states the same element distance, 2 KiB, on m and v). Measured on a 2-vCPU Zen 5 VM (one
/// thread, 16M elements, bf16 states, where the dependent sqrt / divide chain keeps the core from
/// running far enough ahead on its own): CpuAdam against its bound 0.89 with 256 elements ahead,
/// 0.94-0.96 with 512, 0.99-1.03 with 1,024, 0.99 with 2,048, 0.99-1.02 with 4,096; fp32 states
/// picked no prefetch at any distance. Whether to prefetch at all stays a per-CPU, per-size
/// measurement (CpuAdam's store trials): it lost 3-8% on one thread of a Zen 4 VM and gained
/// under load on a Xeon VM at 256. Prefetching past the array end is harmless (no fault).
inline constexpr std::size_t kPrefetchElements = 1024;

/// Chunk of add_grad's sums of squares (kernels::kSumSquaresChunk: host_ops' and the device's).
/// Vector TUs use only this constant of kernels/elementwise.hpp, none of its inline functions.
inline constexpr std::size_t kGradSumChunk = kernels::kSumSquaresChunk;

// Scalar pieces the vector kernels call for their tails (defined in adam_scalar.cpp, compiled
// without ISA flags; vector TUs call no inline math of their own, so no AVX-512 copy of a shared
// inline function can be picked by the linker for the scalar path).
/// adam_update over [begin, end) with ordinary stores (fp32 or bf16 states per a.bf16_states).
void adam_scalar_range(const AdamArgs& a, std::size_t begin, std::size_t end);
/// KernelTable::chunk_sums, scalar (also the tail of the vector paths).
void chunk_sums_scalar(const void* x, DType dtype, std::size_t begin, std::size_t end, double* sums);
/// A chunk's sum from its kernels::kSumSquaresLanes lanes: lane 0 + lane 1 + ..., left to right from 0.
double chunk_sum_of_lanes(const double* lanes);
/// KernelTable::add_grad, scalar (also the tail of the vector paths).
bool add_grad_scalar(const void* src, DType src_dtype, float* grad, bool first, bool stream, std::size_t begin,
                     std::size_t end, double* sums);

}  // namespace zoe::optim::detail
