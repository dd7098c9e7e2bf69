// Per-element math of the Device's elementwise ops (fill, cast, scale, accumulate,
// sum of squares, all-finite), written once for the host device's loops and the CUDA
// kernels in kernels/elementwise.cu (ZOE_HD). Elements are addressed as raw bytes
// plus a DType, so one function serves fp32, bf16 and fp16.
// Rounding: every store to bf16/fp16 rounds to nearest even (kernels/half.hpp).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.hpp"
#include "kernels/hd.hpp"
#include "zoe/dtype.hpp"

namespace zoe::kernels {

/// Element i of `data` (dtype `t`) as fp32 (exact for every dtype).
ZOE_HD float load_f32(const void* data, DType t, std::size_t i) {
  if (t == DType::f32) return static_cast<const float*>(data)[i];
  std::uint16_t h = static_cast<const std::uint16_t*>(data)[i];
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/// Stores `v` into element i of `data` (dtype `t`), rounding to nearest even.
ZOE_HD void store_f32(void* data, DType t, std::size_t i, float v) {
  if (t == DType::f32) {
    static_cast<float*>(data)[i] = v;
  } else {
    static_cast<std::uint16_t*>(data)[i] = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
}

/// scale: x * factor in fp32 (then rounded by store_f32).
ZOE_HD float scale_value(float x, float factor) { return x * factor; }

/// accumulate: acc + x in fp32.
ZOE_HD float accumulate_value(float acc, float x) { return acc + x; }

/// sum_squares term: x^2 in fp64 (exact for any fp32 x, so the only rounding is the sum).
ZOE_HD double square_f64(float x) { return static_cast<double>(x) * static_cast<double>(x); }

/// False for +-inf and NaN. Tested on the bits so fast-math cannot fold it.
ZOE_HD bool is_finite_f32(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

/// The host's sums of squares (host_ops::sum_squares, CpuAdam's sum_squares and add_grad) work
/// in chunks of this many elements, and within a chunk in kSumSquaresLanes fp64 lanes: element
/// i of the chunk (counted from its start) is squared and added to lane i % kSumSquaresLanes,
/// each lane in index order from 0; the chunk's sum is lane 0 + lane 1 + ... + the last lane,
/// left to right from 0; the total adds the chunk sums in chunk order from 0. One order for all
/// of them, so a norm piece is the same bits whichever of them took it, for any thread count
/// and ISA, and it vectorises with no add reordered (32 lanes: four 8-wide accumulators). The
/// CUDA kernel sums in an order of its own (per-thread strides, a tree).
inline constexpr std::size_t kSumSquaresChunk = 4096;
inline constexpr std::size_t kSumSquaresLanes = 32;

}  // namespace zoe::kernels
