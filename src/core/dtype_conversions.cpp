// zoe/half.hpp: the 16-bit conversions for trainers, kernels/half.hpp's, which every bf16 and fp16
// value in zoe goes through.
#include <algorithm>
#include <cstdint>
#include <span>

#include "kernels/half.hpp"
#include "src/common/check.hpp"
#include "zoe/half.hpp"

namespace zoe {

std::uint16_t float_to_bf16(float x) noexcept { return kernels::f32_to_bf16(x); }
float bf16_to_float(std::uint16_t h) noexcept { return kernels::bf16_to_f32(h); }
std::uint16_t float_to_fp16(float x) noexcept { return kernels::f32_to_f16(x); }
float fp16_to_float(std::uint16_t h) noexcept { return kernels::f16_to_f32(h); }

namespace {
template <class In, class Out, class F>
void convert(const char* call, std::span<const In> in, std::span<Out> out, F f) {
  ZOE_CHECK_USAGE(in.size() == out.size(), call, ": in has ", in.size(), " elements, out ", out.size());
  const auto* a = reinterpret_cast<const char*>(in.data());
  const auto* b = reinterpret_cast<const char*>(out.data());
  ZOE_CHECK_USAGE(in.empty() || a + in.size_bytes() <= b || b + out.size_bytes() <= a, call, ": in and out overlap");
  std::transform(in.begin(), in.end(), out.begin(), f);
}
}  // namespace

void float_to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
  convert("float_to_bf16", in, out, [](float x) { return kernels::f32_to_bf16(x); });
}
void bf16_to_float(std::span<const std::uint16_t> in, std::span<float> out) {
  convert("bf16_to_float", in, out, [](std::uint16_t h) { return kernels::bf16_to_f32(h); });
}
void float_to_fp16(std::span<const float> in, std::span<std::uint16_t> out) {
  convert("float_to_fp16", in, out, [](float x) { return kernels::f32_to_f16(x); });
}
void fp16_to_float(std::span<const std::uint16_t> in, std::span<float> out) {
  convert("fp16_to_float", in, out, [](std::uint16_t h) { return kernels::f16_to_f32(h); });
}

}  // namespace zoe
