#include "tools/zoe-ckpt/export.hpp"

#include "src/common/check.hpp"

namespace zoe_ckpt {

void export_checkpoint(const ExportOptions& options) {
  ZOE_THROW(zoe::UsageError, "zoe-ckpt export: not built in this version (safetensors export comes with issue 18's "
                             "safetensors work); '", options.checkpoint, "' is unchanged");
}

}  // namespace zoe_ckpt
