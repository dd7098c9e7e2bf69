// Per-element math of the deterministic reductions behind reduce_scatter and all_reduce
// (both backends). Each element's contributions are summed in rank order 0, 1, ..., N-1
// in fp32 (bf16/fp16 inputs widened exactly), then averaged by dividing the fp32 sum by
// N (ReduceOp::avg), then rounded once to the dtype. Because the order and the rounding
// are fixed, every rank computes identical bits, and an all-reduce followed by taking
// one slice equals a reduce-scatter bitwise at every world size.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>

#include "kernels/elementwise.hpp"
#include "kernels/hd.hpp"

namespace zoe::kernels {

/// Reduction of element i over `world` slices (slices[r] is rank r's contribution).
ZOE_HD float reduce_ranks(const void* const* slices, DType t, int world, std::size_t i, bool avg) {
  float acc = load_f32(slices[0], t, i);
  for (int r = 1; r < world; ++r) acc += load_f32(slices[r], t, i);
  if (avg) acc = acc / static_cast<float>(world);
  return acc;
}

/// The same reduction over slices laid out back to back: rank r's element i is element
/// r*stride + i of `base` (the CUDA backend's receive buffer).
ZOE_HD float reduce_ranks_strided(const void* base, DType t, int world, std::size_t stride, std::size_t i,
                                  bool avg) {
  float acc = load_f32(base, t, i);
  for (int r = 1; r < world; ++r) acc += load_f32(base, t, static_cast<std::size_t>(r) * stride + i);
  if (avg) acc = acc / static_cast<float>(world);
  return acc;
}

/// fp64 sum of element i over `world` slices, in rank order.
ZOE_HD double reduce_ranks_f64(const double* const* slices, int world, std::size_t i) {
  double acc = slices[0][i];
  for (int r = 1; r < world; ++r) acc += slices[r][i];
  return acc;
}

/// fp64 sum of element i over slices laid out back to back (stride elements apart).
ZOE_HD double reduce_ranks_strided_f64(const double* base, int world, std::size_t stride, std::size_t i) {
  double acc = base[i];
  for (int r = 1; r < world; ++r) acc += base[static_cast<std::size_t>(r) * stride + i];
  return acc;
}

}  // namespace zoe::kernels
