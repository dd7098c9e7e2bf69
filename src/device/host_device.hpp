// HostDevice: the Device backend without a GPU. Device memory is host memory
// (256-byte aligned, byte-accounted); every stream, the compute stream included, is a
// HostStream (an in-order executor thread); events follow CUDA semantics; elementwise ops
// run on the stream's thread as scalar loops over the shared ZOE_HD math in
// kernels/elementwise.hpp.
//
// Two memory models (HostDeviceOptions::memory, src/device/host_device_options.hpp):
// - unified: host code may touch device memory; copies are memmoves on the stream's thread.
// - discrete: device memory is an arena (the device's own blocks, told apart from host memory
//   by address) that the engine's host code may reach only through copy():
//   check_host_accessible throws for it. A copy between arena and host memory runs on one of
//   two copy engines (host-to-device, device-to-host; src/device/copy_engine.hpp) with the
//   modelled bandwidth and latency; the stream's later work waits for it, other streams go on.
//   Copies within the arena and between host addresses run on the stream's thread, unmodelled.
//   The trainer's compute still reads and writes the arena directly, as kernels do on a GPU.
//   model_kernel() stands in for a kernel of a given duration (benches: a forward pass).
// Transfer accounting (both models): a copy between device memory (live or cached blocks)
// and host memory that is not registered (register_host_memory) counts as pageable.
//
// Memory: like cudaMallocAsync's pool, freed blocks of at least kCacheMinBytes are kept and
// handed back by the next allocate() of the same rounded size, so the buffers a training step
// allocates and frees (gathered parameters, gradient buckets) do not fault in fresh pages every
// step. A miss of a cacheable size releases cached blocks (largest first) until live + cached
// bytes of cacheable blocks fit within their live peak: the footprint never exceeds what the
// live blocks once needed. Smaller blocks are outside that account, so a step's small
// read-back buffer cannot make the cache unmap a gathered buffer (measured: 10 ms of munmap and
// page faults per step at Psi = 100M on the build VM, in step()'s return time); they come from
// slabs (SmallBlocks: a free reads a flat table of block states, no hash node), wait in free
// lists by rounded size and are never released before the device goes (a size class holds at
// most as many blocks as were once live of it), so a model of thousands of small modules, whose
// gradient buffers come and go every module, allocates nothing from the system after its first
// step. Not under ASan (it would hide use-after-free). set_poison_freed() (zoe.debug_poison)
// replaces the cache by a poisoned quarantine, and retires freed small blocks in their slabs.
// Trainer usage: the trainer computes on its own thread. Work the engine queues on
// compute_stream() runs on that stream's thread; synchronize(compute_stream()) or an
// event recorded there makes its results visible to the calling thread, and work queued
// after the trainer's writes sees those writes (queuing orders memory).
// Errors: an exception thrown by queued work (a host_func, a collective) is kept by its
// stream: synchronize(stream) rethrows and clears it; synchronize(event) rethrows it
// without clearing when it happened at or before the event's point.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/device/address_ranges.hpp"
#include "src/device/copy_engine.hpp"
#include "src/device/device.hpp"
#include "src/device/host_device_options.hpp"
#include "src/device/host_stream.hpp"
#include "src/device/small_blocks.hpp"

namespace zoe {

#if defined(__SANITIZE_ADDRESS__)
#define ZOE_HOST_DEVICE_CACHES_BLOCKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZOE_HOST_DEVICE_CACHES_BLOCKS 0
#endif
#endif
#ifndef ZOE_HOST_DEVICE_CACHES_BLOCKS
#define ZOE_HOST_DEVICE_CACHES_BLOCKS 1
#endif

class HostDevice final : public Device {
 public:
  /// A unified device. `capacity_bytes` bounds current_bytes (0 = unbounded): allocate()
  /// beyond it throws OutOfMemoryError, like a GPU of that size would.
  explicit HostDevice(std::size_t capacity_bytes = 0);
  /// A device of either model. Throws UsageError for invalid options (validate()).
  explicit HostDevice(const HostDeviceOptions& options);
  ~HostDevice() override;

  /// host in both models: src/core must not branch on the kind.
  DeviceKind kind() const override { return DeviceKind::host; }
  /// "host" (unified) or "host (discrete)".
  std::string name() const override;
  HostMemoryModel memory_model() const noexcept { return options_.memory; }
  const HostDeviceOptions& options() const noexcept { return options_; }

  /// Every block's address and rounded size are multiples of it (cudaMalloc's 256 bytes).
  static constexpr std::size_t kAlignment = 256;
  /// Smallest block (bytes) the cache keeps: smaller ones come from slabs (SmallBlocks).
  static constexpr std::size_t kCacheMinBytes = std::size_t{1} << 20;
  /// Whether freed blocks are cached (false under AddressSanitizer).
  static constexpr bool kCachesBlocks = ZOE_HOST_DEVICE_CACHES_BLOCKS;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  /// Allocated: the bytes requested of the live blocks. Reserved: the 256-byte-rounded bytes of
  /// every block the device holds, live, in the block cache or in the poison quarantine (what
  /// the footprint in host memory is). Thread-safe.
  DeviceMemoryStats memory_stats() const override;
  /// Bytes held by the block cache of blocks of at least kCacheMinBytes (freed, not returned
  /// to the system; the account a miss releases from).
  std::size_t cached_bytes() const;
  /// Bytes held by the free lists of smaller blocks (never released before the device goes).
  std::size_t small_cached_bytes() const;
  /// Debugging use-after-free (zoe.debug_poison): from now on every freed block is filled with
  /// 0xFF bytes (NaN in fp32, bf16 and fp16) and kept out of the block cache in a FIFO
  /// quarantine of at most `quarantine_bytes` (older blocks go back to the system; the newest
  /// always stays), so a read through a pointer kept past its free reads NaN, never the
  /// values of a buffer allocated later. Releases the cached blocks. Thread-safe.
  void set_poison_freed(std::size_t quarantine_bytes) override;
  /// Bytes held by the quarantine (0 unless set_poison_freed was called).
  std::size_t quarantined_bytes() const;
  void reset_peak() override;
  /// Records [ptr, ptr + bytes) as registered (pinned): copies from or to it do not count as
  /// pageable. Returns false, recording nothing, for a null or empty range or one that
  /// overlaps device memory or a registered range (CUDA refuses a second registration too).
  bool register_host_memory(void* ptr, std::size_t bytes) override;
  /// Forgets the range registered at `ptr`; an unknown ptr is ignored (as CudaDevice does).
  void unregister_host_memory(void* ptr) override;

  /// Copies so far between device memory and unregistered host memory (see the file comment).
  std::int64_t pageable_copy_count() const override;
  /// discrete: throws UsageError naming `what`, the address and the size if [ptr, ptr + bytes)
  /// overlaps the arena (a live or cached block). unified: never throws.
  void check_host_accessible(const void* ptr, std::size_t bytes, const char* what) const override;
  /// True if [ptr, ptr + bytes) overlaps one of this device's blocks (live or cached).
  bool is_device_memory(const void* ptr, std::size_t bytes = 1) const;
  /// Queues a stand-in kernel on `stream` that occupies it for `seconds` (sleeping, so it
  /// costs no CPU): the modelled duration of a forward pass or other GPU work, for benches
  /// measuring overlap on a small machine. Throws UsageError for a negative or non-finite time.
  void model_kernel(Stream& stream, double seconds);
  /// The discrete model's copy engines (nullptr in the unified model): counters for tests.
  const CopyEngine* h2d_engine() const noexcept { return h2d_.get(); }
  const CopyEngine* d2h_engine() const noexcept { return d2h_.get(); }

  Stream& compute_stream() override { return *compute_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void record(Event& event, Stream& stream) override;
  void wait(Stream& stream, Event& event) override;
  void synchronize(Event& event) override;
  bool query(Event& event) override;
  void synchronize(Stream& stream) override;
  void host_func(Stream& stream, std::function<void()> fn) override;
  /// The trainer computes on the calling thread: blocks until `event` completes.
  void compute_waits(Event& event) override { synchronize(event); }
  void stream_waits_for(Stream& waiter, Stream& producer, Event& scratch) override;
  void compute_waits_for(Stream& producer, Event& scratch) override;
  void fill_for_compute(void* dst, DType dtype, std::size_t n, float value) override;

  void copy(void* dst, const void* src, std::size_t bytes, Stream& stream) override;
  /// One task for all the regions (their routes decided under one lock).
  void copy_batch(std::span<const CopyRegion> regions, CopyPlaces places, Stream& stream) override;
  void fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) override;
  void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
            Stream& stream) override;
  void scale(void* x, DType dtype, std::size_t n, float factor, Stream& stream) override;
  void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n, Stream& stream) override;
  void sum_squares(const void* x, DType dtype, std::size_t n, double* out, Stream& stream) override;
  void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
                 DType grad_dtype, void* out, DType out_dtype, std::size_t n, Stream& stream) override;
  // The batches: one task each.
  void sum_squares_batch(std::span<const TensorRegion> xs, DType dtype, double* out, Stream& stream) override;
  void adam_step_batch(std::span<const AdamTensor> ts, DType grad_dtype, DType out_dtype, Stream& stream) override;

 private:
  /// Which way a copy goes, decided when it is queued.
  enum class Route { host_to_host, host_to_device, device_to_host, device_to_device };
  Route route_of(void* dst, const void* src, std::size_t bytes);  // also counts pageable copies
  Route route_locked(void* dst, const void* src, std::size_t bytes);  // route_of; the caller holds mutex_
  /// One copy the way its route goes: through the discrete model's copy engines between device
  /// and host memory (h2d / d2h; null in the unified model), memmove otherwise.
  static void copy_by_route(Route route, CopyEngine* h2d, CopyEngine* d2h, const CopyRegion& r);
  void free_block(void* ptr);  // back to the system; the caller holds mutex_

  HostDeviceOptions options_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  // Live blocks of at least kCacheMinBytes (all blocks when kCachesBlocks is false): requested bytes.
  std::unordered_map<void*, std::size_t> sizes_;
  AddressRanges blocks_;      // every block this device holds (live and cached), rounded bytes
  AddressRanges registered_;  // register_host_memory ranges
  std::atomic<std::int64_t> pageable_copies_{0};
  std::shared_ptr<CopyEngine> h2d_, d2h_;  // discrete only; shared with queued copies
  std::map<std::size_t, std::vector<void*>> cache_;  // freed blocks by rounded size
  std::size_t cached_bytes_ = 0;
  // Smaller blocks (when kCachesBlocks): carved from slabs, their states in a flat table, freed
  // ones in free lists by rounded size (a free finds no hash node: thousands of small modules'
  // buffers come and go every step).
  SmallBlocks small_{kAlignment};
  std::size_t small_cached_bytes_ = 0;
  bool poison_freed_ = false;                                     // set_poison_freed
  std::size_t quarantine_cap_ = 0, quarantined_bytes_ = 0;
  std::deque<std::pair<void*, std::size_t>> quarantine_;          // poisoned freed blocks, oldest first
  std::size_t live_rounded_ = 0, live_rounded_peak_ = 0;  // live blocks' rounded bytes
  DeviceMemoryStats stats_;
  std::unique_ptr<HostStream> compute_;
  int streams_created_ = 0;
};

/// The HostQueue behind `stream`; throws UsageError if it is not a HostStream.
HostQueue& host_queue(Stream& stream);

}  // namespace zoe
