// OffloadTiers: where state lives off the device (ZeRO-Offload / ZeRO-Infinity): the CPU
// optimizer, the rank's pinned-memory budget, the optimizer states' tier (offload_optimizer:
// host memory or NVMe) and, stage 3, the parameter shards' tier (offload_param). Built from the
// config with the engine; each tier is null when its offload is off. Declared in the order
// they use each other (the optimizer first), so they are destroyed in the reverse.
// Not thread-safe to build; the tiers' own calls say theirs.
#pragma once

#include <memory>

#include "src/core/engine_context.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/offload/param_shards.hpp"
#include "src/offload/pinned_budget.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::core {

struct OffloadTiers {
  /// Builds the tiers the config asks for (their files and buffers open at finalize()).
  /// Throws ConfigError / Error from the tiers (an NVMe path that cannot be used, say).
  explicit OffloadTiers(EngineContext& cx);

  /// CpuAdam over zoe.optimizer_threads (its own oneTBB arena).
  std::unique_ptr<optim::CpuAdam> adam;
  /// zoe.pinned_budget_bytes: every pinned consumer reserves its bytes here.
  std::shared_ptr<offload::PinnedBudget> pinned_budget;
  std::unique_ptr<offload::OptimizerStates> states;  // null: optimizer states on the device
  std::unique_ptr<offload::ParamShards> params;      // null: parameter shards on the device

  /// Opens the tiers (after every tensor was added) and books their bytes in the ledger.
  void finalize(MemoryLedger& ledger);
  /// Pinned staging bytes of both tiers.
  std::int64_t staging_bytes() const;

 private:
  std::int64_t host_memory_budget_ = 0;  // zoe.host_memory_budget: parameter shards first, then gradients
  bool params_on_nvme_ = false;          // the budget's shards are those of an NVMe parameter tier
};

}  // namespace zoe::core
