// Reading a small input file whole (a config, a manifest, a trainer-state record) without
// trusting what the path names: a FIFO, a character device (/dev/zero, /dev/urandom) or a
// directory would otherwise hang the reader or grow its memory without bound.
#pragma once

#include <cstdint>
#include <string>

namespace zoe {

/// The contents of the regular file at `path`, read whole. `what` names the file in messages
/// ("config file", "checkpoint manifest"). Opens without blocking (a FIFO with no writer does
/// not hang the call), then checks the open file itself (fstat), so the check and the read
/// see the same file.
/// Throws zoe::Error "<what> '<path>': not a regular file (a FIFO | a character device |
/// a directory | ...)" or "... is N bytes, over the limit of `max_bytes` bytes";
/// zoe::SystemError (with errno) when it cannot be opened or read.
/// Thread-safe (no shared state).
std::string read_regular_file(const std::string& path, const char* what, std::int64_t max_bytes);

}  // namespace zoe
