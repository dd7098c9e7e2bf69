// The common set-up of an NVMe offload tier (optimizer states, parameter shards): a pool of
// `buffer_count` pinned staging buffers, one extra pinned buffer for a second stream of I/O
// (gradient writes, parameter write-back), both within the pinned budget, and an NvmeStore
// with every one of those buffers registered as an io_uring fixed buffer.
// Units: bytes. Thread-safety: a plain function. Errors: as PinnedPool and NvmeStore.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "src/offload/nvme_store.hpp"
#include "src/offload/pinned_pool.hpp"
#include "zoe/config.hpp"

namespace zoe::offload {

struct NvmeTierOptions {
  std::size_t buffer_count = 4;        // staging buffers (>= 1)
  std::size_t buffer_bytes = 4096;     // per staging buffer
  std::size_t extra_buffer_bytes = 4096;
  std::shared_ptr<PinnedBudget> pinned_budget;  // both pools are reserved in it (null: unbudgeted)
  std::string holder = "NVMe staging";  // the pools' name in the budget's messages
  bool pin_memory = true;
  std::string nvme_path;
  int rank = 0;
  AioConfig aio;
  bool require_direct_io = false;
  /// Registers host memory with the device so copies from / to it are the pinned kind
  /// (e.g. Device::register_host_memory, cudaHostRegister); null: not registered.
  std::function<bool(void*, std::size_t)> register_fn;
  std::function<void(void*)> unregister_fn;
};

/// The fields every store's options share (budget, pinning, path, rank, aio, O_DIRECT), taken
/// from a store's options `o` (OptimizerStatesOptions, ParamShardsOptions); the buffer sizes
/// and counts are left for the caller.
template <class StoreOptions>
NvmeTierOptions nvme_tier_options(const StoreOptions& o) {
  NvmeTierOptions to;
  to.pinned_budget = o.pinned_budget;
  to.pin_memory = o.pin_memory;
  to.nvme_path = o.nvme_path;
  to.rank = o.rank;
  to.aio = o.aio;
  to.require_direct_io = o.require_direct_io;
  to.register_fn = o.register_fn;
  to.unregister_fn = o.unregister_fn;
  return to;
}

struct NvmeTier {
  std::unique_ptr<PinnedPool> pool, extra;
  std::unique_ptr<NvmeStore> store;
};

NvmeTier open_nvme_tier(const NvmeTierOptions& options);

}  // namespace zoe::offload
