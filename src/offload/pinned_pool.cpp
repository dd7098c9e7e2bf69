#include "src/offload/pinned_pool.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe::offload {
namespace {
constexpr std::size_t kPage = 4096;
constexpr std::size_t kHuge = 2u << 20;
std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// Process-wide counters behind pinned_stats().
std::atomic<std::size_t> g_region{0}, g_peak_region{0}, g_leased{0}, g_peak_leased{0};

void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load();
  while (seen < value && !peak.compare_exchange_weak(seen, value)) {
  }
}
void count(std::atomic<std::size_t>& now, std::atomic<std::size_t>& peak, std::size_t bytes) noexcept {
  raise_peak(peak, now.fetch_add(bytes) + bytes);
}
}  // namespace

PinnedStats pinned_stats() noexcept {
  return PinnedStats{g_region.load(), g_peak_region.load(), g_leased.load(), g_peak_leased.load()};
}

void reset_pinned_peaks() noexcept {
  g_peak_region.store(g_region.load());
  g_peak_leased.store(g_leased.load());
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      index_(other.index_) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    index_ = other.index_;
  }
  return *this;
}

void PinnedBuffer::release() noexcept {
  if (pool_) pool_->give_back(index_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

PinnedPool::PinnedPool(const PinnedPoolOptions& options)
    : options_(options), count_(options.buffer_count), buffer_bytes_(round_up(options.buffer_bytes, kPage)) {
  ZOE_CHECK_USAGE(count_ >= 1 && options.buffer_bytes >= 1, "pinned pool needs buffer_count >= 1 and ",
                  "buffer_bytes >= 1, got ", count_, " x ", options.buffer_bytes);
  std::size_t total = count_ * buffer_bytes_;
  if (options.budget) options.budget->reserve(total, options.holder);
  struct Unreserve {  // gives the reservation back if the constructor throws below
    const PinnedPoolOptions& o;
    std::size_t bytes;
    bool armed = true;
    ~Unreserve() {
      if (armed && o.budget) o.budget->release(bytes, o.holder);
    }
  } unreserve{options, total};

  // Map with 2 MiB of slack so the region can start on a huge-page boundary.
  mapped_bytes_ = total + kHuge;
  void* map = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    ZOE_THROW(OutOfMemoryError, "cannot map ", total, " bytes for the pinned pool (errno ", errno, ")");
  auto base = reinterpret_cast<std::uintptr_t>(map);
  auto aligned = round_up(base, kHuge);
  if (aligned > base) ::munmap(map, aligned - base);  // trim the slack in front ...
  std::size_t tail = mapped_bytes_ - (aligned - base) - total;
  if (tail) ::munmap(reinterpret_cast<void*>(aligned + total), tail);  // ... and behind
  region_ = reinterpret_cast<std::byte*>(aligned);
  mapped_bytes_ = total;
  ::madvise(region_, total, MADV_HUGEPAGE);  // best effort

  if (options.lock) {
    int err = options.simulate_mlock_failure ? ENOMEM : (::mlock(region_, total) == 0 ? 0 : errno);
    locked_ = err == 0;
    if (!locked_)
      ZOE_LOG_WARN("mlock of the {}-byte pinned pool failed (errno {}: {}); using pageable memory "
                   "(identical results, slower host<->device copies). Raise RLIMIT_MEMLOCK "
                   "(ulimit -l) or grant CAP_IPC_LOCK to pin it",
                   total, err, std::strerror(err));
  }
  if (!locked_) std::memset(region_, 0, total);  // fault every page in now, not on first use

  if (options.register_fn) {
    registered_ = options.register_fn(region_, total);
    if (!registered_) ZOE_LOG_WARN("the device refused to register the {}-byte pinned pool; copies "
                                   "from it will be staged", total);
  }
  for (std::size_t i = count_; i-- > 0;) free_.push_back(i);
  count(g_region, g_peak_region, total);
  unreserve.armed = false;
}

PinnedPool::~PinnedPool() {
  {
    std::lock_guard lock(mutex_);
    if (free_.size() != count_)
      ZOE_LOG_ERROR("pinned pool destroyed with {} of {} buffers still leased", count_ - free_.size(), count_);
  }
  if (registered_ && options_.unregister_fn) options_.unregister_fn(region_);
  if (locked_) ::munlock(region_, mapped_bytes_);
  ::munmap(region_, mapped_bytes_);
  g_region.fetch_sub(mapped_bytes_);
  if (options_.budget) options_.budget->release(mapped_bytes_, options_.holder);
}

PinnedBuffer PinnedPool::lease_locked() {
  std::size_t index = free_.back();
  free_.pop_back();
  count(g_leased, g_peak_leased, buffer_bytes_);
  return PinnedBuffer(this, region_ + index * buffer_bytes_, buffer_bytes_, index);
}

PinnedBuffer PinnedPool::acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty())
    ZOE_THROW(OutOfMemoryError, "pinned pool exhausted: all ", count_, " buffers of ", buffer_bytes_,
              " bytes are leased (raise buffer_count or release buffers sooner)");
  return lease_locked();
}

std::optional<PinnedBuffer> PinnedPool::try_acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return std::nullopt;
  return lease_locked();
}

PinnedBuffer PinnedPool::acquire_wait() {
  std::unique_lock lock(mutex_);
  released_.wait(lock, [&] { return !free_.empty(); });
  return lease_locked();
}

void PinnedPool::give_back(std::size_t index) noexcept {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(index);
  }
  g_leased.fetch_sub(buffer_bytes_);
  released_.notify_one();
}

std::size_t PinnedPool::available() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

std::vector<std::span<std::byte>> PinnedPool::buffers() const {
  std::vector<std::span<std::byte>> out;
  for (std::size_t i = 0; i < count_; ++i) out.emplace_back(region_ + i * buffer_bytes_, buffer_bytes_);
  return out;
}

bool PinnedPool::contains(const void* p, std::size_t bytes) const noexcept {
  auto b = static_cast<const std::byte*>(p);
  if (b < region_ || b + bytes > region_ + mapped_bytes_) return false;
  std::size_t first = static_cast<std::size_t>(b - region_) / buffer_bytes_;
  return bytes == 0 || static_cast<std::size_t>(b + bytes - 1 - region_) / buffer_bytes_ == first;
}

}  // namespace zoe::offload
