// The io_uring engine: asynchronous reads and writes of (file, offset, bytes) with a
// handle to wait on or poll.
//
// Each of `threads` I/O threads owns one ring (no ring is shared between threads). A
// transfer is split into `block_size` requests, and up to `queue_depth` requests per
// ring are kept in flight across all queued transfers, in submission order. Caller
// buffers given at construction are registered with every ring (fixed buffers, used by
// any request that lies inside one); files may be registered (fixed files). Either
// registration may be refused (ENOMEM under an 8 MiB RLIMIT_MEMLOCK is normal for
// non-root users): the engine then uses plain buffers / descriptors and says so once.
//
// Completion handling: a short transfer is resubmitted for its rest; EAGAIN and EINTR
// are retried; any other error fails the transfer with an IoError naming the file,
// offset, length and errno (requests of that transfer not yet issued are dropped; the
// other transfers are unaffected).
//
// Thread-safety: every method may be called from any thread. Buffers must stay valid and
// untouched (reads) / unmodified (writes) until the handle is ready.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "io/direct_file.hpp"

namespace zoe::io {

enum class Op { read, write };

/// One contiguous piece of a transfer: `bytes` between `buffer` and file offset `offset`.
/// For a direct (O_DIRECT) file, buffer, offset and bytes must be multiples of 4096.
struct Segment {
  void* buffer = nullptr;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
};

/// What the fault-injection hook sees for each completed request.
struct Completion {
  Op op;
  const std::string* path;
  std::uint64_t offset;  // file offset of the request
  std::size_t bytes;     // bytes requested
  int result;            // kernel result: bytes transferred or -errno
};

/// Test hook: returns the result the engine should act on (e.g. -EIO, -ENOSPC, or a
/// short count) instead of c.result. Called on the ring's thread for every completion.
using FaultInjector = std::function<int(const Completion& c)>;

struct EngineOptions {
  /// Bytes per request; a multiple of 4096 (default 1 MiB, see zoe-nvme-bench).
  std::size_t block_size = 1 << 20;
  /// Requests in flight per ring (1..32768; 32768 keeps 32767, io_uring's ring limit).
  unsigned queue_depth = 32;
  /// I/O threads, one ring each (1..64).
  unsigned threads = 1;
  /// DeepSpeed's aio.single_submit: true submits each request to the kernel on its own
  /// (one io_uring_submit per request) instead of every request ready in one submission.
  bool single_submit = false;
  /// DeepSpeed's aio.overlap_events: true refills free slots as soon as completions are
  /// reaped, so submission overlaps the requests still in flight; false works in batches:
  /// up to queue_depth requests, then nothing new until every one of them completed.
  bool overlap_events = true;
  /// Try to register the buffers passed to the constructor (fixed buffers).
  bool fixed_buffers = true;
  /// Try to register files (fixed files) in register_file().
  bool fixed_files = true;
  /// Test hook, see FaultInjector.
  FaultInjector fault_injector;
};

/// Counters since construction (monotonic; read with relaxed ordering).
struct EngineStats {
  std::uint64_t requests = 0;       // requests submitted to the kernel, retries included
  std::uint64_t bytes = 0;          // bytes completed
  std::uint64_t resubmitted = 0;    // short transfers and EAGAIN/EINTR retries
  std::uint64_t fixed_requests = 0; // requests that used a registered buffer
  std::uint64_t submit_calls = 0;   // io_uring submissions that carried requests
  std::uint64_t overlapped_requests = 0;  // requests issued by a refill while earlier ones of their ring were in flight
};

namespace detail {
struct Job;
}

/// Completion handle of one transfer. Copyable; an empty (default) handle is ready.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::Job> job) : job_(std::move(job)) {}
  /// True once every request of the transfer completed (or it failed). Never blocks.
  bool ready() const noexcept;
  /// Blocks until ready(); rethrows the transfer's IoError if it failed.
  void wait() const;
  /// Blocks until ready() without throwing; returns the error (null if it succeeded).
  std::exception_ptr wait_nothrow() const noexcept;

 private:
  std::shared_ptr<detail::Job> job_;
};

/// A file known to the engine: its descriptor, path (for errors) and fixed-file slot.
struct FileRef {
  int fd = -1;
  const std::string* path = nullptr;
  bool direct = false;
  int slot = -1;  // fixed-file index in every ring, or -1
};

class Engine {
 public:
  /// Starts the rings and their threads; registers `fixed_buffers` (each 4096-aligned) with
  /// every ring when options.fixed_buffers. Throws UsageError for bad options, SystemError
  /// if io_uring itself is unavailable.
  explicit Engine(const EngineOptions& options = {},
                  std::vector<std::span<std::byte>> fixed_buffers = {});
  /// Finishes every queued transfer, then stops the threads.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Describes `file` to the engine, registering it as a fixed file when allowed.
  /// Call unregister_file() before the file is closed.
  FileRef register_file(const DirectFile& file);
  void unregister_file(const FileRef& ref) noexcept;

  /// Queues a transfer of all `segments` (in order) and returns its handle. `keep_alive`
  /// is held until the transfer completes (e.g. a bounce buffer the caller may drop).
  /// Throws UsageError for misaligned segments on a direct file.
  Handle submit(Op op, const FileRef& file, std::span<const Segment> segments,
                std::shared_ptr<void> keep_alive = nullptr);
  Handle read(const FileRef& file, void* buffer, std::uint64_t offset, std::size_t bytes) {
    Segment s{buffer, offset, bytes};
    return submit(Op::read, file, {&s, 1});
  }
  Handle write(const FileRef& file, const void* buffer, std::uint64_t offset, std::size_t bytes) {
    Segment s{const_cast<void*>(buffer), offset, bytes};
    return submit(Op::write, file, {&s, 1});
  }

  const EngineOptions& options() const noexcept { return options_; }
  /// True if the constructor's buffers were registered with every ring.
  bool fixed_buffers_active() const noexcept { return fixed_buffers_active_; }
  /// True if files are registered as fixed files.
  bool fixed_files_active() const noexcept { return fixed_files_active_; }
  EngineStats stats() const noexcept;

 private:
  class Ring;
  EngineOptions options_;
  bool fixed_buffers_active_ = false;
  bool fixed_files_active_ = false;
  struct Counters;
  std::unique_ptr<Counters> counters_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::atomic<unsigned> next_ring_{0};
  std::mutex slot_mutex_;
  std::vector<bool> slot_used_;
};

}  // namespace zoe::io
