// The checkpoint directory protocol: how a save replaces <dir> so that a crash (kill -9,
// power loss) at any moment leaves a complete checkpoint, and which directory a load reads.
//
// A save writes everything into <dir>.tmp (rank files, then manifest.json last: its presence
// marks the directory complete), each file fsynced, then the directory fsynced; publish()
// then renames <dir> -> <dir>.old, <dir>.tmp -> <dir> and removes <dir>.old, fsyncing the
// parent directory after each step. So at every moment <dir> or <dir>.old is complete
// (after the first save). recover(), called by the next save before it touches anything,
// finishes an interrupted publish: a complete <dir>.old with no complete <dir> is renamed back
// to <dir>; a <dir>.old next to a complete <dir> is removed. (Before format 2 the next save
// removed <dir>.old first: two crashes in a row left no checkpoint.)
//
// Thread-safety: call from one process (rank 0) at a time. Errors: SystemError naming the
// path and the call (rename, fsync, ...).
#pragma once

#include <string>

namespace zoe::ckpt {

/// Whether `dir` holds a complete checkpoint: a manifest.json (format 2) or a format-1 rank0.zoe.
bool is_complete(const std::string& dir);
/// fsync(2) of a file or directory. Throws SystemError naming it.
void fsync_path(const std::string& path);
/// Finishes a publish a crash interrupted (see above). Throws SystemError.
void recover(const std::string& dir);
/// Removes <dir>.tmp if present and creates it empty (fsynced into its parent).
void make_temp(const std::string& dir);
/// Moves the complete <dir>.tmp into place (see above). Throws SystemError.
void publish(const std::string& dir);
/// The directory a load reads: <dir> if complete, else <dir>.old if complete (a crash in a
/// publish). Throws SystemError (ENOENT) naming both when neither is.
std::string choose_for_load(const std::string& dir);

std::string temp_dir_of(const std::string& dir);
std::string old_dir_of(const std::string& dir);

}  // namespace zoe::ckpt
