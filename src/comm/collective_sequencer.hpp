// CollectiveSequencer: the part every host communicator shares. Collectives are queued on a
// device stream (Device::host_func) and run one at a time in the order they were issued (a
// ticket per call), each on the thread of the stream it was queued on, after the work queued
// on that stream before it; so every rank runs the same sequence. The first failure is latched:
// later collectives throw CommError quoting it (the communicator is unusable after a failure).
// Thread-safety: submit() from the one issuing thread; bodies run on stream threads, one at a
// time; wait_idle() from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "src/common/check.hpp"
#include "src/device/device.hpp"

/// Throw zoe::CommError("<args...>") (no peer rank) with this file:line.
#define ZOE_THROW_COMM(...) throw ::zoe::CommError(::zoe::detail::concat(__VA_ARGS__), 0, __FILE__, __LINE__)

namespace zoe {

/// One collective as its body sees it: `seq` counts this communicator's collectives from 0;
/// `deadline` = start of its run + the communicator's timeout.
struct CollectiveOp {
  const char* name;
  std::uint64_t seq;
  std::chrono::steady_clock::time_point deadline;
};

class CollectiveSequencer {
 public:
  /// `rank` names this rank in errors; `timeout` (> 0) sets each collective's deadline.
  CollectiveSequencer(Device& device, int rank, std::chrono::milliseconds timeout)
      : device_(device), rank_(rank), timeout_(timeout) {}
  ~CollectiveSequencer() { wait_idle(); }

  /// Queues `body` on `stream`; it runs after every collective submitted before it. An
  /// exception from `body` (or CommError after an earlier failure) is rethrown by
  /// Device::synchronize of `stream`.
  void submit(Stream& stream, const char* name, std::function<void(const CollectiveOp&)> body);
  /// Waits until every submitted collective has run (for communicators' destructors).
  void wait_idle();

 private:
  void run(std::uint64_t seq, const char* name, const std::function<void(const CollectiveOp&)>& body);

  Device& device_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t issued_ = 0, executed_ = 0;
  std::string failure_;  // first failure; the communicator is unusable after it
};

}  // namespace zoe
