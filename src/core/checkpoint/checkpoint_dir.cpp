#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "src/common/quote.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/common/check.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"

namespace zoe::ckpt {
namespace fs = std::filesystem;

namespace {
std::string parent_of(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  const fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    ZOE_THROW_ERRNO(errno, "cannot rename ", detail::quoted_path(from), " to ", detail::quoted_path(to), ": ", std::strerror(errno));
}

void remove_or_throw(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) ZOE_THROW_ERRNO(ec.value(), "cannot remove ", detail::quoted_path(path), ": ", ec.message());
}
}  // namespace

std::string temp_dir_of(const std::string& dir) { return fs::path(dir).lexically_normal().string() + ".tmp"; }
std::string old_dir_of(const std::string& dir) { return fs::path(dir).lexically_normal().string() + ".old"; }

bool is_complete(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kManifestName, ec) || is_legacy(dir);
}

void fsync_path(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open ", detail::quoted_path(path), " to fsync it: ", std::strerror(errno));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ZOE_THROW_ERRNO(err, "fsync of ", detail::quoted_path(path), " failed: ", std::strerror(err));
  }
  ::close(fd);
}

void recover(const std::string& dir) {
  const std::string old = old_dir_of(dir);
  std::error_code ec;
  if (!fs::exists(old, ec)) return;
  if (is_complete(old) && !is_complete(dir)) {
    remove_or_throw(dir);  // a directory that never became complete (nothing, or not ours)
    rename_or_throw(old, dir);
  } else {
    remove_or_throw(old);
  }
  fsync_path(parent_of(dir));
}

void make_temp(const std::string& dir) {
  const std::string tmp = temp_dir_of(dir);
  remove_or_throw(tmp);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) ZOE_THROW_ERRNO(ec.value(), "cannot create ", detail::quoted_path(tmp), ": ", ec.message());
  fsync_path(parent_of(dir));
}

void publish(const std::string& dir) {
  const std::string tmp = temp_dir_of(dir), old = old_dir_of(dir), parent = parent_of(dir);
  fsync_path(tmp);  // its entries (the rank files, manifest.json) are durable
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    remove_or_throw(old);
    rename_or_throw(dir, old);
    fsync_path(parent);
  }
  rename_or_throw(tmp, dir);
  fsync_path(parent);
  remove_or_throw(old);
  fsync_path(parent);
}

std::string choose_for_load(const std::string& dir) {
  if (is_complete(dir)) return dir;
  const std::string old = old_dir_of(dir);
  if (is_complete(old)) return old;
  std::error_code ec;
  ZOE_THROW_ERRNO(ENOENT, "no checkpoint at ", detail::quoted_path(dir), " (no manifest.json there",
                  fs::exists(old, ec) ? " nor in " + detail::quoted_path(old) : std::string(), ")");
}

}  // namespace zoe::ckpt
