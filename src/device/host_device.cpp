#include "src/device/host_device.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <new>
#include <thread>
#include <typeinfo>

#include "kernels/elementwise.hpp"
#include "src/common/check.hpp"
#include "src/device/host_access.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe {
namespace {

// HostEvent and HostStream are final: a typeid comparison is the whole check (cheaper than
// dynamic_cast, which the per-module calls paid for every event and stream).
HostEvent& host_event(Event& event) {
  ZOE_CHECK_USAGE(typeid(event) == typeid(HostEvent), "HostDevice: event was not created by a HostDevice");
  return static_cast<HostEvent&>(event);
}
}  // namespace

HostQueue& host_queue(Stream& stream) {
  ZOE_CHECK_USAGE(typeid(stream) == typeid(HostStream), "HostDevice: stream was not created by a HostDevice");
  return *static_cast<HostStream&>(stream).queue();
}

HostDevice::HostDevice(std::size_t capacity_bytes) : HostDevice(HostDeviceOptions{.capacity_bytes = capacity_bytes}) {}

HostDevice::HostDevice(const HostDeviceOptions& options)
    : options_((validate(options), options)),
      capacity_(options.capacity_bytes),
      compute_(std::make_unique<HostStream>("compute")) {
  if (options_.memory == HostMemoryModel::discrete) {
    const CopyModel model{options_.copy_gbps, options_.copy_latency_us};
    h2d_ = std::make_shared<CopyEngine>("copy-h2d", model);
    d2h_ = std::make_shared<CopyEngine>("copy-d2h", model);
    add_host_access_guard(this);
  }
}

HostDevice::~HostDevice() {
  if (options_.memory == HostMemoryModel::discrete) remove_host_access_guard(this);
  compute_.reset();  // drains queued work before the memory map goes away
  std::lock_guard lock(mutex_);
  for (auto& [ptr, bytes] : sizes_) std::free(ptr);  // live blocks (small_ frees its slabs)
  for (auto& [bytes, blocks] : cache_)
    for (void* p : blocks) std::free(p);
  for (auto& [p, bytes] : quarantine_) std::free(p);
}

void HostDevice::set_poison_freed(std::size_t quarantine_bytes) {
  std::lock_guard lock(mutex_);
  poison_freed_ = true;
  quarantine_cap_ = quarantine_bytes;
  for (auto& [bytes, blocks] : cache_)
    for (void* p : blocks) free_block(p);
  cache_.clear();
  cached_bytes_ = 0;
  // Small blocks cannot go back one by one (they live in slabs): freed ones are never handed
  // out again, and stay the device's memory.
  small_.retire_free_lists();
  small_cached_bytes_ = 0;
}

std::size_t HostDevice::quarantined_bytes() const {
  std::lock_guard lock(mutex_);
  return quarantined_bytes_;
}

std::string HostDevice::name() const {
  return options_.memory == HostMemoryModel::discrete ? "host (discrete)" : "host";
}

void HostDevice::free_block(void* ptr) {
  blocks_.erase(ptr);
  std::free(ptr);
}

std::size_t HostDevice::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_bytes_;
}

std::size_t HostDevice::small_cached_bytes() const {
  std::lock_guard lock(mutex_);
  return small_cached_bytes_;
}

void* HostDevice::allocate(std::size_t bytes) {
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  const bool cacheable = rounded >= kCacheMinBytes;  // smaller blocks: free lists of their own, outside the account
  {
    // Reserve the bytes first so concurrent allocations cannot both pass the capacity check.
    std::lock_guard lock(mutex_);
    if (capacity_ && static_cast<std::size_t>(stats_.current_bytes) + bytes > capacity_)
      ZOE_THROW(OutOfMemoryError, "HostDevice: allocating ", bytes, " bytes would exceed the capacity of ",
                capacity_, " bytes (", stats_.current_bytes, " in use)");
    stats_.current_bytes += static_cast<std::int64_t>(bytes);
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    if (kCachesBlocks && !cacheable) {
      bool carved = false;
      void* ptr = small_.take(rounded, bytes, &carved);
      if (!ptr) {
        stats_.current_bytes -= static_cast<std::int64_t>(bytes);
        ZOE_THROW(OutOfMemoryError, "HostDevice: aligned_alloc of a slab for blocks of ", rounded,
                  " bytes failed (allocating ", bytes, " bytes)");
      }
      if (carved) {
        blocks_.insert(ptr, rounded);
        stats_.reserved_peak_bytes =
            std::max(stats_.reserved_peak_bytes, static_cast<std::int64_t>(blocks_.total_bytes()));
      } else {
        small_cached_bytes_ -= rounded;
      }
      return ptr;
    }
    auto hit = cacheable ? cache_.find(rounded) : cache_.end();
    if (hit != cache_.end()) {
      void* ptr = hit->second.back();
      hit->second.pop_back();
      if (hit->second.empty()) cache_.erase(hit);
      cached_bytes_ -= rounded;
      live_rounded_ += rounded;
      sizes_.emplace(ptr, bytes);
      return ptr;
    }
    // A miss: release cached blocks, largest first, until live + cached fits within the peak
    // of live bytes (a new peak releases them all).
    if (cacheable) live_rounded_ += rounded;
    live_rounded_peak_ = std::max(live_rounded_peak_, live_rounded_);
    while (cacheable && cached_bytes_ > 0 && live_rounded_ + cached_bytes_ > live_rounded_peak_) {
      auto largest = std::prev(cache_.end());
      free_block(largest->second.back());
      largest->second.pop_back();
      cached_bytes_ -= largest->first;
      if (largest->second.empty()) cache_.erase(largest);
    }
  }
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  std::lock_guard lock(mutex_);
  if (!ptr) {
    stats_.current_bytes -= static_cast<std::int64_t>(bytes);
    if (cacheable) live_rounded_ -= rounded;
    ZOE_THROW(OutOfMemoryError, "HostDevice: aligned_alloc of ", bytes, " bytes failed");
  }
  sizes_.emplace(ptr, bytes);
  blocks_.insert(ptr, rounded);
  stats_.reserved_peak_bytes = std::max(stats_.reserved_peak_bytes, static_cast<std::int64_t>(blocks_.total_bytes()));
  return ptr;
}

void HostDevice::deallocate(void* ptr) {
  if (!ptr) return;
  // What becomes of the block once its accounts are settled under the lock.
  enum class Fate { kept, to_system, quarantined, retired } fate = Fate::kept;
  std::size_t bytes = 0, rounded = 0;
  {
    std::lock_guard lock(mutex_);
    // A small block goes back to its free list, or is retired in its slab (set_poison_freed).
    const SmallBlocks::Found small =
        kCachesBlocks ? small_.release(ptr, !poison_freed_, &bytes, &rounded) : SmallBlocks::Found::foreign;
    ZOE_CHECK_USAGE(small == SmallBlocks::Found::live || small == SmallBlocks::Found::foreign,
                    "HostDevice::deallocate: ", ptr, " was freed already");
    if (small == SmallBlocks::Found::live) {
      stats_.current_bytes -= static_cast<std::int64_t>(bytes);
      if (!poison_freed_) {
        small_cached_bytes_ += rounded;
        return;
      }
      fate = Fate::retired;
    } else {
      auto it = sizes_.find(ptr);
      ZOE_CHECK_USAGE(it != sizes_.end(), "HostDevice::deallocate: ", ptr, " was not allocated by this device");
      bytes = it->second;
      stats_.current_bytes -= static_cast<std::int64_t>(bytes);
      rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
      sizes_.erase(it);
      if (rounded >= kCacheMinBytes) live_rounded_ -= rounded;
      if (poison_freed_) {
        fate = Fate::quarantined;  // stays this device's until the quarantine lets it go
      } else if (kCachesBlocks && rounded >= kCacheMinBytes) {
        cache_[rounded].push_back(ptr);
        cached_bytes_ += rounded;
        return;
      } else {
        fate = Fate::to_system;
        blocks_.erase(ptr);  // before free: the address may come back as host memory at once
      }
    }
  }
  if (fate == Fate::to_system) {
    std::free(ptr);
    return;
  }
  // set_poison_freed: poison outside the lock; a small block stays retired in its slab, a large
  // one joins the quarantine, whose oldest blocks then go back to the system.
  std::memset(ptr, 0xFF, bytes);
  if (fate == Fate::retired) return;
  std::lock_guard lock(mutex_);
  quarantine_.emplace_back(ptr, bytes);
  quarantined_bytes_ += bytes;
  while (quarantine_.size() > 1 && quarantined_bytes_ > quarantine_cap_) {
    free_block(quarantine_.front().first);
    quarantined_bytes_ -= quarantine_.front().second;
    quarantine_.pop_front();
  }
}

DeviceMemoryStats HostDevice::memory_stats() const {
  std::lock_guard lock(mutex_);
  DeviceMemoryStats s = stats_;
  s.reserved_bytes = static_cast<std::int64_t>(blocks_.total_bytes());
  return s;
}

void HostDevice::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.reserved_peak_bytes = static_cast<std::int64_t>(blocks_.total_bytes());
}

bool HostDevice::register_host_memory(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!ptr || bytes == 0 || blocks_.overlaps(ptr, bytes)) return false;
  return registered_.insert(ptr, bytes);
}

void HostDevice::unregister_host_memory(void* ptr) {
  std::lock_guard lock(mutex_);
  registered_.erase(ptr);
}

std::int64_t HostDevice::pageable_copy_count() const { return pageable_copies_.load(std::memory_order_relaxed); }

bool HostDevice::is_device_memory(const void* ptr, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  return blocks_.overlaps(ptr, bytes);
}

void HostDevice::check_host_accessible(const void* ptr, std::size_t bytes, const char* what) const {
  if (options_.memory != HostMemoryModel::discrete || !ptr || bytes == 0) return;
  if (!is_device_memory(ptr, bytes)) return;
  ZOE_THROW(UsageError, what ? what : "host code", ": [", ptr, ", +", bytes, " bytes) lies in the device memory of ",
            name(), ", which host code may reach only through Device::copy");
}

HostDevice::Route HostDevice::route_of(void* dst, const void* src, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  return route_locked(dst, src, bytes);
}

HostDevice::Route HostDevice::route_locked(void* dst, const void* src, std::size_t bytes) {
  // A block's own address (the usual case: a group's buffer) is found by hashing, or in a slab.
  auto device = [this](const void* p, std::size_t n) {
    return small_.owns(p) || sizes_.contains(const_cast<void*>(p)) || blocks_.overlaps(p, n);
  };
  const bool dst_dev = device(dst, bytes), src_dev = device(src, bytes);
  if (dst_dev != src_dev && !registered_.contains(dst_dev ? src : dst, bytes))
    pageable_copies_.fetch_add(1, std::memory_order_relaxed);
  if (dst_dev && src_dev) return Route::device_to_device;
  if (dst_dev) return Route::host_to_device;
  if (src_dev) return Route::device_to_host;
  return Route::host_to_host;
}

void HostDevice::model_kernel(Stream& stream, double seconds) {
  ZOE_CHECK_USAGE(std::isfinite(seconds) && seconds >= 0, "HostDevice::model_kernel: seconds must be a finite ",
                  "number >= 0, got ", seconds);
  const auto d = std::chrono::nanoseconds(std::llround(seconds * 1e9));
  host_queue(stream).enqueue([d] { std::this_thread::sleep_for(d); });
}

std::unique_ptr<Stream> HostDevice::create_stream() {
  int id;
  {
    std::lock_guard lock(mutex_);
    id = ++streams_created_;
  }
  return std::make_unique<HostStream>("stream" + std::to_string(id));
}

std::unique_ptr<Event> HostDevice::create_event() { return std::make_unique<HostEvent>(); }

void HostDevice::record(Event& event, Stream& stream) {
  ZOE_CHECK_USAGE(typeid(stream) == typeid(HostStream), "HostDevice::record: stream was not created by a HostDevice");
  const std::shared_ptr<HostQueue>& q = static_cast<HostStream&>(stream).queue();
  host_event(event).set(q, q->last_ticket());
}

namespace {
// The two ways of waiting for a point (queue, ticket), shared by events and streams.
// Later tasks of `waiter` run after the point: no task when the point was never recorded, is on
// `waiter` itself (already in order) or has run (done()'s acquire load orders its work before
// what is queued next), and none when an earlier wait of `waiter` covers it (enqueue_wait).
void queue_wait_for(HostQueue& waiter, const std::shared_ptr<HostQueue>& source, std::uint64_t ticket) {
  if (!source || source.get() == &waiter || source->done(ticket)) return;
  waiter.enqueue_wait(source, ticket);
}
// The calling thread waits for the point and rethrows the first task error up to it.
void block_until(const HostQueue& queue, std::uint64_t ticket) {
  queue.wait_for(ticket);
  queue.rethrow_error_up_to(ticket);
}
}  // namespace

void HostDevice::wait(Stream& stream, Event& event) {
  HostEvent& e = host_event(event);
  if (e.completed()) return;  // the usual case, without copying the point
  const HostEvent::Point p = e.point();
  queue_wait_for(host_queue(stream), p.queue, p.ticket);
}

void HostDevice::stream_waits_for(Stream& waiter, Stream& producer, Event&) {
  ZOE_CHECK_USAGE(typeid(producer) == typeid(HostStream),
                  "HostDevice::stream_waits_for: stream was not created by a HostDevice");
  const std::shared_ptr<HostQueue>& p = static_cast<HostStream&>(producer).queue();
  queue_wait_for(host_queue(waiter), p, p->last_ticket());
}

void HostDevice::compute_waits_for(Stream& producer, Event&) {
  const HostQueue& p = host_queue(producer);
  const std::uint64_t ticket = p.last_ticket();
  if (p.done(ticket) && !p.has_error()) return;
  block_until(p, ticket);
}

void HostDevice::synchronize(Event& event) {
  HostEvent& e = host_event(event);
  if (e.settled()) return;  // done and no error to rethrow (most waits of the engine's calls)
  const HostEvent::Point p = e.point();
  if (p.queue) block_until(*p.queue, p.ticket);
}

bool HostDevice::query(Event& event) { return host_event(event).completed(); }

void HostDevice::synchronize(Stream& stream) { host_queue(stream).synchronize(); }

void HostDevice::host_func(Stream& stream, std::function<void()> fn) {
  ZOE_CHECK_USAGE(fn != nullptr, "HostDevice::host_func: empty function");
  host_queue(stream).enqueue(std::move(fn));
}

void HostDevice::copy(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  ZOE_CHECK_USAGE(dst && src, "HostDevice::copy: null pointer (dst=", dst, ", src=", src, ") for ", bytes,
                  " bytes");
  const Route route = route_of(dst, src, bytes);
  host_queue(stream).enqueue([route, h2d = h2d_, d2h = d2h_, r = CopyRegion{dst, src, bytes}] {
    copy_by_route(route, h2d.get(), d2h.get(), r);
  });
}

void HostDevice::copy_by_route(Route route, CopyEngine* h2d, CopyEngine* d2h, const CopyRegion& r) {
  if (h2d && route == Route::host_to_device) {
    h2d->copy(r.dst, r.src, r.bytes);
  } else if (d2h && route == Route::device_to_host) {
    d2h->copy(r.dst, r.src, r.bytes);
  } else {
    std::memmove(r.dst, r.src, r.bytes);
  }
}

void HostDevice::copy_batch(std::span<const CopyRegion> regions, CopyPlaces places, Stream& stream) {
  struct Routed {
    CopyRegion region;
    Route route;
  };
  std::vector<Routed> routed;
  routed.reserve(regions.size());
  {
    std::lock_guard lock(mutex_);
    for (const CopyRegion& r : regions) {
      if (r.bytes == 0) continue;
      ZOE_CHECK_USAGE(r.dst && r.src, "HostDevice::copy_batch: null pointer (dst=", r.dst, ", src=", r.src, ") for ",
                      r.bytes, " bytes");
      if (places == CopyPlaces::within_device) {
#ifndef NDEBUG
        ZOE_CHECK_USAGE(blocks_.overlaps(r.dst, r.bytes) && blocks_.overlaps(r.src, r.bytes), "HostDevice::copy_batch: ",
                        "a region said to be within the device is not (dst=", r.dst, ", src=", r.src, ")");
#endif
        routed.push_back({r, Route::device_to_device});
      } else {
        routed.push_back({r, route_locked(r.dst, r.src, r.bytes)});
      }
    }
  }
  if (routed.empty()) return;
  host_queue(stream).enqueue([routed = std::move(routed), h2d = h2d_, d2h = d2h_] {
    for (std::size_t i = 0; i < routed.size(); ++i) {
      // (Many small regions, each in a block of its own: see host_ops::prefetch_read.)
      if (i + 1 < routed.size()) host_ops::prefetch_read(routed[i + 1].region.src, routed[i + 1].region.bytes);
      copy_by_route(routed[i].route, h2d.get(), d2h.get(), routed[i].region);
    }
  });
}

void HostDevice::fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) {
  host_queue(stream).enqueue([=] { host_ops::fill(dst, dtype, n, value); });
}

void HostDevice::fill_for_compute(void* dst, DType dtype, std::size_t n, float value) {
  host_ops::fill(dst, dtype, n, value);  // the trainer's compute runs on this thread next
}

void HostDevice::cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
                      Stream& stream) {
  ZOE_CHECK_USAGE(n == 0 || src != dst, "HostDevice::cast: src and dst must differ (", src, ")");
  host_queue(stream).enqueue([=] { host_ops::cast(src, src_dtype, dst, dst_dtype, n); });
}

void HostDevice::scale(void* x, DType dtype, std::size_t n, float factor, Stream& stream) {
  host_queue(stream).enqueue([=] { host_ops::scale(x, dtype, n, factor); });
}

void HostDevice::accumulate(const void* src, DType src_dtype, float* acc, std::size_t n, Stream& stream) {
  host_queue(stream).enqueue([=] { host_ops::accumulate(src, src_dtype, acc, n); });
}

void HostDevice::sum_squares(const void* x, DType dtype, std::size_t n, double* out, Stream& stream) {
  host_queue(stream).enqueue([=] { *out = host_ops::sum_squares(x, dtype, n); });
}

void HostDevice::adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                           const void* grad, DType grad_dtype, void* out, DType out_dtype, std::size_t n,
                           Stream& stream) {
  host_queue(stream).enqueue(
      [=] { host_ops::adam_step(c, master, exp_avg, exp_avg_sq, grad, grad_dtype, out, out_dtype, n); });
}

void HostDevice::sum_squares_batch(std::span<const TensorRegion> xs, DType dtype, double* out, Stream& stream) {
  if (xs.empty()) return;
  host_queue(stream).enqueue([xs = std::vector<TensorRegion>(xs.begin(), xs.end()), dtype, out] {
    const std::size_t esz = dtype_size(dtype);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      // (Many small regions, each in a block of its own: see host_ops::prefetch_read.)
      if (i + 1 < xs.size()) host_ops::prefetch_read(xs[i + 1].data, xs[i + 1].n * esz);
      out[i] = host_ops::sum_squares(xs[i].data, dtype, xs[i].n);
    }
  });
}

void HostDevice::adam_step_batch(std::span<const AdamTensor> ts, DType grad_dtype, DType out_dtype, Stream& stream) {
  if (ts.empty()) return;
  host_queue(stream).enqueue([ts = std::vector<AdamTensor>(ts.begin(), ts.end()), grad_dtype, out_dtype] {
    // Many small tensors (thousands of small modules) lie in blocks of their own: the arrays
    // of the one kPrefetchAhead ahead are fetched while this one computes, since a hardware
    // prefetcher finds a stream only after its first lines.
    auto prefetch = [&](std::size_t j) {
      host_ops::prefetch_adam(ts[j].master, ts[j].exp_avg, ts[j].exp_avg_sq, ts[j].grad, grad_dtype, ts[j].out,
                              out_dtype, ts[j].n);
    };
    host_ops::for_each_prefetched(ts.size(), prefetch, [&](std::size_t i) {
      const AdamTensor& t = ts[i];
      host_ops::adam_step(t.c, t.master, t.exp_avg, t.exp_avg_sq, t.grad, grad_dtype, t.out, out_dtype, t.n);
    });
  });
}

}  // namespace zoe
