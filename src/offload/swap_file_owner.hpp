// Who owns an NVMe swap file, and the clean-up of files whose owner is gone.
//
// A store's file is <dir>/zoe-rank<R>-<pid>-<n>.swap and starts with a 4 KiB header block
// naming its owner: the pid and rank, the process's start time, its pid namespace, the boot
// and the host. A process killed before its store's destructor ran (SIGKILL, OOM killer, a
// crash) leaves its file behind; the next store created in the same directory removes every
// file that is provably a dead zoe process's, and logs each one.
//
// A file is removed only if its name has exactly that pattern, it is a regular file (not a
// link), and either
//   - its header is a valid zoe header (magic, version, CRC32C) naming the pid and rank of
//     its name, written on this host, and its owner is gone: written in an earlier boot, or
//     in this boot and this pid namespace with kill(pid, 0) failing with ESRCH or the pid now
//     held by a process that started at another time (a reused pid); or
//   - it is empty and kill(pid, 0) fails with ESRCH: an empty file holds no data (a process
//     killed between creating the file and writing its header, or a leftover of the refused
//     O_DIRECT opens fixed in io/direct_file.cpp).
// Everything else is left alone: this process's files, a live process's, another host's or
// pid namespace's (whose liveness cannot be seen from here), and any file without a zoe
// header (logged once per process as "not a zoe swap file").
//
// Thread-safety: all functions may be called from any thread; two threads (or processes)
// cleaning the same directory at once each remove a file at most once between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zoe::offload {

/// Bytes of the header block at offset 0 of every swap file (the extents follow it).
inline constexpr std::size_t kSwapHeaderBytes = 4096;

/// The process that wrote a swap file.
struct SwapFileOwner {
  std::int64_t pid = 0;
  std::int32_t rank = 0;
  std::uint64_t start_ticks = 0;    // process start, clock ticks after boot (/proc/<pid>/stat field 22)
  std::uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid (0: unknown)
  std::string boot_id;              // /proc/sys/kernel/random/boot_id (empty: unknown)
  std::string host;                 // gethostname()

  /// This process, as the owner of a file of `rank`. Never throws (unknown fields stay empty).
  static SwapFileOwner self(int rank);
  bool operator==(const SwapFileOwner&) const = default;
};

/// "zoe-rank<rank>-<pid>-<serial>.swap", the file name of a store.
std::string swap_file_name(int rank, std::int64_t pid, unsigned serial);

/// Writes the header block of `owner` into `block` (kSwapHeaderBytes bytes, zero-padded).
/// Throws UsageError if boot_id or host is longer than the header holds (47, 71 bytes).
void encode_swap_header(const SwapFileOwner& owner, void* block);

/// The owner recorded in a header block of `bytes` bytes, or nullopt if it is not a valid
/// zoe swap header (too short, wrong magic or version, CRC32C mismatch). Never throws.
std::optional<SwapFileOwner> decode_swap_header(const void* block, std::size_t bytes);

/// Removes the files of dead zoe processes in `dir` (rules above) and logs one line per
/// removed file (path, owner pid and rank, bytes freed). Returns the removed paths. Never
/// throws: a directory that cannot be read, or a file that cannot be removed, is logged.
std::vector<std::string> remove_stale_swap_files(const std::string& dir);

}  // namespace zoe::offload
