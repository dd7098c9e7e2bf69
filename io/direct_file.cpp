#include "io/direct_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe::io {
namespace {

constexpr std::uint64_t kAlign = 4096;

// Opens with O_DIRECT if allowed; returns the fd and whether it is direct.
std::pair<int, bool> open_maybe_direct(const std::string& path, int flags, const FileOptions& options) {
  if (options.buffered) {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
    if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open '", path, "'");
    return {fd, false};
  }
  int err = EINVAL;
  if (!options.simulate_direct_refusal) {
    int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) return {fd, true};
    err = errno;
    if (err != EINVAL) ZOE_THROW_ERRNO(err, "cannot open '", path, "'");
  }
  if (options.require_direct)
    ZOE_THROW_CONFIG("zoe.require_direct_io", "the filesystem of '", path,
                     "' refuses O_DIRECT (errno ", err, ", e.g. tmpfs before Linux 6.6); choose a ",
                     "directory on a disk or set zoe.require_direct_io = false");
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open '", path, "'");
  ZOE_LOG_WARN("'{}': the filesystem refuses O_DIRECT; using buffered I/O (page cache, slower, "
               "double-buffered in host memory)", path);
  return {fd, false};
}

// Some filesystems accept O_DIRECT at open and refuse the I/O: probe one aligned read.
bool direct_read_works(int fd) {
  void* block = std::aligned_alloc(kAlign, kAlign);
  if (!block) return true;  // cannot probe; the first real I/O will report errors
  ssize_t n = ::pread(fd, block, kAlign, 0);
  int err = errno;
  std::free(block);
  return !(n < 0 && err == EINVAL);
}

}  // namespace

DirectFile::DirectFile(int fd, std::string path, bool direct, std::uint64_t size, bool remove_on_close)
    : fd_(fd), path_(std::move(path)), direct_(direct), size_(size), remove_on_close_(remove_on_close) {}

DirectFile DirectFile::create(const std::string& path, std::uint64_t bytes, const FileOptions& options) {
  ZOE_CHECK_USAGE(bytes % kAlign == 0, "DirectFile::create('", path, "'): size ", bytes,
                  " is not a multiple of 4096");
  auto [fd, direct] = open_maybe_direct(path, O_RDWR | O_CREAT | O_EXCL, options);
  DirectFile file(fd, path, direct, 0, true);  // removes itself if anything below throws
  if (bytes) file.allocate(0, bytes);
  if (direct && bytes && !direct_read_works(fd)) {
    if (options.require_direct)
      ZOE_THROW_CONFIG("zoe.require_direct_io", "the filesystem of '", path,
                       "' accepts O_DIRECT at open but refuses direct reads (EINVAL)");
    ZOE_LOG_WARN("'{}': direct reads fail with EINVAL; using buffered I/O", path);
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) < 0)
      ZOE_THROW_ERRNO(errno, "cannot clear O_DIRECT on '", path, "'");
    file.direct_ = false;
  }
  file.remove_on_close_ = options.remove_on_close;
  return file;
}

DirectFile DirectFile::open(const std::string& path, const FileOptions& options) {
  auto [fd, direct] = open_maybe_direct(path, O_RDWR, options);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    ZOE_THROW_ERRNO(err, "cannot stat '", path, "'");
  }
  return DirectFile(fd, path, direct, static_cast<std::uint64_t>(st.st_size), options.remove_on_close);
}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      direct_(other.direct_),
      size_(other.size_),
      remove_on_close_(std::exchange(other.remove_on_close_, false)) {}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    size_ = other.size_;
    remove_on_close_ = std::exchange(other.remove_on_close_, false);
  }
  return *this;
}

DirectFile::~DirectFile() { close(); }

void DirectFile::close() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (remove_on_close_ && ::unlink(path_.c_str()) != 0)
    ZOE_LOG_WARN("cannot remove '{}': errno {}", path_, errno);
}

void DirectFile::allocate(std::uint64_t offset, std::uint64_t bytes) {
  if (bytes == 0) return;
  // Check free space first: a filesystem may allocate part of a range before failing with
  // ENOSPC, leaving the disk full for everyone else.
  std::uint64_t growth = offset + bytes > size_ ? offset + bytes - size_ : 0;
  struct statvfs fs {};
  if (growth && ::fstatvfs(fd_, &fs) == 0 && fs.f_frsize &&
      growth > static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize)
    throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), ENOSPC,
                  "preallocation (" + std::to_string(bytes) + " bytes requested, " +
                      std::to_string(static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize) +
                      " bytes free on its filesystem)",
                  __FILE__, __LINE__);
  int rc;
  do {
    rc = ::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    if (err == ENOSPC)
      throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), err,
                    "preallocation (not enough free disk for " + std::to_string(bytes) + " bytes)",
                    __FILE__, __LINE__);
    throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), err,
                  "preallocation (fallocate)", __FILE__, __LINE__);
  }
  size_ = std::max(size_, offset + bytes);
}

}  // namespace zoe::io
