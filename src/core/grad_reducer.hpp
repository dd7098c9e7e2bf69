// GradReducer: the gradient buffers handed to the trainer and their reduction.
//  stage 0: grad_full persistent; all-reduced after the last micro-batch's backward.
//  stage 1: grad_full persistent; reduce-scattered into grad_shard after the last one.
//  stages 2-3: grad_full lives for one micro-batch; reduce-scattered once every module using
//    the group finished its backward, or the round ended without some (complete_round; on
//    the side stream, overlapping the rest of backward)
//    and accumulated into the persistent grad_shard. A persistent group (stage 3, below the
//    persistence threshold: its parameters stay gathered) keeps its grad_full too, zeroed
//    again at the next prepare: with thousands of small modules an allocation and a free per
//    group and micro-batch cost more than the reduction itself, and the buffers are as small
//    as the parameters kept whole beside them.
// Reductions go through DeepSpeed's IPG bucket (GradBucket): consecutive groups, in the order
// their backward completed, reduced by one collective of at most reduce_bucket_size elements
// (a larger group alone, straight from its buffer). A bucket of several groups is flattened
// into one buffer first (rank-major for reduce-scatter, so each rank's part is its shards of
// every group) and the result taken back per group; the sums are elementwise in rank order,
// so bucketing never changes a bit. overlap_comm false makes the trainer's compute wait for
// each bucket's reduction (DeepSpeed then reduces on the compute stream). With optimizer
// offload the reduced shard also goes, as soon as it is ready, into the fp32 gradients of the
// offloaded sub-groups (Updater::accept_gradient), accumulating over micro-batches; with
// zoe.update_in_backward a group whose last micro-batch was reduced starts its update.
// Not thread-safe: the thread that drives the Engine calls it.
#pragma once

#include <vector>

#include "src/core/collectives.hpp"
#include "src/core/engine_context.hpp"
#include "src/core/model.hpp"
#include "src/core/update/updater.hpp"

namespace zoe::core {

class GradReducer {
 public:
  GradReducer(EngineContext& cx, Model& model, Collectives& coll, Updater& updater)
      : cx_(cx), model_(model), coll_(coll), updater_(updater) {}

  /// At begin_backward(m) of m's backward number `round` this step (1-based): ends the round
  /// of a group of several modules that m already finished this round in (complete_round),
  /// reduces a bucket holding one of m's groups, then (stages 2-3) allocates and zeroes the
  /// gradient buffers m's groups lack.
  void prepare(const ModuleInfo& m, int round);
  /// At end_backward(m): each of m's groups whose every user finished this round completes
  /// it; the bucket is reduced once the round is complete.
  void finish_backward(const ModuleInfo& m);
  /// At step(), before the micro-batch count is checked: a group some but not all of whose
  /// modules ran the last round's backward completes that round with their gradients (a
  /// module that runs no backward adds nothing, as for a group of its own).
  void complete_partial_rounds();
  /// Reduces the bucket's groups with one collective (nothing when empty).
  void flush_bucket();
  /// Whether gradients wait in the bucket.
  bool bucket_holds_any() const { return !bucket_.groups.empty(); }
  /// At step(): the gradients of groups no module ran backward for this step are zero.
  void zero_unused_gradients();
  /// At the end of step(): the persistent buffers of a skipped step are zeroed (stages 0-1),
  /// stage 1's reduced shards dropped, the round counts reset.
  void reset_for_next_step(bool skipped);

 private:
  /// Group `gi`'s round is over: counted (micro_batches), its gradient queued for reduction
  /// (stages 0-1: only after the step's last micro-batch), its users pending again.
  void complete_round(int gi);
  /// Puts group `gi`'s complete gradient of this round into the bucket (reducing the bucket
  /// first when it would overflow, after when it is full).
  void queue_reduction(int gi);
  /// Whether every group has reduced the round of the bucket's last group.
  bool round_complete() const;
  /// One group's reduction straight from its gradient buffer (a bucket of one group).
  void reduce_group(Group& g);
  /// Several groups' reduction through one flattened buffer (see the file comment).
  void reduce_groups(const std::vector<int>& gis);
  /// Where a bucket's reduce-scatter puts group g's shard directly (stages 1-3): its gradient
  /// shard when the step reads that as it is (stage 1's shard of the step, allocated here;
  /// stages 2-3 with one micro-batch), else null (then absorb_shard takes it).
  void* shard_receiving_reduction(Group& g);
  /// What follows the reduce-scatter of group g into `reduced` when it could not land in its
  /// gradient shard (its shard, compute dtype, on the side stream; stages 2-3 with
  /// accumulation, or no device gradient shard): accumulated into grad_shard, handed to the
  /// offloaded sub-groups.
  void absorb_shard(Group& g, const void* reduced);
  /// zoe.update_in_backward: starts group gi's update if this was its step's last micro-batch.
  void start_update_if_final(int gi);
  /// Whether group g keeps grad_full between rounds (persistent groups, not zoe.debug_poison).
  bool keeps_gradient_buffer(const Group& g) const;

  EngineContext& cx_;
  Model& model_;
  Collectives& coll_;
  Updater& updater_;
  /// Counts group `g`'s round (its micro_batches) as reached, for round_complete().
  void reached_round(const Group& g);

  GradBucket bucket_;  // gradients waiting for their reduction
  int bucket_round_ = 0;           // the largest round of a group in the bucket
  std::vector<int> reached_;       // reached_[r]: taking part groups whose round is >= r
  int taking_part_ = -1;           // trainable groups some module uses (-1: not counted yet)
};

}  // namespace zoe::core
