// StagePolicy: what zero_optimization.stage decides, computed once, so the engine and the
// memory estimate (src/config/estimate.cpp) test named decisions, never the stage number
// (DeepSpeed's stages: 1 shards the optimizer states, 2 also the gradients, 3 also the
// parameters). In src/config, beside the Config it reads, so both can use it.
#pragma once

namespace zoe {

/// What the ZeRO stage decides, computed once from zero_optimization.stage (0-3, as
/// Config::validate checks; no error here): the engine and the estimate test these named
/// decisions, never the stage number. An immutable value; safe to share between threads.
struct StagePolicy {
  explicit StagePolicy(int stage)
      : shards_optimizer(stage >= 1), shards_grads(stage >= 2), shards_params(stage == 3),
        gathers_updates(stage == 1 || stage == 2), reduces_at_step(stage == 1) {}
  /// Stages 1-3: each rank's optimizer range is its shard (stage 0: the whole buffer; the norm
  /// then forms every rank's partial itself and the gradient is all-reduced).
  bool shards_optimizer;
  /// Stages 2-3: a group's gradient is reduce-scattered as soon as its backward ends, each
  /// micro-batch, into a persistent shard; grad_full lives one micro-batch. Otherwise grad_full
  /// is persistent and the trainer accumulates into it.
  bool shards_grads;
  /// Stage 3: the compute-dtype parameters are sharded and gathered per module.
  bool shards_params;
  /// Stages 1-2: the updated shard waits aside and is all-gathered into the full copy.
  bool gathers_updates;
  /// Stage 1: the gradient is reduce-scattered after the last micro-batch into a shard that
  /// lives until the step's update has read it.
  bool reduces_at_step;
};

}  // namespace zoe
