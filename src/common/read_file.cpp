#include "src/common/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "src/common/check.hpp"

namespace zoe {
namespace {
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};
}  // namespace

std::string read_regular_file(const std::string& path, const char* what, std::int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open ", what, " '", path, "'");
  const Fd guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) ZOE_THROW_ERRNO(errno, "cannot stat ", what, " '", path, "'");
  if (!S_ISREG(st.st_mode)) ZOE_THROW(Error, what, " '", path, "': not a regular file (", kind_of(st.st_mode), ")");
  if (st.st_size > max_bytes)
    ZOE_THROW(Error, what, " '", path, "' is ", st.st_size, " bytes, over the limit of ", max_bytes, " bytes");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ZOE_THROW_ERRNO(errno, "cannot read ", what, " '", path, "'");
    if (n == 0) break;  // shrank while read: what was there
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace zoe
