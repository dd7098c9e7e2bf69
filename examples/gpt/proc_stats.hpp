// This process's storage I/O and host memory peak as Linux counts them, for zoe-gpt
// --step-report: /proc/self/io's read_bytes / write_bytes (bytes the process, all its threads and
// io_uring workers included, caused to be fetched from / sent to the block layer: with the NVMe
// tier's O_DIRECT files, exactly the tier's traffic plus any other file I/O of the process) and
// /proc/self/status's VmHWM (peak resident set). Thread-safety: stateless reads of /proc.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace gpt {

/// Cumulative block-layer bytes of this process (/proc/self/io); both 0 where the kernel has no
/// task I/O accounting (the file is missing).
struct ProcIo {
  std::int64_t read_bytes = 0, write_bytes = 0;
  static ProcIo now() {
    ProcIo io;
    std::ifstream f("/proc/self/io");
    std::string key;
    std::int64_t value = 0;
    while (f >> key >> value) {
      if (key == "read_bytes:") io.read_bytes = value;
      if (key == "write_bytes:") io.write_bytes = value;
    }
    return io;
  }
};

/// A line's value in kB of /proc/self/status (e.g. "VmHWM", "VmRSS"), in bytes; 0 if absent.
inline std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return 0;
}

}  // namespace gpt
