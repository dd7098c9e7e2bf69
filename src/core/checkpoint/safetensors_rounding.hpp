// The one rounding of fp32 master weights into a safetensors file, shared by the live export
// (Engine::export_safetensors, safetensors_export.cpp) and the offline one (zoe-ckpt export,
// checkpoint_export.cpp) so both write the same bytes for the same values: fp32 as it is, bf16
// and fp16 rounded to nearest even by host_ops::cast (kernels/half.hpp's conversions, the ones
// every device cast uses).
//
// Thread-safety: one thread per SafetensorsRounder (it owns a scratch buffer).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "zoe/dtype.hpp"

namespace zoe::core {

/// safetensors' name of an export dtype: "F32", "BF16" or "F16". Throws UsageError for
/// another value.
std::string safetensors_dtype_name(DType dtype);

/// Appends fp32 values to a SafetensorsWriter in the export dtype.
class SafetensorsRounder {
 public:
  /// `dtype`: f32, bf16 or f16 (UsageError otherwise). `out` must outlive the rounder.
  SafetensorsRounder(io::SafetensorsWriter& out, DType dtype);
  /// Writes `values` (fp32) rounded to the dtype: 4, 2 or 2 bytes per element, little-endian.
  /// Host memory: one rounded copy of `values` (bf16 / fp16). Throws as SafetensorsWriter::write.
  void append(std::span<const float> values);

 private:
  io::SafetensorsWriter& out_;
  DType dtype_;
  std::vector<std::byte> rounded_;
};

}  // namespace zoe::core
