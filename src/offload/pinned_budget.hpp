// PinnedBudget: one rank's zoe.pinned_budget_bytes, shared by every consumer of pinned
// (page-locked, device-registered) host memory of its engine: the NVMe tiers' staging pools
// (optimizer states and parameters), the update pipeline's output staging, the gradient sink's
// staging and the cpu parameter tier's registered shard homes. Each reserves its bytes before it
// allocates them and releases them when it frees them, so the sum never exceeds the limit
// whichever piece comes last (DeepSpeed has no such key; it is zoe's).
//
// Thread-safety: all members may be called from any thread (one mutex).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zoe::offload {

class PinnedBudget {
 public:
  /// `limit_bytes` = 0: unlimited (reservations are still counted).
  explicit PinnedBudget(std::size_t limit_bytes) : limit_(limit_bytes) {}
  PinnedBudget(const PinnedBudget&) = delete;
  PinnedBudget& operator=(const PinnedBudget&) = delete;

  /// Reserves `bytes` for `holder` (a short name such as "optimizer NVMe staging"). Throws
  /// OutOfMemoryError naming zoe.pinned_budget_bytes, the limit, the bytes asked and what each
  /// holder has already reserved, when the total would exceed the limit; nothing is reserved then.
  void reserve(std::size_t bytes, const std::string& holder);
  /// Returns `bytes` reserved by `holder` (no-op for 0). Never throws.
  void release(std::size_t bytes, const std::string& holder) noexcept;

  /// 0 = unlimited.
  std::size_t limit_bytes() const noexcept { return limit_; }
  /// Bytes reserved now, all holders together.
  std::size_t reserved_bytes() const;

 private:
  const std::size_t limit_;
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, std::size_t>> held_;  // per holder, guarded by mutex_
};

}  // namespace zoe::offload
