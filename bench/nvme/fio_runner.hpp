// Runs Debian's fio on a file with io_uring + O_DIRECT and returns its bandwidth: the
// bound zoe-nvme-bench compares the engine with (same file, block size and depth).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace zoe::bench {

struct FioJob {
  std::string path;
  std::uint64_t size = 0;  // bytes of the file to cover
  std::size_t block_size = 0;
  unsigned queue_depth = 0;
  bool write = false;
  bool fixed_buffers = false;  // fio's --fixedbufs --registerfiles
};

/// fio's bandwidth in GB/s (1e9 bytes/s), or nullopt (with `error` set) if fio is missing,
/// fails or prints something that is not its JSON report.
std::optional<double> run_fio(const FioJob& job, std::string& error);

}  // namespace zoe::bench
