// Split master weights with the update in backward (zoe.split_master_weights and
// zoe.update_in_backward, parameter shards on NVMe): a group's update needs its shard's stored
// bf16 values (the masters' high halves), which its gathers this step have just read from NVMe.
// KeptShardReads keeps the group's latest read (its pinned read buffer of the parameter tier)
// until the update takes it, so the update does not read the shard a second time: 2 bytes per
// parameter per step less (ParamShards::write_buffer_from copies it into the write buffer).
//
// A read moves through three states, each changed by one call:
//   kept      keep(): the engine holds it for the group's update (a later read of the group
//             replaces it);
//   handed    hand_over(): the group's update took it (a PipelineGroup's `before` copies it on
//             the pipeline worker, then destroys the Handoff);
//   released  the Handoff is gone, or free_one() dropped it while kept (that group's update
//             then reads the shard from NVMe, as without this class).
// Kept and handed reads occupy the tier's read buffers, which the gathers need. When none is
// free, free_one() gets some back in this order: wait until every handed read is copied (the
// copies need nothing from the engine's thread); else reduce the gradients waiting in the bucket
// (`reduce_waiting`, GradReducer::flush_bucket: their groups' updates start and take their
// reads) and wait likewise; else drop the oldest kept read. Every choice depends on the engine thread's own state alone (a
// wait ends only once every handed read is released), so every rank makes the same ones at the
// same calls and the NVMe bytes of a step do not depend on thread timing.
//
// Thread-safety: the engine's thread calls everything; a Handoff may be destroyed on any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "src/offload/param_shards.hpp"

namespace zoe::core {

class KeptShardReads {
 public:
  /// A handed read: `read` stays valid until this is destroyed.
  struct Handoff {
    std::shared_ptr<offload::ShardRead> read;
    ~Handoff();

   private:
    friend class KeptShardReads;
    struct Counter;
    std::shared_ptr<Counter> counter;
  };

  KeptShardReads();
  ~KeptShardReads();
  KeptShardReads(const KeptShardReads&) = delete;
  KeptShardReads& operator=(const KeptShardReads&) = delete;

  /// Whether reads are kept (set once the engine knows the config; default false: keep()
  /// then ignores what it is given).
  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  /// Reduces the gradients waiting in the reduce bucket; returns whether any were waiting.
  /// Set by the engine (GradReducer::flush_bucket); free_one() calls it.
  void set_reduce_waiting(std::function<bool()> reduce) { reduce_waiting_ = std::move(reduce); }

  /// kept: `read` (an NVMe read of group `group`'s shard, with its buffer) is kept for the
  /// group's update, replacing an earlier kept read of the group.
  void keep(int group, std::shared_ptr<offload::ShardRead> read);
  /// handed: group `group`'s kept read for its update, or null if none is kept.
  std::shared_ptr<Handoff> hand_over(int group);
  /// Frees or waits for one read buffer held here (see the file comment); false if none is
  /// held here. Errors: rethrows what `reduce_waiting` throws.
  bool free_one();
  /// Drops every kept read (the step's updates are done, or it failed). Handed ones are the
  /// pipeline's and go with it.
  void clear() { kept_.clear(); }
  /// The updates since the last call that took a kept read (`taken`) and that found none
  /// (`missed`: given up by free_one, so that update reads its shard from NVMe again); resets
  /// both. Counted only while enabled.
  struct Counts {
    std::int64_t taken = 0, missed = 0;
  };
  Counts take_counts() { return std::exchange(counts_, Counts{}); }
  /// Kept reads (for tests).
  std::size_t kept_count() const { return kept_.size(); }

 private:
  bool enabled_ = false;
  std::function<bool()> reduce_waiting_;
  std::deque<std::pair<int, std::shared_ptr<offload::ShardRead>>> kept_;  // oldest first
  std::shared_ptr<Handoff::Counter> handed_;
  Counts counts_;
};

}  // namespace zoe::core
