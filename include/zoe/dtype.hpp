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

}  // namespace zoe
