#include "src/core/offload_tiers.hpp"

namespace zoe::core {

OffloadTiers::OffloadTiers(EngineContext& cx) {
  const Config& c = cx.config;
  adam = std::make_unique<optim::CpuAdam>(c.zoe.optimizer_threads);
  pinned_budget = std::make_shared<offload::PinnedBudget>(static_cast<std::size_t>(c.zoe.pinned_budget_bytes));
  // The tiers' pinned buffers are registered with the device: their copies are the pinned kind.
  Device* dev = &cx.device;
  auto register_fn = [dev](void* p, std::size_t bytes) { return dev->register_host_memory(p, bytes); };
  auto unregister_fn = [dev](void* p) { dev->unregister_host_memory(p); };
  const auto& oo = c.zero_optimization.offload_optimizer;
  if (oo.device != OffloadDevice::none) {
    offload::OptimizerStatesOptions so;
    so.device = oo.device;
    so.nvme_path = oo.nvme_path;
    so.rank = cx.rank;
    so.buffer_count = oo.buffer_count;
    so.pin_memory = oo.pin_memory;
    so.pinned_budget = pinned_budget;
    so.aio = c.aio;
    so.require_direct_io = c.zoe.require_direct_io;
    so.register_fn = register_fn;
    so.unregister_fn = unregister_fn;
    // The tier's gradient add (on the gradient sink's I/O worker) runs in the optimizer's own
    // arena: together with the update pipeline's step at most zoe.optimizer_threads threads.
    so.adam = adam.get();
    states = std::make_unique<offload::OptimizerStates>(so);
  }
  const auto& op = c.zero_optimization.offload_param;
  if (op.device != OffloadDevice::none && cx.policy.shards_params) {
    offload::ParamShardsOptions po;
    po.device = op.device;
    po.nvme_path = op.nvme_path;
    po.rank = cx.rank;
    po.buffer_count = op.buffer_count;
    po.buffer_bytes = static_cast<std::size_t>(op.buffer_size) * dtype_size(cx.dtype);
    po.pin_memory = op.pin_memory;
    po.pinned_budget = pinned_budget;
    po.aio = c.aio;
    po.require_direct_io = c.zoe.require_direct_io;
    po.register_fn = register_fn;
    po.unregister_fn = unregister_fn;
    params = std::make_unique<offload::ParamShards>(po);
  }
}

void OffloadTiers::finalize(MemoryLedger& ledger) {
  if (states) {
    states->finalize();
    ledger.add(Tier::host, MemKind::model_state, states->host_state_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, states->nvme_state_bytes());
    ledger.add(Tier::host, MemKind::buffer, states->staging_bytes());
  }
  if (params) {
    params->finalize();
    ledger.add(Tier::host, MemKind::model_state, params->host_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, params->nvme_bytes());
    ledger.add(Tier::host, MemKind::buffer, params->staging_bytes());
  }
}

std::int64_t OffloadTiers::staging_bytes() const {
  return (states ? states->staging_bytes() : 0) + (params ? params->staging_bytes() : 0);
}

}  // namespace zoe::core
