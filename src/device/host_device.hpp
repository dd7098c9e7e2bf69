// HostDevice: the Device backend without a GPU. Device memory is host memory
// (256-byte aligned, byte-accounted); every stream, the compute stream included, is a
// HostStream (an in-order executor thread); events follow CUDA semantics; copies and
// elementwise ops run on the stream's thread as scalar loops over the shared ZOE_HD
// math in kernels/elementwise.hpp.
//
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
#include <memory>
#include <mutex>
#include <unordered_map>

#include "src/device/device.hpp"
#include "src/device/host_stream.hpp"

namespace zoe {

class HostDevice final : public Device {
 public:
  /// `capacity_bytes` bounds current_bytes (0 = unbounded): allocate() beyond it throws
  /// OutOfMemoryError, like a GPU of that size would.
  explicit HostDevice(std::size_t capacity_bytes = 0);
  ~HostDevice() override;

  DeviceKind kind() const override { return DeviceKind::host; }
  std::string name() const override { return "host"; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  DeviceMemoryStats memory_stats() const override;
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
  std::unordered_map<void*, std::size_t> sizes_;
  DeviceMemoryStats stats_;
  std::unique_ptr<HostStream> compute_;
  int streams_created_ = 0;
};

/// The HostQueue behind `stream`; throws UsageError if it is not a HostStream.
HostQueue& host_queue(Stream& stream);

}  // namespace zoe
