// Where the offloaded sub-groups' reduced gradients go: device -> pinned buffer on a copy
// stream of their own (never the collective stream, so neither the copy nor disk latency
// stalls the all-gathers and reduce-scatters), then into the offload tier
// (OptimizerStates::add_grad: host memory, or an NVMe read-modify-write) on an I/O worker
// thread. `staging_count` pinned buffers of one sub-group each (double-buffered by default):
// the copy of sub-group k+1 overlaps the tier write of k; when both are in use, add() waits for
// the oldest to be written (back-pressure on the engine's thread, bounded pinned memory).
//
// Ordering: add() queues the copy after `ready` (an event recorded by the caller after the
// reduction), and the tier write after `after` (the sub-group's previous update: its gradient
// may still be read by it, as under the delayed update). The returned event completes when
// the device memory has been read, so the caller may free or overwrite it after that.
//
// Threads: the tier write runs on the I/O worker; its arithmetic (CpuAdam::add_grad, through
// OptimizerStates) runs in the engine's CpuAdam arena, the one the update pipeline's step runs in,
// so a gradient add beside an update shares zoe.optimizer_threads threads with it instead of
// adding its own.
//
// Units: elements unless named bytes. Thread-safety: add / zero / drain on one thread (the
// engine's). Errors: add throws UsageError for a sub-group larger than a staging buffer; the
// tier's errors (IoError, CorruptionError) surface in drain(), which rethrows the first.
#pragma once

#include <cstdint>
#include <memory>

#include "src/core/update/update_pipeline.hpp"
#include "src/device/device.hpp"
#include "src/device/host_stream.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/offload/pinned_pool.hpp"

namespace zoe::core {

struct GradientSinkOptions {
  DType dtype = DType::bf16;           // of the reduced shards (compute dtype)
  std::int64_t largest_numel = 0;      // largest offloaded sub-group, elements
  int staging_count = 2;
  bool pin_memory = true;
  std::shared_ptr<offload::PinnedBudget> pinned_budget;  // the rank's zoe.pinned_budget_bytes (null: unbudgeted)
};

class GradientSink {
 public:
  GradientSink(Device& device, offload::OptimizerStates& states, const GradientSinkOptions& options);
  /// Waits for the queued work (errors dropped).
  ~GradientSink();
  GradientSink(const GradientSink&) = delete;
  GradientSink& operator=(const GradientSink&) = delete;

  /// Adds `numel` elements of the reduced shard at device address `src` to sub-group `id`'s fp32
  /// gradient (first: sets it; last: records its norm; see OptimizerStates::add_grad). Returns
  /// the event after which `src` is no longer read.
  std::shared_ptr<Event> add(int id, const void* src, std::int64_t numel, bool first, bool last, Event& ready,
                             std::shared_ptr<GroupDone> after);
  /// Sets sub-group `id`'s gradient to zero (no backward reached it), after `after`.
  void zero(int id, std::shared_ptr<GroupDone> after);
  /// Sets `latch` once every tier write queued so far is done (set_failed() if one of them, or
  /// an earlier one, threw). Never blocks.
  void signal(std::shared_ptr<GroupDone> latch);
  /// Blocks until every queued tier write is done; rethrows the first error.
  void drain();
  /// Bytes of the pinned staging pool.
  std::size_t staging_bytes() const { return pool_ ? pool_->total_bytes() : 0; }

 private:
  Device& device_;
  offload::OptimizerStates& states_;
  GradientSinkOptions options_;
  std::unique_ptr<offload::PinnedPool> pool_;
  std::unique_ptr<Stream> copy_;
  HostQueue io_{"zoe-grad-io"};  // destroyed first: it drains, returning buffers to pool_
};

}  // namespace zoe::core
