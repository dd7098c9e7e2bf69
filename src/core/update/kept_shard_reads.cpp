#include "src/core/update/kept_shard_reads.hpp"

#include <algorithm>

#include "src/core/test_hooks.hpp"

namespace zoe::core {

// Handed reads not yet released, and the wait for one to go.
struct KeptShardReads::Handoff::Counter {
  std::mutex mutex;
  std::condition_variable released;
  int handed = 0;
};

KeptShardReads::Handoff::~Handoff() {
  read.reset();  // the buffer goes back to the tier's pool (unless a deferred free still holds it)
  if (!counter) return;
  {
    std::lock_guard lock(counter->mutex);
    --counter->handed;
  }
  counter->released.notify_all();
}

KeptShardReads::KeptShardReads() : handed_(std::make_shared<Handoff::Counter>()) {}

KeptShardReads::~KeptShardReads() = default;

void KeptShardReads::keep(int group, std::shared_ptr<offload::ShardRead> read) {
  if (!enabled_ || !read || !read->buffer) return;  // a host-memory shard is read from its home: nothing to keep
  std::erase_if(kept_, [group](const auto& k) { return k.first == group; });
  kept_.emplace_back(group, std::move(read));
}

std::shared_ptr<KeptShardReads::Handoff> KeptShardReads::hand_over(int group) {
  auto it = std::find_if(kept_.begin(), kept_.end(), [group](const auto& k) { return k.first == group; });
  if (it == kept_.end()) {
    if (enabled_) ++counts_.missed;
    return nullptr;
  }
  ++counts_.taken;
  test_hooks::kept_shard_reads_taken.fetch_add(1, std::memory_order_relaxed);
  auto h = std::make_shared<Handoff>();
  h->read = std::move(it->second);
  kept_.erase(it);
  {
    std::lock_guard lock(handed_->mutex);
    ++handed_->handed;
  }
  h->counter = handed_;
  return h;
}

bool KeptShardReads::free_one() {
  auto wait_for_handed = [this] {
    // Until every handed read is released: then the outcome is the same whatever the
    // pipeline's pace (the file comment).
    std::unique_lock lock(handed_->mutex);
    if (handed_->handed == 0) return false;
    handed_->released.wait(lock, [this] { return handed_->handed == 0; });
    return true;
  };
  if (wait_for_handed()) return true;
  if (kept_.empty()) return false;
  if (reduce_waiting_ && reduce_waiting_() && wait_for_handed()) return true;
  kept_.pop_front();
  test_hooks::kept_shard_reads_dropped.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace zoe::core
