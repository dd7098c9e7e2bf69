#include "src/comm/collective_sequencer.hpp"

namespace zoe {

void CollectiveSequencer::submit(Stream& stream, const char* name, std::function<void(const CollectiveOp&)> body) {
  std::uint64_t seq;
  {
    std::lock_guard lock(mutex_);
    seq = issued_++;
  }
  device_.host_func(stream, [this, seq, name, body = std::move(body)] { run(seq, name, body); });
}

void CollectiveSequencer::wait_idle() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return executed_ == issued_; });
}

void CollectiveSequencer::run(std::uint64_t seq, const char* name,
                              const std::function<void(const CollectiveOp&)>& body) {
  std::string earlier;
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return executed_ == seq; });
    earlier = failure_;
  }
  try {
    if (!earlier.empty())
      ZOE_THROW_COMM(name, " (collective #", seq, ") on rank ", rank_,
                     ": the communicator is unusable after an earlier failure: ", earlier);
    body(CollectiveOp{name, seq, std::chrono::steady_clock::now() + timeout_});
  } catch (const std::exception& e) {
    {
      // Notify under the lock: once it is released the destructor may free this.
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = e.what();
      ++executed_;
      cv_.notify_all();
    }
    throw;
  }
  std::lock_guard lock(mutex_);
  ++executed_;
  cv_.notify_all();
}

}  // namespace zoe
