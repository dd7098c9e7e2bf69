// Which directory zoe-ckpt reads for the one it is given: the engine checkpoint there (or its
// .old twin after an interrupted save, as a load reads it), or, for a trainer's checkpoint
// directory (zoe-gpt --checkpoint-dir DIR keeps the engine's files in DIR/engine next to its own
// trainer-<step>.json), the engine checkpoint inside. Not thread-safe (writes to `notes`).
#pragma once

#include <ostream>
#include <string>

namespace zoe_ckpt {

/// The directory to read for `dir`: `dir` if it holds a complete checkpoint, else `dir`.old if
/// that does, else the same for `dir`/engine (a trainer's checkpoint directory). Each choice
/// other than `dir` itself is said on `notes` in one line. Throws zoe::SystemError (ENOENT)
/// when none holds one, naming `dir` and, when a directory right under it holds a checkpoint,
/// that directory ("point zoe-ckpt there").
std::string directory_to_read(const std::string& dir, std::ostream& notes);

}  // namespace zoe_ckpt
