#include "src/device/cuda_device.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <exception>

#include "kernels/elementwise_cuda.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/host_access.hpp"

namespace zoe {
namespace {
[[noreturn]] void throw_cuda(cudaError_t err, const std::string& what, const char* file, int line) {
  throw CudaError(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err), static_cast<int>(err),
                  file, line);
}
#define ZOE_CUDA_CHECK(call, ...)                                                               \
  do {                                                                                          \
    cudaError_t zoe_err_ = (call);                                                              \
    if (zoe_err_ != cudaSuccess) throw_cuda(zoe_err_, ::zoe::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
#define ZOE_CUDA_LAUNCH(call, what) \
  ZOE_CUDA_CHECK(static_cast<cudaError_t>(call), "CudaDevice: launching ", what)

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int ordinal) {
    ZOE_CUDA_CHECK(cudaSetDevice(ordinal), "cudaSetDevice(", ordinal, ")");
    ZOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ZOE_CUDA_CHECK(cudaMalloc(&partials, kernels::cuda::kSumSquaresBlocks * sizeof(double)),
                   "cudaMalloc of sum_squares partials");
  }
  ~CudaStream() override {
    cudaStreamSynchronize(stream);
    cudaFree(partials);
    cudaStreamDestroy(stream);
  }
  void keep_error(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!error) error = e;
  }
  std::exception_ptr take_error() {
    std::lock_guard lock(mutex);
    return std::exchange(error, nullptr);
  }

  cudaStream_t stream = nullptr;
  double* partials = nullptr;  // sum_squares scratch, one per stream so streams don't share it
  std::mutex mutex;
  std::exception_ptr error;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int ordinal) {
    ZOE_CUDA_CHECK(cudaSetDevice(ordinal), "cudaSetDevice(", ordinal, ")");
    ZOE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

// The memory type of `p` (cudaMemoryTypeUnregistered for pageable host memory, CUDA >= 11).
cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so a later launch check does not report it
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

CudaStream& cuda_stream(Stream& s) {
  auto* p = dynamic_cast<CudaStream*>(&s);
  ZOE_CHECK_USAGE(p != nullptr, "CudaDevice: stream was not created by a CudaDevice");
  return *p;
}
CudaEvent& cuda_event(Event& e) {
  auto* p = dynamic_cast<CudaEvent*>(&e);
  ZOE_CHECK_USAGE(p != nullptr, "CudaDevice: event was not created by a CudaDevice");
  return *p;
}

struct HostTask {
  std::function<void()> fn;
  CudaStream* stream;
};
void CUDART_CB run_host_task(void* data) {
  std::unique_ptr<HostTask> task(static_cast<HostTask*>(data));
  try {
    task->fn();
  } catch (...) {
    task->stream->keep_error(std::current_exception());
  }
}
}  // namespace

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  int count = 0;
  ZOE_CUDA_CHECK(cudaGetDeviceCount(&count), "CudaDevice: cannot use cuda:", ordinal,
                 " (cudaGetDeviceCount failed; is an NVIDIA driver installed?)");
  if (ordinal < 0 || ordinal >= count)
    throw CudaError(detail::concat("CudaDevice: cuda:", ordinal, " does not exist (", count, " GPU(s) visible)"),
                    static_cast<int>(cudaErrorInvalidDevice), __FILE__, __LINE__);
  ZOE_CUDA_CHECK(cudaSetDevice(ordinal), "cudaSetDevice(", ordinal, ")");
  cudaDeviceProp prop{};
  ZOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties(", ordinal, ")");
  name_ = detail::concat("cuda:", ordinal, " (", prop.name, ")");
  // Keep freed memory in the pool: the engine frees and re-allocates gather buffers often.
  cudaMemPool_t pool;
  ZOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool");
  std::uint64_t keep = UINT64_MAX;
  ZOE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  cudaStream_t s;
  ZOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  alloc_stream_ = s;
  compute_ = std::make_unique<CudaStream>(ordinal);
  add_host_access_guard(this);
}

CudaDevice::~CudaDevice() {
  remove_host_access_guard(this);
  make_current();
  compute_.reset();
  for (auto& [ptr, bytes] : sizes_) cudaFreeAsync(ptr, static_cast<cudaStream_t>(alloc_stream_));
  cudaStreamSynchronize(static_cast<cudaStream_t>(alloc_stream_));
  cudaStreamDestroy(static_cast<cudaStream_t>(alloc_stream_));
}

void CudaDevice::make_current() const { ZOE_CUDA_CHECK(cudaSetDevice(ordinal_), "cudaSetDevice(", ordinal_, ")"); }

void* CudaDevice::native(Stream& stream) { return cuda_stream(stream).stream; }

void* CudaDevice::allocate(std::size_t bytes) {
  make_current();
  void* ptr = nullptr;
  auto s = static_cast<cudaStream_t>(alloc_stream_);
  cudaError_t err = cudaMallocAsync(&ptr, bytes ? bytes : 1, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    ZOE_THROW(OutOfMemoryError, name_, ": out of memory allocating ", bytes, " bytes (", memory_stats().current_bytes,
              " allocated by zoe, ", free_b, " of ", total_b, " free)");
  }
  ZOE_CUDA_CHECK(err, name_, ": cudaMallocAsync of ", bytes, " bytes");
  std::lock_guard lock(mutex_);
  sizes_.emplace(ptr, bytes);
  stats_.current_bytes += static_cast<std::int64_t>(bytes);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  return ptr;
}

void CudaDevice::deallocate(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard lock(mutex_);
    auto it = sizes_.find(ptr);
    ZOE_CHECK_USAGE(it != sizes_.end(), name_, ": deallocate of ", ptr, ", which this device did not allocate");
    stats_.current_bytes -= static_cast<std::int64_t>(it->second);
    sizes_.erase(it);
  }
  make_current();
  ZOE_CUDA_CHECK(cudaFreeAsync(ptr, static_cast<cudaStream_t>(alloc_stream_)), name_, ": cudaFreeAsync");
}

DeviceMemoryStats CudaDevice::memory_stats() const {
  std::lock_guard lock(mutex_);
  DeviceMemoryStats s = stats_;
  cudaMemPool_t pool;
  ZOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
  std::uint64_t reserved = 0, high = 0;
  ZOE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
                 "cudaMemPoolGetAttribute(ReservedMemCurrent)");
  ZOE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high),
                 "cudaMemPoolGetAttribute(ReservedMemHigh)");
  s.reserved_bytes = static_cast<std::int64_t>(reserved);
  s.reserved_peak_bytes = static_cast<std::int64_t>(high);
  return s;
}

void CudaDevice::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  cudaMemPool_t pool;
  ZOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
  std::uint64_t zero = 0;  // the only value ReservedMemHigh takes: reset to the current
  ZOE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero),
                 "cudaMemPoolSetAttribute(ReservedMemHigh)");
}

bool CudaDevice::register_host_memory(void* ptr, std::size_t bytes) {
  make_current();
  cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls don't see it
    ZOE_LOG_WARN("{}: cudaHostRegister of {} bytes failed ({}); copies from it will be pageable", name_, bytes,
                 cudaGetErrorString(err));
    return false;
  }
  return true;
}

void CudaDevice::unregister_host_memory(void* ptr) {
  make_current();
  if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
}

std::int64_t CudaDevice::pageable_copy_count() const { return pageable_copies_.load(std::memory_order_relaxed); }

void CudaDevice::check_host_accessible(const void* ptr, std::size_t bytes, const char* what) const {
  if (!ptr || bytes == 0) return;
  make_current();
  const char* last = static_cast<const char*>(ptr) + (bytes - 1);
  if (memory_type(ptr) == cudaMemoryTypeDevice || memory_type(last) == cudaMemoryTypeDevice)
    ZOE_THROW(UsageError, what ? what : "host code", ": [", ptr, ", +", bytes, " bytes) lies in the device memory of ",
              name_, ", which host code may reach only through Device::copy");
}

std::unique_ptr<Stream> CudaDevice::create_stream() { return std::make_unique<CudaStream>(ordinal_); }

std::unique_ptr<Event> CudaDevice::create_event() { return std::make_unique<CudaEvent>(ordinal_); }

void CudaDevice::record(Event& event, Stream& stream) {
  make_current();
  ZOE_CUDA_CHECK(cudaEventRecord(cuda_event(event).event, cuda_stream(stream).stream), name_, ": cudaEventRecord");
}

void CudaDevice::wait(Stream& stream, Event& event) {
  make_current();
  ZOE_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(stream).stream, cuda_event(event).event, 0), name_,
                 ": cudaStreamWaitEvent");
}

void CudaDevice::synchronize(Event& event) {
  make_current();
  ZOE_CUDA_CHECK(cudaEventSynchronize(cuda_event(event).event), name_, ": cudaEventSynchronize");
}

bool CudaDevice::query(Event& event) {
  make_current();
  cudaError_t err = cudaEventQuery(cuda_event(event).event);
  if (err == cudaErrorNotReady) return false;
  ZOE_CUDA_CHECK(err, name_, ": cudaEventQuery");
  return true;
}

void CudaDevice::synchronize(Stream& stream) {
  make_current();
  CudaStream& s = cuda_stream(stream);
  ZOE_CUDA_CHECK(cudaStreamSynchronize(s.stream), name_, ": cudaStreamSynchronize");
  if (auto e = s.take_error()) std::rethrow_exception(e);
}

void CudaDevice::host_func(Stream& stream, std::function<void()> fn) {
  ZOE_CHECK_USAGE(fn != nullptr, "CudaDevice::host_func: empty function");
  make_current();
  CudaStream& s = cuda_stream(stream);
  auto task = std::make_unique<HostTask>(HostTask{std::move(fn), &s});
  ZOE_CUDA_CHECK(cudaLaunchHostFunc(s.stream, run_host_task, task.get()), name_, ": cudaLaunchHostFunc");
  task.release();  // run_host_task owns it now
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  make_current();
  const cudaMemoryType d = memory_type(dst), s_type = memory_type(src);
  if ((d == cudaMemoryTypeDevice && s_type == cudaMemoryTypeUnregistered) ||
      (s_type == cudaMemoryTypeDevice && d == cudaMemoryTypeUnregistered))
    pageable_copies_.fetch_add(1, std::memory_order_relaxed);
  ZOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream(stream).stream), name_,
                 ": cudaMemcpyAsync of ", bytes, " bytes");
}

void CudaDevice::fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) {
  make_current();
  ZOE_CUDA_LAUNCH(kernels::cuda::fill(dst, dtype, n, value, cuda_stream(stream).stream), "fill");
}

void CudaDevice::cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n, Stream& stream) {
  ZOE_CHECK_USAGE(n == 0 || src != dst, "CudaDevice::cast: src and dst must differ (", src, ")");
  make_current();
  ZOE_CUDA_LAUNCH(kernels::cuda::cast(src, src_dtype, dst, dst_dtype, n, cuda_stream(stream).stream), "cast");
}

void CudaDevice::scale(void* x, DType dtype, std::size_t n, float factor, Stream& stream) {
  make_current();
  ZOE_CUDA_LAUNCH(kernels::cuda::scale(x, dtype, n, factor, cuda_stream(stream).stream), "scale");
}

void CudaDevice::accumulate(const void* src, DType src_dtype, float* acc, std::size_t n, Stream& stream) {
  make_current();
  ZOE_CUDA_LAUNCH(kernels::cuda::accumulate(src, src_dtype, acc, n, cuda_stream(stream).stream), "accumulate");
}

void CudaDevice::sum_squares(const void* x, DType dtype, std::size_t n, double* out, Stream& stream) {
  make_current();
  CudaStream& s = cuda_stream(stream);
  ZOE_CUDA_LAUNCH(kernels::cuda::sum_squares(x, dtype, n, out, s.partials, s.stream), "sum_squares");
}

void CudaDevice::adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                           const void* grad, DType grad_dtype, void* out, DType out_dtype, std::size_t n,
                           Stream& stream) {
  make_current();
  ZOE_CUDA_LAUNCH(kernels::cuda::adam_step(c, master, exp_avg, exp_avg_sq, grad, grad_dtype, out, out_dtype, n,
                                           cuda_stream(stream).stream),
                  "adam_step");
}

}  // namespace zoe
