#include "tools/zoe-ckpt/export.hpp"

#include <iostream>
#include <map>

#include "src/common/check.hpp"
#include "src/core/checkpoint/checkpoint_export.hpp"

namespace zoe_ckpt {
namespace {

zoe::DType parse_dtype(const std::string& s) {
  if (s == "fp32") return zoe::DType::f32;
  if (s == "bf16") return zoe::DType::bf16;
  if (s == "fp16") return zoe::DType::f16;
  ZOE_THROW(zoe::UsageError, "zoe-ckpt export: --dtype '", s, "' is not fp32, bf16 or fp16");
}

std::map<std::string, std::string> parse_metadata(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const std::string& item : items) {
    const auto eq = item.find('=');
    ZOE_CHECK_USAGE(eq != std::string::npos && eq > 0, "zoe-ckpt export: --metadata '", item,
                    "' is not KEY=VALUE with a non-empty key");
    ZOE_CHECK_USAGE(out.emplace(item.substr(0, eq), item.substr(eq + 1)).second, "zoe-ckpt export: --metadata key '",
                    item.substr(0, eq), "' given twice");
  }
  return out;
}

}  // namespace

void export_checkpoint(const ExportOptions& options, const zoe::ckpt::Progress& verify_progress,
                       const zoe::ckpt::Progress& export_progress) {
  const zoe::DType dtype = parse_dtype(options.dtype);
  const auto metadata = parse_metadata(options.metadata);
  const std::string& dir = options.checkpoint;
  const zoe::ckpt::Manifest m = zoe::ckpt::read_manifest_file(dir);
  zoe::ckpt::export_safetensors(dir, m, options.output, dtype, metadata,
                                zoe::ckpt::kExportPieceElements, verify_progress, export_progress);
  std::size_t tensors = 0;
  for (const zoe::ckpt::GroupEntry& g : m.groups) tensors += g.params.size();
  std::cout << "checkpoint " << dir << " (step " << m.step << ", world size " << m.world_size
            << ", stage " << m.stage << "): " << tensors << " tensors written to " << options.output << " as "
            << options.dtype << "\n";
}

}  // namespace zoe_ckpt
