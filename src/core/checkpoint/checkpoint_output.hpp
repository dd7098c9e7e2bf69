// Where the offline tools (zoe-ckpt reshard / export, checkpoint_reshard.hpp and
// checkpoint_export.hpp) may write: never over what they did not write and never into the
// checkpoint they read. A reshard replaces OUT through the directory protocol
// (checkpoint_dir.hpp), which renames OUT to OUT.old and removes it, and removes OUT.tmp: so
// each of OUT, OUT.tmp and OUT.old must be absent, or hold only what a zoe save writes
// (manifest.json and rank<R>.zoe; OUT and OUT.old may be empty directories), and replacing a
// checkpoint (OUT or OUT.old holding one) needs Overwrite::replace_checkpoint (zoe-ckpt reshard
// --force). Paths are compared canonically (symbolic links and ".." resolved), so "DIR",
// "DIR/" and "./DIR/../DIR" are the same directory.
//
// The checks run before anything is written; a directory changed between them and the write
// (another process) is not detected. Thread-safety: plain functions. Errors: UsageError naming
// the path and why, before anything changed.
#pragma once

#include <string>

namespace zoe::ckpt {

/// What a reshard may do to an existing checkpoint at its output.
enum class Overwrite {
  refuse,              // an existing checkpoint at OUT (or OUT.old) is refused
  replace_checkpoint,  // it is replaced (crash-safe: OUT or OUT.old complete at every moment)
};

/// Checks that a reshard of the checkpoint directory `in` may write the directory `out` (see
/// above). Throws UsageError naming `out` (or OUT.tmp / OUT.old) when it is a file, a directory
/// holding anything a zoe save does not write, a checkpoint and `overwrite` is refuse, or the
/// same directory as `in`, inside it or holding it.
void check_reshard_output(const std::string& in, const std::string& out, Overwrite overwrite);

/// Checks that an export of the checkpoint directory `in` may write the file `out` (and
/// `out`.tmp): neither may be `in` or inside it (one of its rank files or its manifest).
/// Throws UsageError naming `out` and `in`.
void check_export_output(const std::string& in, const std::string& out);

}  // namespace zoe::ckpt
