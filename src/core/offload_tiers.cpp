#include "src/core/offload_tiers.hpp"

#include "src/common/host_memory.hpp"
#include "src/common/log.hpp"

namespace zoe::core {

OffloadTiers::OffloadTiers(EngineContext& cx) {
  const Config& c = cx.config;
  adam = std::make_unique<optim::CpuAdam>(c.zoe.optimizer_threads);
  pinned_budget = std::make_shared<offload::PinnedBudget>(static_cast<std::size_t>(c.zoe.pinned_budget_bytes));
  host_memory_budget_ = c.zoe.host_memory_budget;
  if (host_memory_budget_ == ZoeConfig::kHostMemoryBudgetAuto) {
    // "auto": what the machine can spare now, once (a budget that moved with other processes'
    // memory would move the placement between runs of one config).
    const HostMemoryReading machine = read_host_memory();
    host_memory_budget_ = spare_host_memory_per_rank(machine, cx.handles.local_world_size);
    ZOE_LOG_INFO("rank {}: zoe.host_memory_budget \"auto\": {}", cx.rank,
                 describe_spare_host_memory(machine, cx.handles.local_world_size));
  }
  // What both tiers take alike: the config's offload block, the rank, the pinned budget, the
  // aio settings, and registration of their pinned buffers with the device (their copies are
  // then the pinned kind).
  Device* dev = &cx.device;
  auto common = [&](auto& o, const auto& offload) {
    o.device = offload.device;
    o.nvme_path = offload.nvme_path;
    o.rank = cx.rank;
    o.buffer_count = offload.buffer_count;
    o.pin_memory = offload.pin_memory;
    o.pinned_budget = pinned_budget;
    o.aio = c.aio;
    o.require_direct_io = c.zoe.require_direct_io;
    o.register_fn = [dev](void* p, std::size_t bytes) { return dev->register_host_memory(p, bytes); };
    o.unregister_fn = [dev](void* p) { dev->unregister_host_memory(p); };
  };
  const auto& oo = c.zero_optimization.offload_optimizer;
  if (oo.device != OffloadDevice::none) {
    offload::OptimizerStatesOptions so;
    common(so, oo);
    // The tier's gradient add (on the gradient sink's I/O worker) runs in the optimizer's own
    // arena: together with the update pipeline's step at most zoe.optimizer_threads threads.
    so.adam = adam.get();
    // so.host_budget: finalize() gives the gradients and states what the parameter shards leave of
    // zoe.host_memory_budget.
    so.state_dtype = c.zoe.optimizer_state_dtype;
    // The masters' high halves are the bf16 shards of the parameter tier (config validation
    // refuses the key without one).
    so.split_master = c.zoe.split_master_weights;
    // One micro-batch of 16-bit compute per step: the reduced shard is the whole gradient, kept
    // as it arrives (exact; half the bytes of the fp32 copy in host memory or over NVMe).
    so.grad_dtype = c.gradient_accumulation_steps == 1 ? cx.grad_dtype() : DType::f32;
    states = std::make_unique<offload::OptimizerStates>(so);
  }
  const auto& op = c.zero_optimization.offload_param;
  if (op.device != OffloadDevice::none && cx.policy.shards_params) {
    offload::ParamShardsOptions po;
    common(po, op);
    po.buffer_bytes = static_cast<std::size_t>(op.buffer_size) * dtype_size(cx.dtype);
    // Host memory first: a shard kept in host memory saves its bytes read twice a step and
    // written once, more NVMe traffic per byte of RAM than a gradient or the states save.
    po.host_budget = host_memory_budget_;
    params_on_nvme_ = op.device == OffloadDevice::nvme;
    params = std::make_unique<offload::ParamShards>(po);
  }
}

void OffloadTiers::finalize(MemoryLedger& ledger) {
  // The parameter shards take zoe.host_memory_budget first (the most NVMe bytes saved per byte
  // of host memory: read twice a step, written once); the gradients, then the optimizer states, get what is left.
  std::int64_t budget_left = host_memory_budget_;
  if (params) {
    params->finalize();
    if (params_on_nvme_) budget_left -= params->host_bytes();
    ledger.add(Tier::host, MemKind::model_state, params->host_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, params->nvme_bytes());
    ledger.add(Tier::host, MemKind::buffer, params->staging_bytes());
  }
  if (states) {
    states->set_host_budget(std::max<std::int64_t>(budget_left, 0));
    states->finalize();
    ledger.add(Tier::host, MemKind::model_state, states->host_state_bytes());
    ledger.add(Tier::nvme, MemKind::model_state, states->nvme_state_bytes());
    ledger.add(Tier::host, MemKind::buffer, states->staging_bytes());
  }
}

std::int64_t OffloadTiers::staging_bytes() const {
  return (states ? states->staging_bytes() : 0) + (params ? params->staging_bytes() : 0);
}

}  // namespace zoe::core
