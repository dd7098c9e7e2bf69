// Opening a file that must be a regular file (a checkpoint's manifest or rank file): a FIFO
// would block open(2) or read(2) forever, /dev/zero or /dev/urandom would be read without end,
// and a directory reads as an error that says nothing useful. These helpers refuse them all
// before reading a byte, naming the path and what it is instead ("a FIFO", "a directory").
//
// Thread-safety: plain functions (no shared state). Errors: as each says.
#pragma once

#include <cstdint>
#include <string>

namespace zoe {

/// Opens `path` read-only (O_CLOEXEC; O_NONBLOCK for the open only, so a FIFO without a writer
/// does not block) and returns the descriptor, which the caller closes. Returns -1 with errno
/// set when open(2) fails (the caller names the failure: "it is missing", ...). Throws
/// CorruptionError "'<path>' is not a regular file (it is a FIFO)" when it opened something
/// else (a directory, a FIFO, a character or block device, a socket; the descriptor closed),
/// SystemError naming the path when fstat(2) or fcntl(2) fails.
int open_regular_file(const std::string& path);

/// Throws CorruptionError as open_regular_file when `path` exists and is not a regular file
/// (stat(2), symbolic links followed); does nothing when it is one or cannot be stat'ed (the
/// caller's open reports that).
void require_regular_file(const std::string& path);

/// The whole content of the regular file `path`, at most `max_bytes` bytes. Throws SystemError
/// (errno of open(2), e.g. ENOENT) naming the path when it cannot be opened, CorruptionError
/// when it is not a regular file (as open_regular_file) or holds more than `max_bytes` bytes
/// (saying both sizes), IoError naming it when a read fails.
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes);

}  // namespace zoe
