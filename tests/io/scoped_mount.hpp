// A filesystem mounted on a fresh temporary directory for one test (ramfs: refuses O_DIRECT;
// a small tmpfs: runs out of space), unmounted and removed when the object goes.
//
// Mounting needs CAP_SYS_ADMIN: where it is refused (not root, a container without the
// capability) `mounted()` is false and `why()` says why, for GTEST_SKIP. The destructor
// unmounts (lazily if busy) before removing the directory, and removes it only once it is no
// longer a mount point, so a failed unmount never deletes through into the mounted filesystem.
// Thread-safety: one object per thread; not copyable.
#pragma once

#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace zoe::test {

class ScopedMount {
 public:
  /// Mounts `fstype` ("ramfs", "tmpfs") with `data` ("size=1M", or "") on a new directory
  /// under `parent`. Throws std::runtime_error only if the directory cannot be created.
  explicit ScopedMount(const std::string& fstype, const std::string& data = "",
                       const std::string& parent = "/tmp") {
    std::string pattern = parent + "/zoe-mount-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed under " + parent);
    path_ = pattern;
    if (::mount(fstype.c_str(), path_.c_str(), fstype.c_str(), MS_NOSUID | MS_NODEV,
                data.empty() ? nullptr : data.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_ = "cannot mount a " + fstype + " (" + (data.empty() ? "" : data + ", ") +
             std::strerror(errno) + "): needs root / CAP_SYS_ADMIN";
    }
  }
  ~ScopedMount() {
    if (mounted_ && ::umount2(path_.c_str(), 0) != 0 && ::umount2(path_.c_str(), MNT_DETACH) != 0) {
      std::fprintf(stderr, "ScopedMount: cannot unmount '%s': %s; leaving the directory\n", path_.c_str(),
                   std::strerror(errno));
      return;
    }
    if (is_mount_point()) return;  // never remove files through a mount that is still there
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& path() const { return path_; }

 private:
  // A mount point lies on another device than its parent.
  bool is_mount_point() const {
    struct stat self {}, parent {};
    if (::stat(path_.c_str(), &self) != 0 || ::stat((path_ + "/..").c_str(), &parent) != 0) return false;
    return self.st_dev != parent.st_dev;
  }

  std::string path_;
  std::string why_;
  bool mounted_ = false;
};

}  // namespace zoe::test
