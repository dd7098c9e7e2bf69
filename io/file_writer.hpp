// A file written start to end with plain write(2) (checkpoints): the whole size is reserved
// up front with fallocate, so a full disk fails before any byte is written, and every error
// is an IoError with the real errno (ENOSPC stays ENOSPC, with the bytes the file needs and
// the bytes free), the offset and length of the failed write. finish() makes it durable
// (fsync) before the caller publishes it (rename).
// Thread-safety: one thread per FileWriter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zoe::io {

class FileWriter {
 public:
  /// Creates or truncates `path` (mode 0644) and reserves `total_bytes`, the size the file
  /// will have. Throws SystemError if it cannot be created, IoError (ENOSPC: "the file needs
  /// N bytes, M bytes free on its filesystem") if the space cannot be reserved. A filesystem
  /// without fallocate (EOPNOTSUPP) reserves nothing; write() then reports ENOSPC.
  FileWriter(std::string path, std::uint64_t total_bytes);
  /// Closes the file if finish() was not reached (the caller removes what it abandons).
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  /// Appends `bytes` bytes (short writes and EINTR retried). Throws IoError naming the path,
  /// the offset and length of the failed write and its errno (ENOSPC with the bytes needed).
  void write(const void* data, std::size_t bytes);
  /// fsync and close. Throws IoError if either fails (write-back errors surface here), or
  /// UsageError if fewer or more than `total_bytes` were written.
  void finish();

  const std::string& path() const noexcept { return path_; }
  /// Bytes written so far.
  std::uint64_t written() const noexcept { return written_; }

 private:
  [[noreturn]] void fail(int err, std::uint64_t offset, std::uint64_t bytes, const char* what) const;

  std::string path_;
  std::uint64_t total_ = 0;
  std::uint64_t written_ = 0;
  int fd_ = -1;
};

}  // namespace zoe::io
