#include "src/core/checkpoint/checkpoint_export.hpp"

#include <algorithm>
#include <span>
#include <vector>

#include "io/safetensors.hpp"
#include "src/common/check.hpp"
#include "src/core/checkpoint/checkpoint_output.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"
#include "src/core/checkpoint/safetensors_rounding.hpp"

namespace zoe::ckpt {

void export_safetensors(const std::string& dir, const Manifest& m, const std::string& out, DType dtype,
                        const std::map<std::string, std::string>& metadata, std::int64_t piece_elements,
                        const Progress& verify_progress, const Progress& export_progress) {
  ZOE_CHECK_USAGE(piece_elements >= 1, "checkpoint export: piece_elements must be at least 1, not ", piece_elements);
  check_export_output(dir, out);
  std::vector<io::SafetensorsTensorSpec> specs;
  std::uint64_t total = 0;
  std::int64_t largest = 1;
  for (const GroupEntry& g : m.groups)
    for (const ParamEntry& p : g.params) {
      specs.push_back({p.name, core::safetensors_dtype_name(dtype), p.shape});
      total += static_cast<std::uint64_t>(p.numel) * sizeof(float);
      largest = std::max(largest, p.numel);
    }
  // Every CRC before the output exists: a corrupt checkpoint leaves nothing behind.
  verify_checkpoint(dir, m, verify_progress);

  CheckpointReader reader(dir, m);
  io::SafetensorsWriter writer(out, std::move(specs), metadata);
  core::SafetensorsRounder rounder(writer, dtype);
  std::vector<float> piece(static_cast<std::size_t>(std::min(piece_elements, largest)));
  std::uint64_t done = 0;
  if (export_progress) export_progress(0, total);
  for (std::size_t g = 0; g < m.groups.size(); ++g)
    for (const ParamEntry& p : m.groups[g].params)
      for (std::int64_t begin = 0; begin < p.numel; begin += piece_elements) {
        const std::span<float> span(piece.data(), static_cast<std::size_t>(std::min(piece_elements, p.numel - begin)));
        reader.read(g, 0 /* master */, p.offset + begin, span, -1);
        rounder.append(span);
        done += span.size_bytes();
        if (export_progress) export_progress(done, total);
      }
  writer.commit();  // without it (an exception above) the writer removes `out`.tmp
}

}  // namespace zoe::ckpt
