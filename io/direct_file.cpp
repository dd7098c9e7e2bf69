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

// Opens `path` without O_DIRECT (O_DIRECT is turned on afterwards by enable_direct): a
// filesystem that refuses O_DIRECT (ramfs, tmpfs before Linux 6.6) fails an O_DIRECT open
// with EINVAL only after O_CREAT has created the file, so opening with the flag would leave
// an empty file behind and make an O_EXCL retry fail with EEXIST.
int open_fd(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open '", path, "'");
  return fd;
}

// Turns O_DIRECT on for `fd` (fcntl applies the same check as open); returns whether the
// file is now direct. A refusal (EINVAL) is a ConfigError when direct I/O is required, else
// one warning and buffered I/O.
bool enable_direct(int fd, const std::string& path, const FileOptions& options) {
  if (options.buffered) return false;
  int err = EINVAL;
  if (!options.simulate_direct_refusal) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) ZOE_THROW_ERRNO(errno, "cannot read the flags of '", path, "'");
    if (::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0) return true;
    err = errno;
    if (err != EINVAL) ZOE_THROW_ERRNO(err, "cannot turn on O_DIRECT for '", path, "'");
  }
  if (options.require_direct)
    ZOE_THROW_CONFIG("zoe.require_direct_io", "the filesystem of '", path,
                     "' refuses O_DIRECT (errno ", err, ", e.g. ramfs, or tmpfs before Linux 6.6); choose a ",
                     "directory on a disk or set zoe.require_direct_io = false");
  ZOE_LOG_WARN("'{}': the filesystem refuses O_DIRECT; using buffered I/O (page cache, slower, "
               "double-buffered in host memory)", path);
  return false;
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
  const int fd = open_fd(path, O_RDWR | O_CREAT | O_EXCL);
  DirectFile file(fd, path, false, 0, true);  // removes itself if anything below throws
  file.direct_ = enable_direct(fd, path, options);
  const bool direct = file.direct_;
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
  const int fd = open_fd(path, O_RDWR);
  DirectFile file(fd, path, false, 0, false);  // closes (never removes) if anything below throws
  file.direct_ = enable_direct(fd, path, options);
  struct stat st {};
  if (::fstat(fd, &st) != 0) ZOE_THROW_ERRNO(errno, "cannot stat '", path, "'");
  file.size_ = static_cast<std::uint64_t>(st.st_size);
  file.remove_on_close_ = options.remove_on_close;
  return file;
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
  // ramfs reports no size at all (0 blocks): nothing to check against.
  if (growth && ::fstatvfs(fd_, &fs) == 0 && fs.f_frsize && fs.f_blocks &&
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
  int err = rc != 0 ? errno : 0;
  if (err == EOPNOTSUPP) err = allocate_by_writing(offset, bytes);
  if (err != 0) {
    if (err == ENOSPC)
      throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), err,
                    "preallocation (not enough free disk for " + std::to_string(bytes) + " bytes)",
                    __FILE__, __LINE__);
    throw IoError(path_, static_cast<long long>(offset), static_cast<long long>(bytes), err,
                  "preallocation (fallocate)", __FILE__, __LINE__);
  }
  size_ = std::max(size_, offset + bytes);
}

int DirectFile::allocate_by_writing(std::uint64_t offset, std::uint64_t bytes) {
  // glibc's posix_fallocate writes a zero into every block not yet holding data; that needs
  // byte-sized writes, so O_DIRECT is off meanwhile.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0) return errno;
  if (direct_ && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return errno;
  const int err = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  if (direct_ && ::fcntl(fd_, F_SETFL, flags) != 0 && err == 0) return errno;
  return err;
}

}  // namespace zoe::io
