// A file for the io_uring engine: opened with O_DIRECT when the filesystem allows it
// (buffered I/O with one logged warning, or a ConfigError when direct I/O is required,
// when it does not), and grown only by fallocate, so running out of disk is an error
// at allocation time (start-up) rather than in the middle of a write.
//
// Notes: the file is opened without O_DIRECT and O_DIRECT is then turned on with fcntl:
// a filesystem refusing it (ramfs; tmpfs before Linux 6.6) returns EINVAL from an O_DIRECT
// open only after O_CREAT made the file, which would leave an empty file behind and make
// the O_EXCL retry fail with EEXIST. fcntl applies the same check, on the file already
// ours. The file probes the first 4 KiB with a direct read after allocation because some
// filesystems accept the flag and refuse the I/O. A filesystem without fallocate (ramfs:
// EOPNOTSUPP) is grown by writing a zero into each block (posix_fallocate's emulation), which
// reserves the memory or disk as well.
// Thread-safety: const methods may be called from any thread; allocate() and the
// destructor must not race with each other.
#pragma once

#include <cstdint>
#include <string>

namespace zoe::io {

struct FileOptions {
  /// Raise ConfigError (key "zoe.require_direct_io") instead of falling back to
  /// buffered I/O when the filesystem refuses O_DIRECT.
  bool require_direct = false;
  /// Unlink the file when the DirectFile is destroyed.
  bool remove_on_close = false;
  /// Open without O_DIRECT on purpose (page cache, no alignment rules, no warning).
  bool buffered = false;
  /// Test hook: behave as if the filesystem refused O_DIRECT with EINVAL (as ramfs does).
  bool simulate_direct_refusal = false;
};

class DirectFile {
 public:
  /// Creates `path` (O_CREAT | O_EXCL: an existing file is never clobbered, SystemError
  /// EEXIST) and preallocates `bytes` (a multiple of 4096; may be 0). Throws IoError
  /// (ENOSPC: "not enough free disk for N bytes") if the space cannot be reserved,
  /// ConfigError if direct I/O is required and refused, SystemError for open failures.
  static DirectFile create(const std::string& path, std::uint64_t bytes, const FileOptions& options = {});
  /// Opens an existing file for reading and writing (same O_DIRECT handling).
  static DirectFile open(const std::string& path, const FileOptions& options = {});

  DirectFile() = default;
  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile();

  /// Grows the file by fallocate so [offset, offset + bytes) is reserved on disk.
  /// Throws IoError naming path, offset, length and errno (ENOSPC = out of disk).
  void allocate(std::uint64_t offset, std::uint64_t bytes);

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  /// True if I/O bypasses the page cache (O_DIRECT); requests must then be 4096-aligned.
  bool direct() const noexcept { return direct_; }
  /// Bytes reserved so far (the file's size).
  std::uint64_t size() const noexcept { return size_; }

 private:
  DirectFile(int fd, std::string path, bool direct, std::uint64_t size, bool remove_on_close);
  void close() noexcept;
  // Grows the file by writing zeros (filesystems without fallocate); returns 0 or an errno.
  int allocate_by_writing(std::uint64_t offset, std::uint64_t bytes);

  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
  std::uint64_t size_ = 0;
  bool remove_on_close_ = false;
};

}  // namespace zoe::io
