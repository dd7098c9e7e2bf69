#include "zoe/error.hpp"

#include <cstring>

#include "src/common/quote.hpp"

namespace zoe {
namespace {
std::string with_location(const std::string& message, const char* file, int line) {
  return message + " [at " + (file ? file : "?") + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(with_location(message, file, line)), message_(message), file_(file), line_(line) {}

namespace {
std::vector<ConfigError::Problem> non_empty(std::vector<ConfigError::Problem> problems) {
  if (problems.empty()) problems.push_back({"", "ConfigError raised with no problem (a bug in zoe)"});
  return problems;
}

std::string config_message(const std::vector<ConfigError::Problem>& problems) {
  std::string m;
  for (const auto& p : problems) {
    if (!m.empty()) m += '\n';
    m += "config '" + p.key + "': " + p.reason;
  }
  if (problems.size() > 1) m += "\n(" + std::to_string(problems.size()) + " problems)";
  return m;
}
}  // namespace

ConfigError::ConfigError(const std::string& key, const std::string& reason, const char* file, int line)
    : ConfigError(std::vector<Problem>{{key, reason}}, file, line) {}

ConfigError::ConfigError(std::vector<Problem> problems, const char* file, int line)
    : Error(config_message(non_empty(problems)), file, line), problems_(non_empty(std::move(problems))) {}

SystemError::SystemError(const std::string& message, int error_code, const char* file, int line)
    : Error(message + ": " + std::strerror(error_code) + " (errno " + std::to_string(error_code) + ")",
            file, line),
      error_code_(error_code) {}

IoError::IoError(const std::string& path, long long offset, long long length, int error_code,
                 const std::string& what, const char* file, int line)
    : SystemError(what + " of " + detail::quoted_path(path) + " at offset " + std::to_string(offset) + ", length " +
                      std::to_string(length) + " bytes failed",
                  error_code, file, line),
      path_(path), offset_(offset), length_(length) {}

CudaError::CudaError(const std::string& message, int code, const char* file, int line)
    : Error(message + " (CUDA error " + std::to_string(code) + ")", file, line), code_(code) {}

CommError::CommError(const std::string& message, int code, const char* file, int line)
    : Error(code ? message + " (NCCL error " + std::to_string(code) + ")" : message, file, line), code_(code) {}

}  // namespace zoe
