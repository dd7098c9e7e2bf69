// The `export` subcommand: a checkpoint's parameters as one safetensors file, offline (issue
// 18). zoe-ckpt's main registers the subcommand and its options and calls export_checkpoint();
// the work is ckpt::export_safetensors (src/core/checkpoint/checkpoint_export.hpp, tested in tests/core).
#pragma once

#include <string>
#include <vector>

#include "src/core/checkpoint/checkpoint_reshard.hpp"

namespace zoe_ckpt {

struct ExportOptions {
  std::string checkpoint;             // the checkpoint directory
  std::string output;                 // the safetensors file to write
  std::string dtype = "fp32";         // fp32, bf16 or fp16
  std::vector<std::string> metadata;  // "key=value" each, the header's "__metadata__"
};

/// Writes the parameters (fp32 master weights; frozen ones: their values widened; rounded to
/// options.dtype as Engine::export_safetensors rounds) of the checkpoint in the directory options.checkpoint
/// (the one a load reads: main resolves DIR.old) to options.output, verifying every rank file
/// first; `verify_progress` / `export_progress` see the two passes (may be empty). Prints one line
/// naming the file on success. Throws UsageError for a metadata item without '=' (or with an
/// empty or repeated key) or an unknown dtype (naming it), and zoe::Error naming the file for a
/// missing or corrupt checkpoint or an unwritable output, which is then left as it was.
void export_checkpoint(const ExportOptions& options, const zoe::ckpt::Progress& verify_progress = {},
                       const zoe::ckpt::Progress& export_progress = {});

}  // namespace zoe_ckpt
