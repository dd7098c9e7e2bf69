// Engine::Impl's construction and build: the parts are made with the Engine; at the first call
// that needs the parameters, finalize() partitions them into groups, places every state by
// size (device sub-groups, the offload tiers, device buffers), opens the tiers and writes the
// initial values (initialize.cpp).
#include "src/common/log.hpp"
#include "src/config/group_sharing.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe {

core::EngineImpl::EngineImpl(const Config& config, RankContext rank) : cx(config, std::move(rank)) {
  // A gather short of parameter read buffers may reduce the gradients waiting in the bucket,
  // whose groups' updates then release the reads kept for them (KeptShardReads::free_one).
  updater.kept_reads().set_reduce_waiting([this] {
    if (!reducer.bucket_holds_any()) return false;
    reducer.flush_bucket();
    return true;
  });
  ZOE_LOG_DEBUG("rank {}/{}: engine on {}, stage {}, compute {}", cx.rank, cx.world, cx.device.name(),
                config.zero_optimization.stage, dtype_name(cx.dtype));
}

core::EngineImpl::~EngineImpl() {
  updater.stop();  // the side stream may wait for the update's latches
  try {
    cx.device.synchronize(*cx.side);
  } catch (...) {
  }
  cx.frees.reap(true);  // before the tiers whose read buffers a free may hold
}

void core::EngineImpl::finalize() {
  if (lifecycle.built()) return;
  lifecycle.check_usable("the engine's initialisation");
  model.check_complete();  // throws before anything changes: the engine stays usable
  try {
    const auto& zc = cx.config.zero_optimization;
    const StagePolicy& policy = cx.policy;
    // Which small modules share a group: one rule with the estimate's (group_sharing.hpp).
    model.build_groups(policy, cx.rank, cx.world, zc.stage3_param_persistence_threshold,
                       small_module_share_below(cx.config));
    model.build_views(cx.dtype);
    // Every state's home, sizes only: the offload tiers must know all their tensors before
    // they open (finalize), and the values are written after, chunk by chunk.
    updater.place_sub_groups();
    Stream& s = *cx.side;
    for (core::Group& g : model.groups) {
      const core::FlatLayout& L = *g.layout;
      // Compute-dtype parameters: stage 3 keeps the shard (on the device or in the parameter
      // tier), stages 0-2 the full flat buffer.
      if (!policy.shards_params) g.param_state = core::Group::ParamState::gathered;  // the persistent full copy
      if (tiers.params) {
        g.param_id = tiers.params->add(static_cast<std::size_t>(L.shard_numel()) * dtype_size(cx.dtype));
      } else {
        (policy.shards_params ? g.param_shard : g.param_full) = cx.alloc(
            core::MemKind::model_state, cx.dtype, policy.shards_params ? L.shard_numel() : L.padded_numel());
      }
      if (g.frozen) {
        // no gradient buffer, no optimizer state
      } else if (!policy.shards_grads) {
        g.grad_full = cx.alloc(core::MemKind::model_state, cx.dtype, L.padded_numel());
        cx.device.fill(g.grad_full.data(), cx.dtype, L.padded_numel(), 0.0f, s);
      } else if (updater.has_device_sub_groups(g)) {
        g.grad_shard = cx.alloc(core::MemKind::model_state, cx.grad_dtype(), L.shard_numel());
        cx.device.fill(g.grad_shard.data(), cx.grad_dtype(), L.shard_numel(), 0.0f, s);
      }
      g.param_ready = cx.device.create_event();
      g.update_done = cx.device.create_event();
    }
    tiers.finalize(cx.ledger);
    updater.build_paths();
    write_initial_values();
    for (core::ParamInfo& p : model.params) p.init = nullptr;  // releases what the initializers hold
    coll.begin_step();
    lifecycle.mark_built();
  } catch (const std::exception& e) {
    lifecycle.mark_broken(detail::concat("its initialisation failed earlier (", e.what(), ")"));
    throw;
  } catch (...) {
    lifecycle.mark_broken("its initialisation failed earlier (an exception that is not a std::exception)");
    throw;
  }
  std::int64_t live = 0;
  for (const core::Group& g : model.groups) live += g.layout->live_numel();
  ZOE_LOG_DEBUG("rank {}: {} parameters ({} elements) in {} groups, stage {}, {} on {}", cx.rank, model.params.size(),
                live, model.groups.size(), cx.config.zero_optimization.stage, dtype_name(cx.dtype), cx.device.name());
}

}  // namespace zoe
