#include "src/common/quote.hpp"
#include "src/common/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/common/check.hpp"

namespace zoe {
namespace {
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

[[noreturn]] void not_regular(const std::string& path, mode_t mode) {
  ZOE_THROW(CorruptionError, detail::quoted_path(path), " is not a regular file (it is ", kind_of(mode), ")");
}
}  // namespace

int open_regular_file(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    ZOE_THROW_ERRNO(err, "cannot stat ", detail::quoted_path(path), ": ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, st.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    ZOE_THROW_ERRNO(err, "fcntl of ", detail::quoted_path(path), " failed: ", std::strerror(err));
  }
  return fd;
}

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
}

std::string read_regular_file(const std::string& path, std::uint64_t max_bytes) {
  const int fd = open_regular_file(path);
  if (fd < 0) {
    const int err = errno;
    ZOE_THROW_ERRNO(err, "cannot open ", detail::quoted_path(path), ": ", std::strerror(err));
  }
  std::string text;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) ZOE_THROW_ERRNO(errno, "cannot stat ", detail::quoted_path(path), ": ", std::strerror(errno));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > max_bytes)
      ZOE_THROW(CorruptionError, detail::quoted_path(path), " holds ", size, " bytes, more than the ", max_bytes,
                " this file may have: it is not the file expected there");
    text.resize(static_cast<std::size_t>(size));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw IoError(path, static_cast<long long>(done), static_cast<long long>(text.size() - done), errno, "read",
                      __FILE__, __LINE__);
      if (n == 0) break;  // shrank while read: what is there
      done += static_cast<std::size_t>(n);
    }
    text.resize(done);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

}  // namespace zoe
