// CudaDevice: the Device on one NVIDIA GPU, through the CUDA runtime only (linked
// statically, so a machine without a driver still runs zoe and gets a clear error).
// Memory: cudaMallocAsync from the device's default pool on an internal allocation
// stream (synchronized before allocate() returns, so the memory is usable on any stream),
// freed with cudaFreeAsync; byte accounting counts the bytes asked for. Streams are
// non-blocking cudaStreams, events cudaEvents without timing. register_host_memory is
// cudaHostRegister. Elementwise ops are the kernels in kernels/elementwise.cu.
// Transfer accounting: copy() asks cudaPointerGetAttributes for both sides and counts a copy
// as pageable when one side is device memory and the other unregistered host memory (not
// cudaHostRegister'ed, not cudaHostAlloc'ed, not managed). check_host_accessible throws for
// cudaMemoryTypeDevice; the device is listed in host_access.hpp's process-wide check.
// Errors: CUDA failures throw CudaError with the CUDA error name and text; an exception
// thrown by a host_func is kept by its stream and rethrown by synchronize(stream).
// Thread-safety: every method may be called from any thread (each sets the device first).
// Built only when zoe has CUDA (ZOE_HAVE_CUDA).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "src/device/device.hpp"

namespace zoe {

class CudaDevice final : public Device {
 public:
  /// Opens GPU `ordinal`. Throws CudaError (e.g. code 35, "CUDA driver version is
  /// insufficient" when no driver is installed) if it cannot.
  explicit CudaDevice(int ordinal = 0);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  int ordinal() const override { return ordinal_; }
  void* native_handle(Stream& stream) override { return native(stream); }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  /// Allocated: zoe's own count of the bytes requested of live blocks. Reserved: the default
  /// memory pool's cudaMemPoolAttrReservedMemCurrent / ReservedMemHigh (the pool keeps freed
  /// memory: release threshold UINT64_MAX), which also counts other users of that pool on this
  /// device. Thread-safe. Throws CudaError if the pool cannot be queried.
  DeviceMemoryStats memory_stats() const override;
  /// Both peaks to the current values (the pool's ReservedMemHigh reset to its current). Thread-safe.
  void reset_peak() override;
  bool register_host_memory(void* ptr, std::size_t bytes) override;
  void unregister_host_memory(void* ptr) override;
  std::int64_t pageable_copy_count() const override;
  /// Throws UsageError if ptr or ptr + bytes - 1 is device memory (cudaMemoryTypeDevice).
  void check_host_accessible(const void* ptr, std::size_t bytes, const char* what) const override;

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
  void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad,
                 DType grad_dtype, void* out, DType out_dtype, std::size_t n, Stream& stream) override;

  /// The cudaStream_t of a stream of this backend (as void*, so callers need no CUDA headers).
  static void* native(Stream& stream);
  /// Makes this device current on the calling thread.
  void make_current() const;

 private:
  int ordinal_;
  std::string name_;
  void* alloc_stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<Stream> compute_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  DeviceMemoryStats stats_;
  std::atomic<std::int64_t> pageable_copies_{0};
};

}  // namespace zoe
