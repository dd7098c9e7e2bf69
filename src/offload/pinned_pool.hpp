// A pool of page-locked host buffers for staging NVMe and device transfers: `count`
// buffers of `buffer_bytes` each (rounded up to 4096), carved from one region that is
// allocated, locked (mlock) and faulted in once at construction and reused forever
// (first touch of fresh memory is slow on this class of machine). The region is
// 2 MiB-aligned and madvise(MADV_HUGEPAGE)d so that large buffers are physically
// contiguous (the disk merges 1 MiB O_DIRECT requests from such buffers into 4 MiB ones).
//
// When mlock fails (RLIMIT_MEMLOCK, 8 MiB by default for non-root users) the pool falls
// back to pageable memory with one warning; results are identical, only host<->device
// copies get slower. A device layer can pin the region as well through `register_fn`
// (e.g. a lambda calling Device::register_host_memory, i.e. cudaHostRegister): this file
// includes no CUDA header.
//
// Budget: the region (count × rounded buffer_bytes) is reserved in `budget` (the rank's
// zoe.pinned_budget_bytes, shared with its other pinned consumers) before it is mapped and
// returned when the pool is destroyed; when it does not fit, the constructor throws
// OutOfMemoryError (PinnedBudget::reserve's message), so the pools never exceed it; acquiring a buffer
// when all are leased throws OutOfMemoryError (try_acquire returns nullopt).
//
// Thread-safety: acquire/try_acquire/acquire_wait and buffer release may be called from
// any thread. Leases (PinnedBuffer) must not outlive the pool.
#pragma once

#include "src/offload/pinned_budget.hpp"

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace zoe::offload {

struct PinnedPoolOptions {
  /// Number of buffers (>= 1).
  std::size_t buffer_count = 4;
  /// Bytes per buffer (>= 1), rounded up to a multiple of 4096.
  std::size_t buffer_bytes = 1 << 20;
  /// The budget the region is reserved in (null: unbudgeted), under the name `holder`.
  std::shared_ptr<PinnedBudget> budget;
  std::string holder = "pinned pool";
  /// Page-lock with mlock (offload_*.pin_memory). false: pageable, no warning.
  bool lock = true;
  /// Called once with (region, bytes) after allocation, e.g. to cudaHostRegister it;
  /// returning false means "not registered" (logged once, the pool still works).
  std::function<bool(void*, std::size_t)> register_fn;
  /// Called once with the region before it is freed, if register_fn returned true.
  std::function<void(void*)> unregister_fn;
  /// Test hook: behave as if mlock failed with ENOMEM.
  bool simulate_mlock_failure = false;
};

class PinnedPool;

/// Process-wide bytes of all PinnedPools (every engine and rank of the process together),
/// counted whether the region got locked or fell back to pageable memory: what the offload
/// tiers hold as staging. Thread-safe (atomics); read them while no pool is being built or
/// destroyed to get a consistent pair.
struct PinnedStats {
  std::size_t region_bytes = 0;       // regions of the pools alive now (count x buffer_bytes each)
  std::size_t peak_region_bytes = 0;  // max of region_bytes since start or reset_pinned_peaks()
  std::size_t leased_bytes = 0;       // buffers leased now
  std::size_t peak_leased_bytes = 0;  // max of leased_bytes since start or reset_pinned_peaks()
};
/// The counters now.
PinnedStats pinned_stats() noexcept;
/// Sets both peaks to the current values (e.g. at the start of a measurement).
void reset_pinned_peaks() noexcept;

/// A leased buffer: 4096-aligned, `size()` bytes (the pool's rounded buffer size).
/// Move-only; returns itself to the pool when destroyed or release()d.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Index of the buffer in the pool (0..count-1).
  std::size_t index() const noexcept { return index_; }
  template <class T>
  std::span<T> as() const noexcept { return {static_cast<T*>(data_), size_ / sizeof(T)}; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// Returns the buffer to the pool now (idempotent).
  void release() noexcept;

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, void* data, std::size_t size, std::size_t index)
      : pool_(pool), data_(data), size_(size), index_(index) {}
  PinnedPool* pool_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t index_ = 0;
};

class PinnedPool {
 public:
  /// Allocates, locks and faults in the whole region. Throws UsageError for a zero count
  /// or size, OutOfMemoryError if the region exceeds the budget or cannot be mapped.
  explicit PinnedPool(const PinnedPoolOptions& options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  /// A free buffer; throws OutOfMemoryError naming the pool size when all are leased.
  PinnedBuffer acquire();
  /// A free buffer, or nullopt when all are leased.
  std::optional<PinnedBuffer> try_acquire();
  /// Blocks until a buffer is free (another thread must release one).
  PinnedBuffer acquire_wait();

  std::size_t buffer_count() const noexcept { return count_; }
  /// Bytes per buffer (rounded up to 4096).
  std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  /// Bytes of the whole region (count × buffer_bytes).
  std::size_t total_bytes() const noexcept { return count_ * buffer_bytes_; }
  /// Buffers not leased right now.
  std::size_t available() const;
  /// True if mlock succeeded (false: pageable fallback or lock = false).
  bool locked() const noexcept { return locked_; }
  /// True if register_fn was given and returned true.
  bool registered() const noexcept { return registered_; }
  /// Every buffer (leased or not), e.g. to register them with the io_uring engine.
  std::vector<std::span<std::byte>> buffers() const;
  /// True if [p, p + bytes) lies inside one of the pool's buffers.
  bool contains(const void* p, std::size_t bytes) const noexcept;

 private:
  friend class PinnedBuffer;
  void give_back(std::size_t index) noexcept;
  PinnedBuffer lease_locked();

  PinnedPoolOptions options_;
  std::size_t count_;
  std::size_t buffer_bytes_;
  std::byte* region_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  bool locked_ = false;
  bool registered_ = false;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::size_t> free_;  // guarded by mutex_
};

}  // namespace zoe::offload
