#include "io/file_writer.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

#include "src/common/check.hpp"

namespace zoe::io {

FileWriter::FileWriter(std::string path, std::uint64_t total_bytes) : path_(std::move(path)), total_(total_bytes) {
  do {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) ZOE_THROW_ERRNO(errno, "cannot create '", path_, "'");
  if (total_ == 0) return;
  int rc;
  do {
    rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(total_));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EOPNOTSUPP) fail(errno, 0, total_, "reserving the space");
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::fail(int err, std::uint64_t offset, std::uint64_t bytes, const char* what) const {
  std::string detail = what;
  if (err == ENOSPC) {
    detail += " (the file needs " + std::to_string(total_) + " bytes";
    struct statvfs fs {};
    if (fd_ >= 0 && ::fstatvfs(fd_, &fs) == 0)
      detail += ", " + std::to_string(static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize) +
                " bytes free on its filesystem";
    detail += ")";
  }
  throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), err, detail, __FILE__,
                __LINE__);
}

void FileWriter::write(const void* data, std::size_t bytes) {
  ZOE_CHECK_USAGE(fd_ >= 0, "FileWriter '", path_, "': write after finish()");
  const auto* p = static_cast<const char*>(data);
  std::size_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno, written_, left, "write");
    if (n == 0) fail(EIO, written_, left, "write (no progress)");
    p += n;
    left -= static_cast<std::size_t>(n);
    written_ += static_cast<std::uint64_t>(n);
  }
}

void FileWriter::finish() {
  ZOE_CHECK_USAGE(fd_ >= 0, "FileWriter '", path_, "': finish() called twice");
  ZOE_CHECK_USAGE(written_ == total_, "FileWriter '", path_, "': wrote ", written_, " bytes, announced ", total_);
  if (::fsync(fd_) != 0) fail(errno, 0, written_, "fsync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) fail(errno, 0, written_, "close");
}

}  // namespace zoe::io
