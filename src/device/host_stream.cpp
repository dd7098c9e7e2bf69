#include "src/device/host_stream.hpp"

#include <algorithm>

#include "src/common/log.hpp"

namespace zoe {

namespace {
std::atomic<std::uint64_t> next_queue_id{1};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kPoolEvents = false;
#else
constexpr bool kPoolEvents = true;
#endif

// HostEvent's slots: chunks of kPerChunk, each slot a cache-line multiple, free slots kept
// as a stack that hands out a fresh chunk in ascending order.
class EventSlots {
 public:
  static constexpr std::size_t kSlot = (sizeof(HostEvent) + 63) / 64 * 64, kPerChunk = 1024;
  void* take() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) {
      char* chunk = static_cast<char*>(::operator new(kSlot * kPerChunk, std::align_val_t{64}));
      for (std::size_t i = kPerChunk; i-- > 0;) free_.push_back(chunk + i * kSlot);
    }
    void* p = free_.back();
    free_.pop_back();
    return p;
  }
  void give(void* p) {
    std::lock_guard lock(mutex_);
    free_.push_back(p);  // never reallocates: the capacity holds every slot ever made
  }

 private:
  std::mutex mutex_;
  std::vector<void*> free_;
};

// Never destroyed (an event may outlive static destructors); its chunks stay reachable.
EventSlots& event_slots() {
  static EventSlots* slots = new EventSlots;
  return *slots;
}
}  // namespace

void* HostEvent::operator new(std::size_t bytes) {
  if (!kPoolEvents) return ::operator new(bytes);
  // (HostEvent is final: every allocation is one HostEvent.)
  return event_slots().take();
}

void HostEvent::operator delete(void* p) noexcept {
  if (!p) return;
  if (!kPoolEvents) return ::operator delete(p);
  event_slots().give(p);
}

HostQueue::HostQueue(std::string name)
    : id_(next_queue_id.fetch_add(1, std::memory_order_relaxed)), name_(std::move(name)), worker_([this] { run(); }) {}

HostQueue::~HostQueue() {
  {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return completed_ == enqueued_; });
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      ZOE_LOG_WARN("stream '{}' destroyed with an unreported task error: {}", name_, e.what());
    } catch (...) {
      ZOE_LOG_WARN("stream '{}' destroyed with an unreported task error", name_);
    }
  }
}

std::uint64_t HostQueue::push_locked(std::function<void()> task) {
  tasks_.push_back(std::move(task));
  return enqueued_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

std::uint64_t HostQueue::enqueue(std::function<void()> task) {
  std::uint64_t ticket;
  {
    std::lock_guard lock(mutex_);
    ticket = push_locked(std::move(task));
  }
  work_cv_.notify_one();
  return ticket;
}

bool HostQueue::enqueue_wait(const std::shared_ptr<HostQueue>& source, std::uint64_t ticket) {
  {
    // The check and the push under one lock: a concurrent caller that finds the wait covered
    // queues its own work after it.
    std::lock_guard lock(mutex_);
    auto it = std::find_if(waited_.begin(), waited_.end(), [&](const Waited& w) { return w.source_id == source->id_; });
    if (it != waited_.end() && it->ticket >= ticket) return false;
    if (it == waited_.end()) {
      waited_.push_back(Waited{source->id_, ticket});
    } else {
      it->ticket = ticket;
    }
    push_locked([source, ticket] { source->wait_for(ticket); });
  }
  work_cv_.notify_one();
  return true;
}

std::uint64_t HostQueue::last_ticket() const { return enqueued_.load(std::memory_order_acquire); }

bool HostQueue::done(std::uint64_t ticket) const { return completed_.load(std::memory_order_acquire) >= ticket; }

void HostQueue::wait_for(std::uint64_t ticket) const {
  if (done(ticket)) return;  // no lock for work already done (most waits of the engine's calls)
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

void HostQueue::synchronize() {
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = enqueued_.load(std::memory_order_relaxed);
    done_cv_.wait(lock, [&] { return completed_ >= target; });
    error = std::exchange(error_, nullptr);
    error_ticket_ = 0;
    has_error_.store(false, std::memory_order_release);
  }
  if (error) std::rethrow_exception(error);
}

void HostQueue::rethrow_error_up_to(std::uint64_t ticket) const {
  if (!has_error_.load(std::memory_order_acquire)) return;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    if (error_ && error_ticket_ <= ticket) error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void HostQueue::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // release captures before signalling completion
    {
      std::lock_guard lock(mutex_);
      // The error first, then the completion: a reader that sees the ticket done without the
      // lock (done(), wait_for()) sees has_error_ too.
      const std::uint64_t ticket = completed_.load(std::memory_order_relaxed) + 1;
      if (error && !error_) {
        error_ = std::move(error);
        error_ticket_ = ticket;
        has_error_.store(true, std::memory_order_release);
      }
      error = nullptr;  // drop this thread's reference under the lock the readers take
      completed_.store(ticket, std::memory_order_release);
    }
    done_cv_.notify_all();
  }
}

}  // namespace zoe
