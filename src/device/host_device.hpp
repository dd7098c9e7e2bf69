// HostDevice: the Device backend without a GPU. Device memory is host memory
// (256-byte aligned, byte-accounted); every stream, the compute stream included, is a
// HostStream (an in-order executor thread); events follow CUDA semantics; copies and
// elementwise ops run on the stream's thread as scalar loops over the shared ZOE_HD
// math in kernels/elementwise.hpp.
//
// Memory: like cudaMallocAsync's pool, freed blocks of at least kCacheMinBytes are kept and
// handed back by the next allocate() of the same rounded size, so the buffers a training step
// allocates and frees (gathered parameters, gradient buckets) do not fault in fresh pages every
// step. A miss releases cached blocks (largest first) until live + cached bytes fit within the
// peak of live bytes: the footprint never exceeds what the live blocks once needed. Not under ASan
// (it would hide use-after-free). set_poison_freed() (zoe.debug_poison) replaces the cache by
// a poisoned quarantine.
// Trainer usage: the trainer computes on its own thread. Work the engine queues on
// compute_stream() runs on that stream's thread; synchronize(compute_stream()) or an
// event recorded there makes its results visible to the calling thread, and work queued
// after the trainer's writes sees those writes (queuing orders memory).
// Errors: an exception thrown by queued work (a host_func, a collective) is kept by its
// stream: synchronize(stream) rethrows and clears it; synchronize(event) rethrows it
// without clearing when it happened at or before the event's point.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/device/device.hpp"
#include "src/device/host_stream.hpp"

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
  /// `capacity_bytes` bounds current_bytes (0 = unbounded): allocate() beyond it throws
  /// OutOfMemoryError, like a GPU of that size would.
  explicit HostDevice(std::size_t capacity_bytes = 0);
  ~HostDevice() override;

  DeviceKind kind() const override { return DeviceKind::host; }
  std::string name() const override { return "host"; }

  /// Smallest block (bytes) the cache keeps: below it malloc reuses memory by itself.
  static constexpr std::size_t kCacheMinBytes = std::size_t{1} << 20;
  /// Whether freed blocks are cached (false under AddressSanitizer).
  static constexpr bool kCachesBlocks = ZOE_HOST_DEVICE_CACHES_BLOCKS;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  DeviceMemoryStats memory_stats() const override;
  /// Bytes held by the block cache (freed, not returned to the system).
  std::size_t cached_bytes() const;
  /// Debugging use-after-free (zoe.debug_poison): from now on every freed block is filled with
  /// 0xFF bytes (NaN in fp32, bf16 and fp16) and kept out of the block cache in a FIFO
  /// quarantine of at most `quarantine_bytes` (older blocks go back to the system; the newest
  /// always stays), so a read through a pointer kept past its free reads NaN, never the
  /// values of a buffer allocated later. Releases the cached blocks. Thread-safe.
  void set_poison_freed(std::size_t quarantine_bytes);
  /// Bytes held by the quarantine (0 unless set_poison_freed was called).
  std::size_t quarantined_bytes() const;
  void reset_peak() override;
  bool register_host_memory(void* ptr, std::size_t bytes) override { return true; }
  void unregister_host_memory(void* ptr) override {}

  Stream& compute_stream() override { return *compute_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void record(Event& event, Stream& stream) override;
  void wait(Stream& stream, Event& event) override;
  void synchronize(Event& event) override;
  bool query(Event& event) override;
  void synchronize(Stream& stream) override;
  void host_func(Stream& stream, std::function<void()> fn) override;

  void copy(void* dst, const void* src, std::size_t bytes, Stream& stream) override;
  void fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) override;
  void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
            Stream& stream) override;
  void scale(void* x, DType dtype, std::size_t n, float factor, Stream& stream) override;
  void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n, Stream& stream) override;
  void sum_squares(const void* x, DType dtype, std::size_t n, double* out, Stream& stream) override;
  void all_finite(const void* x, DType dtype, std::size_t n, int* out, Stream& stream) override;
  void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
                 DType grad_dtype, void* out, DType out_dtype, std::size_t n, Stream& stream) override;

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;  // live blocks: requested bytes
  std::map<std::size_t, std::vector<void*>> cache_;  // freed blocks by rounded size
  std::size_t cached_bytes_ = 0;
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
