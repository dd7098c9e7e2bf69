// EngineContext: what every part of one rank's engine shares and nobody owns alone: the
// config, the rank's device and communicator, the ZeRO stage's decisions, the compute dtype,
// the side stream (collectives, reductions and the copies around them, in program order), the
// memory ledger and the deferred frees. The parts (Model, Collectives, Gatherer, GradReducer,
// Updater) hold a reference to it; Engine::Impl owns it and destroys it last.
// Not thread-safe: the thread that drives the Engine uses it (the ledger alone is atomic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/common/aligned_buffer.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/deferred_frees.hpp"
#include "src/core/device_buffer.hpp"
#include "src/core/memory_ledger.hpp"
#include "src/config/stage_policy.hpp"
#include "src/device/device.hpp"
#include "zoe/engine.hpp"

namespace zoe::core {

/// Host memory registered with the device for the step's small read-backs (sums of squares,
/// finite flags, the step agreement's words): grown on demand, kept between steps, a few
/// bytes per sub-group, not in the ledger.
class ReadbackArea {
 public:
  explicit ReadbackArea(Device& device) : device_(device) {}
  ~ReadbackArea();
  ReadbackArea(const ReadbackArea&) = delete;
  ReadbackArea& operator=(const ReadbackArea&) = delete;
  /// At least `bytes` bytes (the earlier contents are lost when it grows).
  std::byte* get(std::size_t bytes);

 private:
  Device& device_;
  AlignedBuffer buffer_;
  bool registered_ = false;
};

struct EngineContext {
  /// Throws ConfigError for a config the engine cannot run (after Config::validate).
  EngineContext(const Config& config, RankContext rank);
  /// Waits for the side stream and returns every deferred free (the parts that queue work on
  /// it are gone by then).
  ~EngineContext();

  const Config config;
  const RankContext handles;  // keeps the device and the communicator alive
  Device& device;
  Communicator& comm;
  const int rank, world;
  const StagePolicy policy;  // what zero_optimization.stage decides
  const DType dtype;         // the compute dtype
  std::unique_ptr<Stream> side;
  MemoryLedger ledger;
  DeferredFrees frees;  // zoe.debug_poison: NaN-filled frees
  ReadbackArea readback;
  // The scratch events of side_waits_for_compute / compute_waits_for_side (Device's
  // stream_waits_for / compute_waits_for; CUDA records one and waits on it at once, and a wait
  // takes the event's state when it is queued, so one of each serves every call).
  std::unique_ptr<Event> compute_mark, side_mark;

  /// An accounted device allocation of `numel` elements. Throws OutOfMemoryError.
  DeviceBuffer alloc(MemKind kind, DType dt, std::int64_t numel);
  /// Makes work queued on `side` before `event` visible to the trainer's compute.
  void ready_for_compute(Event& event);
  /// Makes the trainer's work so far visible to `side`.
  void side_waits_for_compute();
  /// Makes the side stream's work so far visible to the trainer's compute.
  void compute_waits_for_side();
  /// zero_optimization.sub_group_size, aligned down to the flat layout's alignment (>= 16).
  std::int64_t sub_group_numel() const;
  /// The dtype of a group's reduced gradient shard: fp32 for stages 2-3 accumulating
  /// micro-batches (the shard sums them in fp32, as the offloaded gradients do), else the
  /// compute dtype.
  DType grad_dtype() const;
  /// What each gradient is divided by before its reduction: the world size with
  /// prescale_gradients, else gradient_predivide_factor (DeepSpeed's engine and ZeRO
  /// average_tensor); the step divides the sum by world / this.
  double pre_divisor() const;
  int gradient_accumulation_steps() const { return config.gradient_accumulation_steps; }
};

}  // namespace zoe::core
