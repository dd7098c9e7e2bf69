// Test helper: damages the first tensor of a rank's NVMe swap file (optim.sg0 for optimizer
// offload: the tiers register sub-group 0's states first), as a bad disk sector would. The
// next swap_in of that tensor fails its CRC32C check.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "src/offload/swap_file_owner.hpp"

namespace zoe::test {

/// Overwrites 16 data bytes of the first extent of the one swap file of `rank` in `dir`
/// ("zoe-rank<R>-*.swap"); returns its path. Throws std::runtime_error if there is not
/// exactly one such file or the write fails. Call after the tensor was written (synchronize).
inline std::string corrupt_first_swap_tensor(const std::string& dir, int rank) {
  const std::string prefix = "zoe-rank" + std::to_string(rank) + "-";
  std::string path;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || entry.path().extension() != ".swap") continue;
    if (!path.empty()) throw std::runtime_error("two swap files of rank " + std::to_string(rank) + " in " + dir);
    path = entry.path().string();
  }
  if (path.empty()) throw std::runtime_error("no swap file of rank " + std::to_string(rank) + " in " + dir);
  int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const char junk[16] = {'b', 'a', 'd', ' ', 's', 'e', 'c', 't', 'o', 'r', 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a};
  ssize_t w = ::pwrite(fd, junk, sizeof junk, static_cast<off_t>(offload::kSwapHeaderBytes));
  ::fsync(fd);
  ::close(fd);
  if (w != static_cast<ssize_t>(sizeof junk)) throw std::runtime_error("cannot write " + path);
  return path;
}

}  // namespace zoe::test
