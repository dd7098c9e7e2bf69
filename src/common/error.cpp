#include "zoe/error.hpp"

#include <cstring>

namespace zoe {
namespace {
std::string with_location(const std::string& message, const char* file, int line) {
  return message + " [at " + (file ? file : "?") + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(with_location(message, file, line)), message_(message), file_(file), line_(line) {}

ConfigError::ConfigError(const std::string& key, const std::string& reason, const char* file, int line)
    : Error("config '" + key + "': " + reason, file, line), key_(key), reason_(reason) {}

SystemError::SystemError(const std::string& message, int error_code, const char* file, int line)
    : Error(message + ": " + std::strerror(error_code) + " (errno " + std::to_string(error_code) + ")",
            file, line),
      error_code_(error_code) {}

IoError::IoError(const std::string& path, long long offset, long long length, int error_code,
                 const std::string& what, const char* file, int line)
    : SystemError(what + " of '" + path + "' at offset " + std::to_string(offset) + ", length " +
                      std::to_string(length) + " bytes failed",
                  error_code, file, line),
      path_(path), offset_(offset), length_(length) {}

CudaError::CudaError(const std::string& message, int code, const char* file, int line)
    : Error(message + " (CUDA error " + std::to_string(code) + ")", file, line), code_(code) {}

CommError::CommError(const std::string& message, int code, const char* file, int line)
    : Error(code ? message + " (NCCL error " + std::to_string(code) + ")" : message, file, line), code_(code) {}

}  // namespace zoe
