// HostStream: the host device's stream, an in-order executor with its own worker
// thread, so work queued on different streams overlaps as it would on a GPU.
// Positions in the queue are tickets (1, 2, ...): ticket t is complete once the t-th
// task queued has run. Events are (queue, ticket) pairs, which gives CUDA event
// semantics without queuing anything for record().
// Errors: an exception thrown by a task is kept (the first one) and later tasks still
// run, so waits on other streams never hang; synchronize rethrows it.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/device/device.hpp"

namespace zoe {

/// The queue and worker thread behind a HostStream. Shared with events recorded on
/// it, so an event outlives the stream safely.
class HostQueue {
 public:
  explicit HostQueue(std::string name);
  /// Drains every queued task, then stops the worker.
  ~HostQueue();
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  /// Queues `task`; returns its ticket.
  std::uint64_t enqueue(std::function<void()> task);
  /// Queues a wait (this queue's later tasks run after ticket `ticket` of `source`) unless this
  /// queue already waits for that ticket of `source` or a later one: tasks of one queue
  /// complete in order, as a CUDA stream that waits on an event need not wait on an earlier
  /// event of the same stream. Returns whether a wait was queued. `source` may be this queue's
  /// own only if the caller has checked (a queue waiting on itself would hang).
  bool enqueue_wait(const std::shared_ptr<HostQueue>& source, std::uint64_t ticket);
  /// Ticket of the last task queued (0 if none): the point record() captures.
  std::uint64_t last_ticket() const;
  /// True once every task up to `ticket` has run.
  bool done(std::uint64_t ticket) const;
  /// Blocks until every task up to `ticket` has run.
  void wait_for(std::uint64_t ticket) const;
  /// Blocks until the queue is empty, then rethrows (and clears) the first task error.
  void synchronize();
  /// Rethrows (without clearing) the first task error if it happened at or before `ticket`.
  void rethrow_error_up_to(std::uint64_t ticket) const;
  /// Whether a task error is kept (not yet cleared by synchronize()); no lock.
  bool has_error() const { return has_error_.load(std::memory_order_acquire); }
  const std::string& name() const { return name_; }

 private:
  void run();

  // The latest ticket of each source queue that a queued wait covers (under mutex_). Keyed by
  // the source's id_, never its address, which a later queue may reuse.
  struct Waited {
    std::uint64_t source_id, ticket;
  };
  std::uint64_t push_locked(std::function<void()> task);

  const std::uint64_t id_;
  std::string name_;
  mutable std::mutex mutex_;
  std::vector<Waited> waited_;
  mutable std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> tasks_;
  // Written under mutex_ (the condition variables' predicates), read without it by
  // last_ticket() and done() (acquire: a completed task's writes are visible to the reader).
  // Each on a cache line of its own: the queuing thread writes enqueued_ (and reads it for
  // every record()), the worker writes completed_ after every task.
  alignas(64) std::atomic<std::uint64_t> enqueued_{0};
  alignas(64) std::atomic<std::uint64_t> completed_{0};
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};  // error_ is set (read without mutex_ by rethrow_error_up_to)
  std::uint64_t error_ticket_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name) : queue_(std::make_shared<HostQueue>(std::move(name))) {}
  const std::shared_ptr<HostQueue>& queue() const { return queue_; }

 private:
  std::shared_ptr<HostQueue> queue_;
};

class HostEvent final : public Event {
 public:
  /// Events come from one pool of slots, handed out in address order: the events an engine
  /// creates group after group lie together, so a pass over the groups (thousands of small
  /// modules) reads them in order instead of chasing scattered heap blocks. (Plain new and
  /// delete under AddressSanitizer, which then still sees a use after free.)
  static void* operator new(std::size_t bytes);
  static void operator delete(void* p) noexcept;

  struct Point {
    std::shared_ptr<HostQueue> queue;  // null: never recorded (complete)
    std::uint64_t ticket = 0;
  };
  Point point() const {
    Guard g(lock_);
    return point_;
  }
  /// Records ticket `ticket` of `queue`. Re-recording on the queue it already names (the usual
  /// case) changes only the ticket: no reference count is touched.
  void set(const std::shared_ptr<HostQueue>& queue, std::uint64_t ticket) {
    Guard g(lock_);
    if (point_.queue != queue) point_.queue = queue;
    point_.ticket = ticket;
  }
  /// Never recorded, or its work has run and no task of its queue failed so far: nothing to
  /// wait for and nothing to rethrow. (False says nothing: take point() and look.)
  bool settled() const {
    Guard g(lock_);
    return !point_.queue || (point_.queue->done(point_.ticket) && !point_.queue->has_error());
  }
  /// Never recorded, or its work has run (errors aside).
  bool completed() const {
    Guard g(lock_);
    return !point_.queue || point_.queue->done(point_.ticket);
  }

 private:
  // A spin lock, not a mutex: held for a few loads and stores, and an event (one or more per
  // group and call of the engine) stays small and cheap to touch.
  class Guard {
   public:
    explicit Guard(std::atomic_flag& f) : f_(f) {
      while (f_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    }
    ~Guard() { f_.clear(std::memory_order_release); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    std::atomic_flag& f_;
  };
  mutable std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  Point point_;
};

}  // namespace zoe
