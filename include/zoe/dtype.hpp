// Element types zoe stores and moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zoe {

/// fp32 (IEEE binary32), bf16 (bfloat16: 8-bit exponent, 7-bit mantissa), fp16 (IEEE binary16).
enum class DType : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

/// Bytes per element: 4, 2, 2.
constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::f32 ? 4 : 2; }

/// "fp32", "bf16", "fp16".
constexpr std::string_view dtype_name(DType t) noexcept {
  return t == DType::f32 ? "fp32" : t == DType::bf16 ? "bf16" : "fp16";
}

/// Storage type of the optimizer states exp_avg and exp_avg_sq (zoe.optimizer_state_dtype).
/// The master weights are always fp32 and the AdamW math always fp32. fp32: 4 bytes each (the
/// default, DeepSpeed's). bf16: 2 bytes each, widened exactly before the math and rounded to
/// nearest, ties to even, after it (optim::CpuAdam's class comment says why that rounding).
enum class OptimizerStateDType : std::uint8_t { fp32 = 0, bf16 = 1 };

/// Bytes of one element of one state array: 4 (fp32) or 2 (bf16).
constexpr std::size_t optimizer_state_dtype_size(OptimizerStateDType t) noexcept {
  return t == OptimizerStateDType::bf16 ? 2 : 4;
}

}  // namespace zoe
