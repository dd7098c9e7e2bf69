#include "src/core/checkpoint/safetensors_rounding.hpp"

#include "src/common/check.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe::core {

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  ZOE_THROW(UsageError, "safetensors export: unknown dtype ", static_cast<int>(dtype));
}

SafetensorsRounder::SafetensorsRounder(io::SafetensorsWriter& out, DType dtype) : out_(out), dtype_(dtype) {
  (void)safetensors_dtype_name(dtype);  // refuses an unknown dtype
}

void SafetensorsRounder::append(std::span<const float> values) {
  if (dtype_ == DType::f32) {
    out_.write(values.data(), values.size_bytes());
    return;
  }
  rounded_.resize(values.size() * dtype_size(dtype_));
  host_ops::cast(values.data(), DType::f32, rounded_.data(), dtype_, values.size());
  out_.write(rounded_.data(), rounded_.size());
}

}  // namespace zoe::core
