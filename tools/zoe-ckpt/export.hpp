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
/// zoe::Error naming the file on failure. Read the values with zoe::ckpt::read_manifest_file
/// and zoe::ckpt::CheckpointReader::read(group, 0 /* master */, param.offset + begin, span,
/// -1), one piece at a time (src/core/checkpoint_reader.hpp).
void export_checkpoint(const ExportOptions& options);

}  // namespace zoe_ckpt
