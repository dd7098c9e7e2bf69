// The `export` subcommand's hook (safetensors; issue 18). zoe-ckpt's main registers the
// subcommand and its options and calls export_checkpoint(); the safetensors work implements
// it (this file and export.cpp are its to change).
#pragma once

#include <string>

namespace zoe_ckpt {

struct ExportOptions {
  std::string checkpoint;  // the checkpoint directory
  std::string output;      // the safetensors file to write
  std::string dtype = "fp32";  // fp32 or bf16
};

/// Writes the checkpoint's parameters (fp32 master weights) to options.output. Throws
/// zoe::Error naming the file on failure. The pieces to build it from
/// (src/core/checkpoint_reshard.hpp, checkpoint_reader.hpp): m = read_manifest_file(dir);
/// verify_checkpoint(dir, m) (every CRC, before writing anything); CheckpointReader r(dir, m);
/// for each m.groups[g].params[p]: r.read(g, 0 /* master */, param.offset + begin, span, -1)
/// for [begin, begin + span.size()) of the parameter, one bounded piece at a time.
void export_checkpoint(const ExportOptions& options);

}  // namespace zoe_ckpt
