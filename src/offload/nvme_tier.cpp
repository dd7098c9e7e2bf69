#include "src/offload/nvme_tier.hpp"

#include <algorithm>

namespace zoe::offload {

NvmeTier open_nvme_tier(const NvmeTierOptions& o) {
  NvmeTier t;
  PinnedPoolOptions po;
  po.buffer_count = o.buffer_count;
  po.buffer_bytes = o.buffer_bytes;
  po.budget = o.pinned_budget;
  po.holder = o.holder;
  po.lock = o.pin_memory;
  po.register_fn = o.register_fn;
  po.unregister_fn = o.unregister_fn;
  t.pool = std::make_unique<PinnedPool>(po);
  po.buffer_count = 1;
  po.buffer_bytes = o.extra_buffer_bytes;
  t.extra = std::make_unique<PinnedPool>(po);

  NvmeStoreOptions so = NvmeStoreOptions::from_aio(o.aio, o.require_direct_io, o.nvme_path, o.rank);
  so.fixed_buffers = t.pool->buffers();
  for (auto b : t.extra->buffers()) so.fixed_buffers.push_back(b);
  t.store = std::make_unique<NvmeStore>(so);
  return t;
}

}  // namespace zoe::offload
