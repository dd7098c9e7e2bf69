// zoe's error types. Every runtime failure in zoe is reported by throwing one of
// these (never assert() or exit()); each carries the source file:line that raised
// it and, where relevant, the OS errno or the CUDA / NCCL status code. An exception from a
// library zoe uses (JSON, std::filesystem, std::thread) is converted before it leaves a public
// call: std::system_error to SystemError with its errno, std::bad_alloc to OutOfMemoryError,
// any other to Error; the trainer's own exceptions come back as they were only from run_ranks
// (the trainer's function), and as Error from the callbacks the Engine calls (initializers,
// param group matchers). Messages quote user strings (names, paths) escaped and shortened.
//
// Thread-safety: the types are plain values; throwing and copying are thread-safe.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace zoe {

/// Base of every zoe exception. what() reads "<message> [at file:line]".
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  /// The message without the location suffix.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

/// A configuration key has an unknown name, a wrong type or an out-of-range value.
/// `key()` is the JSON path (e.g. "zero_optimization.stage"); message() reads
/// "config '<key>': <reason>", and `reason()` is the part after the key (to re-throw with
/// more context without repeating the prefix).
/// (This header stays C++17: nvcc compiles it in CUDA sources.)
/// One error may carry several problems (Config::from_json reports every problem of a file at
/// once): `problems()` lists them in the order found (at least one); key() and reason() are the
/// first's, and message() is one line "config '<key>': <reason>" per problem followed, when
/// there are two or more, by a line "(N problems)". With one problem message() is exactly that
/// problem's line.
class ConfigError : public Error {
 public:
  /// One refused key: its JSON path ("" for the document itself) and why.
  struct Problem {
    std::string key;
    std::string reason;
  };
  ConfigError(const std::string& key, const std::string& reason, const char* file, int line);
  /// `problems` must not be empty (an empty list is read as one problem with key "" saying so).
  ConfigError(std::vector<Problem> problems, const char* file, int line);
  const std::string& key() const noexcept { return problems_.front().key; }
  const std::string& reason() const noexcept { return problems_.front().reason; }
  const std::vector<Problem>& problems() const noexcept { return problems_; }

 private:
  std::vector<Problem> problems_;
};

/// An OS call failed. `error_code()` is the errno value (e.g. EIO = 5).
class SystemError : public Error {
 public:
  SystemError(const std::string& message, int error_code, const char* file, int line);
  int error_code() const noexcept { return error_code_; }

 private:
  int error_code_;
};

/// A file read or write failed: names the file, byte offset, byte length and errno.
class IoError : public SystemError {
 public:
  IoError(const std::string& path, long long offset, long long length, int error_code,
          const std::string& what, const char* file, int line);
  const std::string& path() const noexcept { return path_; }
  long long offset() const noexcept { return offset_; }
  long long length() const noexcept { return length_; }

 private:
  std::string path_;
  long long offset_;
  long long length_;
};

/// Data read back does not match what was written (checksum mismatch).
class CorruptionError : public Error {
 public:
  using Error::Error;
};

/// A memory budget (device, pinned host pool) would be exceeded.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime call failed; `code()` is the cudaError_t value.
class CudaError : public Error {
 public:
  CudaError(const std::string& message, int code, const char* file, int line);
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A collective failed (NCCL status, Gloo error) or timed out.
class CommError : public Error {
 public:
  CommError(const std::string& message, int code, const char* file, int line);
  /// NCCL's ncclResult_t, or 0 for host-backend errors.
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A collective did not complete within the configured timeout (a rank never arrived).
class TimeoutError : public CommError {
 public:
  TimeoutError(const std::string& message, const char* file, int line)
      : CommError(message, 0, file, line) {}
};

/// A peer rank failed and aborted the communicator (Communicator::abort, called by the Engine
/// when one of its calls fails on that rank, and by run_ranks when a rank's function throws):
/// this rank's collectives throw it instead of waiting for the collective timeout.
/// `failed_rank()` is the rank that failed, `cause()` its error message (what() of the
/// exception that stopped it, cut to at most 4000 characters); message() reads
/// "<collective> (collective #k) on rank <me>: rank <R> failed: <cause>".
class RankFailedError : public CommError {
 public:
  RankFailedError(const std::string& message, int failed_rank, const std::string& cause, const char* file, int line)
      : CommError(message, 0, file, line), failed_rank_(failed_rank), cause_(cause) {}
  int failed_rank() const noexcept { return failed_rank_; }
  const std::string& cause() const noexcept { return cause_; }

 private:
  int failed_rank_;
  std::string cause_;
};

/// The caller used the API out of order (e.g. end_forward without begin_forward).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace zoe
