// The 16-bit values of a bf16 / fp16 TensorView (TensorView::as<std::uint16_t>()), converted as
// zoe converts them everywhere (the host code and the CUDA kernels share one definition): to 16
// bits by round to nearest, ties to even (bf16: fp32's top half rounded, a NaN stays a quiet NaN
// of its sign; fp16: past 65504 to inf, subnormals kept), from 16 bits exactly.
// Scalar forms for one element, span forms for a buffer. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <span>

namespace zoe {

std::uint16_t float_to_bf16(float x) noexcept;
float bf16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_fp16(float x) noexcept;
float fp16_to_float(std::uint16_t h) noexcept;

/// Element by element, `in` and `out` of equal size and not overlapping. Throws UsageError
/// (naming the call and the sizes) otherwise, before writing anything.
void float_to_bf16(std::span<const float> in, std::span<std::uint16_t> out);
void bf16_to_float(std::span<const std::uint16_t> in, std::span<float> out);
void float_to_fp16(std::span<const float> in, std::span<std::uint16_t> out);
void fp16_to_float(std::span<const std::uint16_t> in, std::span<float> out);

}  // namespace zoe
