// The Device interface: memory with byte accounting, streams, events, async copies
// and the few elementwise ops the engine needs. Backends: HostDevice (host memory,
// each stream an in-order executor thread) and CudaDevice (CUDA runtime only).
//
// Semantics follow CUDA: work queued on one stream runs in order; work on different
// streams may overlap; an Event records a point in a stream's queue. All "device
// pointers" are addresses valid for this backend (host addresses on HostDevice; on
// CUDA, device or pinned host addresses under UVA).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kernels/adam_math.hpp"
#include "zoe/device_kind.hpp"
#include "zoe/dtype.hpp"

namespace zoe {

/// An in-order queue of device work. Created by Device::create_stream().
class Stream {
 public:
  virtual ~Stream() = default;
};

/// A point in a stream's queue; complete once all work queued before it has run.
class Event {
 public:
  virtual ~Event() = default;
};

/// Device memory in bytes, as torch.cuda counts it. Allocated: the sizes passed to allocate()
/// for blocks not yet deallocate()d (live buffers; torch.cuda.memory_allocated /
/// max_memory_allocated). Reserved: what the allocator holds for them, live blocks rounded up to
/// its granularity plus the freed blocks it keeps for reuse (HostDevice's block cache and
/// quarantine, the CUDA stream-ordered pool; torch.cuda.memory_reserved / max_memory_reserved),
/// so reserved >= allocated. Peaks are high-water marks since construction or reset_peak().
/// One region of Device::copy_batch: `bytes` from `src` to `dst` (addresses as for copy()).
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

/// Where a batch's regions lie (cudaMemcpyBatchAsync's location hints). `any`: the device
/// finds out per region, as copy() does; `within_device`: the caller's word that every source
/// and destination is this device's memory (the engine's own buffers), so none is looked up
/// (debug builds check it).
enum class CopyPlaces { any, within_device };

/// One tensor of a batched reduction (Device::sum_squares_batch): `n`
/// elements of the batch's dtype at `data` (device memory).
struct TensorRegion {
  const void* data = nullptr;
  std::size_t n = 0;
};

/// One tensor of Device::adam_step_batch: the arguments of one adam_step (its comment says
/// what each is), with its own coefficients.
struct AdamTensor {
  kernels::AdamCoeffs c;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  void* out = nullptr;  // nullptr: no output
  std::size_t n = 0;
};

struct DeviceMemoryStats {
  std::int64_t current_bytes = 0;        // allocated now
  std::int64_t peak_bytes = 0;           // most allocated at any time (the allocated peak)
  std::int64_t reserved_bytes = 0;       // reserved now
  std::int64_t reserved_peak_bytes = 0;  // most reserved at any time (the reserved peak)
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  /// e.g. "host" or "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  /// The CUDA device ordinal (cudaSetDevice), -1 for the host device.
  virtual int ordinal() const { return -1; }
  /// The backend's native handle of `stream`: its cudaStream_t on CUDA, nullptr on the host.
  virtual void* native_handle(Stream& stream) { return nullptr; }

  // ---- memory (bytes) ----
  /// Allocates `bytes` of device memory, 256-byte aligned, uninitialised. Throws OutOfMemoryError.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Frees memory from allocate(); nullptr is ignored. Caller ensures no queued work uses it.
  virtual void deallocate(void* ptr) = 0;
  /// A consistent snapshot of the counters (one lock). Thread-safe.
  virtual DeviceMemoryStats memory_stats() const = 0;
  /// Sets both peaks to the current values (torch.cuda.reset_peak_memory_stats). Thread-safe.
  virtual void reset_peak() = 0;
  /// Page-locks host memory for fast async copies (cudaHostRegister; no-op on host).
  /// Returns false if the backend refused (caller falls back to pageable memory).
  virtual bool register_host_memory(void* ptr, std::size_t bytes) = 0;
  virtual void unregister_host_memory(void* ptr) = 0;

  // ---- transfer accounting and host-access checks ----
  /// How many copy() calls so far moved bytes between device memory and host memory that is
  /// neither device memory nor registered (register_host_memory / the pinned pool): the
  /// pageable path, which a CUDA copy runs synchronously through a bounce buffer. The engine's
  /// hot path makes none. Thread-safe (a relaxed counter).
  virtual std::int64_t pageable_copy_count() const { return 0; }
  /// Throws UsageError naming `what`, the address and the size when [ptr, ptr + bytes) lies in
  /// memory the host may not read or write directly (device memory of a discrete device; the
  /// discrete host device's arena). Host code of the engine (CPU optimizer, tiers, checkpoints,
  /// memcpy) calls it on every pointer it is handed, so a missing Device copy fails loudly on
  /// the CPU suite. No-op where host code may touch device memory (the unified host device).
  virtual void check_host_accessible(const void* ptr, std::size_t bytes, const char* what) const {}
  /// zoe.debug_poison: from now on freed blocks are filled with NaN and held back (up to
  /// `quarantine_bytes`, oldest returned first) instead of being reused at once, so a stale view
  /// reads NaN rather than a later buffer's values. No-op where the allocator cannot do it (CUDA:
  /// the engine's own NaN fill of freed buffers still applies). Call before allocating.
  virtual void set_poison_freed(std::size_t quarantine_bytes) {}

  // ---- streams and events ----
  /// The stream the trainer's compute runs on.
  virtual Stream& compute_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  /// Records `event` at the current end of `stream`'s queue (re-recording moves it).
  virtual void record(Event& event, Stream& stream) = 0;
  /// Work queued on `stream` after this call waits for `event`.
  virtual void wait(Stream& stream, Event& event) = 0;
  /// Blocks the calling thread until `event` completes (an unrecorded event is complete).
  virtual void synchronize(Event& event) = 0;
  /// True if `event` has completed.
  virtual bool query(Event& event) = 0;
  /// Blocks until everything queued on `stream` has run. Rethrows the first exception a
  /// host-backend task raised on that stream.
  virtual void synchronize(Stream& stream) = 0;
  /// Makes the trainer's next compute wait for `event`. Default (kernels on the device's own
  /// streams, as on CUDA): the compute stream waits, the caller does not block. The host device,
  /// whose trainer computes on the calling thread, blocks until the event completes.
  virtual void compute_waits(Event& event) { wait(compute_stream(), event); }
  /// Work queued on `waiter` after this call waits for everything queued on `producer` so far
  /// (an event recorded on `producer` and waited on by `waiter`, which is what the default does
  /// with `scratch`: an event of the caller's that holds nothing else). The host device records
  /// nothing: it compares `producer`'s last queued task with what has run and with `waiter`'s
  /// earlier waits, so a producer with nothing new costs two loads. Thread-safety: as record
  /// and wait (`scratch` used by one thread at a time).
  virtual void stream_waits_for(Stream& waiter, Stream& producer, Event& scratch) {
    record(scratch, producer);
    wait(waiter, scratch);
  }
  /// The trainer's next compute waits for everything queued on `producer` so far (as
  /// compute_waits of an event recorded there; `scratch` as in stream_waits_for). The host
  /// device blocks until that work has run, and rethrows the first error of `producer`'s tasks
  /// up to there.
  virtual void compute_waits_for(Stream& producer, Event& scratch) {
    record(scratch, producer);
    compute_waits(scratch);
  }
  /// dst[i] = value (as fill) for a buffer no queued work uses (a fresh allocation), ordered
  /// before the trainer's next compute. Default (kernels on the device's own streams, as on
  /// CUDA): queued on the compute stream, the caller does not block. The host device, whose
  /// trainer computes on the calling thread, fills on the calling thread at once: no stream
  /// round trip. Thread-safety: as fill.
  virtual void fill_for_compute(void* dst, DType dtype, std::size_t n, float value) {
    fill(dst, dtype, n, value, compute_stream());
  }
  /// Queues a host callback on `stream` (cudaLaunchHostFunc). It must not call the device.
  virtual void host_func(Stream& stream, std::function<void()> fn) = 0;

  // ---- copies and elementwise ops, all async on `stream`; n in elements ----
  /// Copies `bytes` between any two addresses of this device or pinned/pageable host memory.
  virtual void copy(void* dst, const void* src, std::size_t bytes, Stream& stream) = 0;
  /// One copy of many regions (cudaMemcpyBatchAsync's idea): what copy() of each region in
  /// order would do, as one operation on `stream`, so packing many small shards into a
  /// coalesced collective's buffer (and out of it) costs one queued operation, not one per
  /// shard. Regions may not overlap each other's destinations. Default: copy() per region.
  /// Thread-safety: as copy. Throws UsageError for a null pointer in a non-empty region.
  virtual void copy_batch(std::span<const CopyRegion> regions, CopyPlaces places, Stream& stream) {
    (void)places;
    for (const CopyRegion& r : regions) copy(r.dst, r.src, r.bytes, stream);
  }
  /// dst[i] = value (converted to dtype, round to nearest even).
  virtual void fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) = 0;
  /// dst[i] = convert(src[i]) (round to nearest even; NaN stays NaN). src != dst.
  virtual void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
                    Stream& stream) = 0;
  /// x[i] *= factor (computed in fp32, rounded to dtype).
  virtual void scale(void* x, DType dtype, std::size_t n, float factor, Stream& stream) = 0;
  /// acc[i] += float(src[i]): gradient accumulation into fp32.
  virtual void accumulate(const void* src, DType src_dtype, float* acc, std::size_t n, Stream& stream) = 0;
  /// *out = sum of float(x[i])^2 accumulated in fp64 in a fixed order (deterministic for
  /// any thread count). `out` is device memory.
  virtual void sum_squares(const void* x, DType dtype, std::size_t n, double* out, Stream& stream) = 0;
  /// out[i] = sum_squares of xs[i] (same bits as sum_squares of each), as one operation on
  /// `stream` (multi-tensor apply): a step over thousands of small groups queues one
  /// operation, not one per group. `out` is device memory of xs.size() doubles. Default:
  /// sum_squares per tensor. Thread-safety: as sum_squares.
  virtual void sum_squares_batch(std::span<const TensorRegion> xs, DType dtype, double* out, Stream& stream) {
    for (std::size_t i = 0; i < xs.size(); ++i) sum_squares(xs[i].data, dtype, xs[i].n, out + i, stream);
  }

  // ---- the device optimizer ----
  /// Adam / AdamW on n elements in device memory (kernels::adam_update per element, whose
  /// comment gives the math and its source): updates the fp32 `master`, `exp_avg`,
  /// `exp_avg_sq` in place from `grad` (grad_dtype, scaled by c.grad_scale), then stores the
  /// new master weight rounded to `out_dtype` in `out` (nullptr: no output). Elementwise, so
  /// the result is bitwise the same on every backend and thread count, and equal to the CPU
  /// optimizer's (src/optim) for the same coefficients. `out` may not overlap the states.
  virtual void adam_step(const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                         const void* grad, DType grad_dtype, void* out, DType out_dtype, std::size_t n,
                         Stream& stream) = 0;
  /// adam_step of every tensor in `ts` (each with its own coefficients; all with `grad_dtype`
  /// gradients and `out_dtype` outputs), as one operation on `stream` (apex's multi-tensor
  /// apply): bitwise what adam_step of each in order gives. Default: adam_step per tensor.
  /// Thread-safety: as adam_step.
  virtual void adam_step_batch(std::span<const AdamTensor> ts, DType grad_dtype, DType out_dtype, Stream& stream) {
    for (const AdamTensor& t : ts)
      adam_step(t.c, t.master, t.exp_avg, t.exp_avg_sq, t.grad, grad_dtype, t.out, out_dtype, t.n, stream);
  }
};

}  // namespace zoe
