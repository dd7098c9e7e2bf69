// BlockPool: the host device's cache of freed blocks of one size range, with its own account
// (cudaMallocAsync's pool, in miniature). Freed blocks are kept by rounded size and handed back
// by the next request of that size; a miss first releases cached blocks, largest first, until
// live + cached bytes fit within the live peak, so the pool never holds more than its live
// blocks once needed. The host device keeps two (small and large blocks), so a small buffer's
// miss can never release a gathered parameter's block.
// Not thread-safe: the device calls it under its mutex.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <map>
#include <vector>

namespace zoe {

class BlockPool {
 public:
  /// A cached block of exactly `rounded` bytes, now live; nullptr when none is cached.
  void* take(std::size_t rounded) {
    auto hit = cached_.find(rounded);
    if (hit == cached_.end()) return nullptr;
    void* ptr = hit->second.back();
    hit->second.pop_back();
    if (hit->second.empty()) cached_.erase(hit);
    cached_bytes_ -= rounded;
    live_ += rounded;
    return ptr;
  }
  /// A miss of `rounded` bytes: counts the new block live and appends to `release` the cached
  /// blocks to give back to the system (largest first) so that live + cached <= live peak.
  void count_new(std::size_t rounded, std::vector<void*>& release) {
    live_ += rounded;
    live_peak_ = std::max(live_peak_, live_);
    while (cached_bytes_ > 0 && live_ + cached_bytes_ > live_peak_) {
      auto largest = std::prev(cached_.end());
      release.push_back(largest->second.back());
      largest->second.pop_back();
      cached_bytes_ -= largest->first;
      if (largest->second.empty()) cached_.erase(largest);
    }
  }
  /// A live block of `rounded` bytes was freed: kept for reuse when `keep`, else only uncounted
  /// (the caller gives it back to the system or quarantines it).
  void count_freed(void* ptr, std::size_t rounded, bool keep) {
    live_ -= rounded;
    if (!keep) return;
    cached_[rounded].push_back(ptr);
    cached_bytes_ += rounded;
  }
  /// Empties the cache into `release`.
  void drain(std::vector<void*>& release) {
    for (auto& [bytes, blocks] : cached_) release.insert(release.end(), blocks.begin(), blocks.end());
    cached_.clear();
    cached_bytes_ = 0;
  }
  std::size_t cached_bytes() const { return cached_bytes_; }

 private:
  std::map<std::size_t, std::vector<void*>> cached_;  // freed blocks by rounded size
  std::size_t cached_bytes_ = 0;
  std::size_t live_ = 0, live_peak_ = 0;  // live blocks' rounded bytes
};

}  // namespace zoe
