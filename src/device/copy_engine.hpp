// CopyEngine: the discrete host device's model of a GPU copy engine (a DMA engine on the
// PCIe link). One worker thread runs copies one at a time in submission order, each taking
// latency + bytes / bandwidth of modelled time: the worker sleeps until that time has passed
// since the copy started, then moves the bytes. Moving them at the end (not the start) means
// a caller that reads the destination, or overwrites the source, before the copy completes
// sees the wrong bytes, as it could on a GPU. A copy therefore takes the modelled time plus
// its memmove. The discrete HostDevice owns two engines, host-to-device and device-to-host,
// as GPUs have (PCIe is full duplex: a gradient going down overlaps a parameter going up,
// while two copies in the same direction share the bandwidth).
// Thread-safety: copy() may be called from any thread; copies from different callers are
// serialised in the order they reach the engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zoe {

class HostQueue;

/// The cost of one copy: latency + bytes / bandwidth.
struct CopyModel {
  double gbps = 0;        // GB/s (1e9 bytes per second); 0 = not modelled
  double latency_us = 0;  // microseconds per copy
  /// Modelled time of a copy of `bytes`.
  std::chrono::nanoseconds duration(std::size_t bytes) const;
};

class CopyEngine {
 public:
  /// Starts the worker thread, named `name` in logs (e.g. "copy-h2d").
  CopyEngine(std::string name, CopyModel model);
  /// Runs every copy already submitted, then stops the worker.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  /// Queues memmove(dst, src, bytes) after the modelled time and blocks until it has run.
  /// Called from a stream's thread, so the stream's later work waits for the copy while other
  /// streams go on. Throws nothing.
  void copy(void* dst, const void* src, std::size_t bytes);
  const CopyModel& model() const noexcept { return model_; }
  /// Copies run so far, and their bytes.
  std::int64_t copies() const noexcept;
  std::int64_t bytes() const noexcept;

 private:
  struct Counters;
  CopyModel model_;
  std::unique_ptr<Counters> counters_;
  std::unique_ptr<HostQueue> queue_;  // last: destroyed (drained) first
};

}  // namespace zoe
