// The two-stage pipeline of write_values (initialize.cpp): the calling thread fills chunk k+1
// (the parameters' initializers, or a checkpoint's reads) while a writer thread stores chunk k
// in its homes (OptimizerStates::write_initial / write_all, the parameter tier's write buffer and
// commit, device copies). Without it the two alternate: construction took the sum of computing
// the initial values and storing them instead of the larger of the two.
//
// The chunks live in `slot_count` host buffers of `slot_floats` floats each (2: one filled while
// the other is stored), so host memory stays slot_count chunks however large the model. A slot
// goes free -> filling (acquire) -> queued (submit) -> free (once its store has run, seen at the
// next acquire of that slot). Stores, and the other work handed to run(), execute on the writer
// one at a time in the order queued, so whatever they drive (the tiers) is driven by one thread.
//
// Errors: the first exception of a store is kept; the stores queued after it are skipped (they
// would write into a half-stored state), and acquire() and finish() rethrow it. A failure on the
// calling side calls abandon(), which waits for the writer and drops its error, so nothing the
// pipeline ran outlives the call and nothing hangs. Destruction waits for the writer as well.
// Thread-safety: one calling thread; the stores run on the writer thread (HostQueue's mutex
// orders a slot's filling before its store and its store before the slot's next filling).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "src/device/host_stream.hpp"

namespace zoe::core {

class ChunkPipeline {
 public:
  /// slot_count >= 1 buffers of slot_floats floats (1: no overlap). Throws UsageError if
  /// slot_count < 1; std::bad_alloc if the buffers do not fit.
  ChunkPipeline(std::size_t slot_floats, int slot_count = 2);
  /// Waits for the writer (abandon()).
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  /// The next slot's buffer (slot_floats floats, host memory), to fill for the next submit();
  /// waits until the store that last read it has run. Rethrows the first store error.
  /// Throws UsageError if a slot is already being filled.
  std::span<float> acquire();
  /// Queues `store` for the writer; it reads the slot from the last acquire(), which it owns
  /// until it returns. Throws UsageError without an acquired slot.
  void submit(std::function<void()> store);
  /// Queues work that reads no slot (a shard's lease or commit, the final flush), in order
  /// with the stores.
  void run(std::function<void()> work);
  /// Waits for everything queued; rethrows the first error of a store or work.
  void finish();
  /// Waits for everything queued (skipped after an error) and drops its error. noexcept: for
  /// the calling side's own failure.
  void abandon() noexcept;

  /// Stores and work that ran to completion (tests).
  std::uint64_t completed() const { return completed_.load(); }

 private:
  enum class SlotState { free, filling, queued };
  struct Slot {
    std::vector<float> data;
    SlotState state = SlotState::free;
    std::uint64_t ticket = 0;  // queued: the writer's ticket of its store
  };
  std::uint64_t enqueue(std::function<void()> work);

  std::vector<Slot> slots_;
  std::size_t next_ = 0;                      // the slot acquire() takes next
  std::size_t filling_ = SIZE_MAX;            // the slot being filled, if any
  std::atomic<bool> failed_{false};           // a store or work threw: skip the rest
  std::atomic<std::uint64_t> completed_{0};
  HostQueue writer_{"zoe-init-writer"};       // last: destroyed (drained) first
};

}  // namespace zoe::core
