#include <limits>
#include "src/offload/param_shards.hpp"

#include <algorithm>
#include <cstring>

#include "src/common/byte_size.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/host_access.hpp"
#include "src/offload/nvme_tier.hpp"

namespace zoe::offload {
namespace {
constexpr const char* kCpuHolder = "parameter cpu tier (registered shards)";
}  // namespace

void ShardRead::wait() {
  if (!buffer) return;  // cpu tier: the shard is its home
  if (!io) owner->issue(*this);
  io->wait();
}

ParamShards::ParamShards(const ParamShardsOptions& options) : options_(options) {
  ZOE_CHECK_USAGE(options.device != OffloadDevice::none, "ParamShards needs offload device cpu or nvme");
  if (options.device == OffloadDevice::nvme && options.buffer_count < 2)
    ZOE_THROW_CONFIG("zero_optimization.offload_param.buffer_count",
                     "must be >= 2 for NVMe parameter offload (reads and the optimizer's write-back), got ",
                     options.buffer_count);
}

ParamShards::~ParamShards() {
  if (options_.unregister_fn)
    for (std::size_t i = 0; i < registered_.size(); ++i)
      if (registered_[i]) options_.unregister_fn(host_[i].data());
  if (options_.pinned_budget) options_.pinned_budget->release(registered_bytes_, kCpuHolder);
  writing_.reset();
  store_.reset();  // waits for outstanding swaps before the buffers go away
}

int ParamShards::add(std::size_t bytes) {
  ZOE_CHECK_USAGE(!finalized_, "ParamShards::add after finalize");
  if (options_.device == OffloadDevice::nvme && bytes > options_.buffer_bytes)
    ZOE_THROW_CONFIG("zero_optimization.offload_param.buffer_size",
                     "a parameter shard of ", bytes, " bytes does not fit a staging buffer of ", options_.buffer_bytes,
                     " bytes; raise buffer_size (elements) to at least the largest module's shard");
  const int id = static_cast<int>(bytes_.size());
  bytes_.push_back(bytes);
  host_.push_back(options_.device == OffloadDevice::cpu ? AlignedBuffer(std::max<std::size_t>(bytes, 1))
                                                        : AlignedBuffer());
  return id;
}

void ParamShards::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (options_.device == OffloadDevice::cpu) {
    registered_.assign(host_.size(), 0);
    if (options_.register_fn && options_.pinned_budget) {
      // Registering pins the shards' homes (cudaHostRegister): they are in the pinned budget.
      std::size_t total = 0;
      for (std::size_t b : bytes_) total += std::max<std::size_t>(b, 1);
      options_.pinned_budget->reserve(total, kCpuHolder);
      registered_bytes_ = total;
    }
    if (options_.register_fn)
      for (std::size_t i = 0; i < host_.size(); ++i)
        registered_[i] = options_.register_fn(host_[i].data(), std::max<std::size_t>(bytes_[i], 1)) ? 1 : 0;
  }
  if (options_.device != OffloadDevice::nvme) return;
  NvmeTierOptions to = nvme_tier_options(options_);
  to.buffer_count = static_cast<std::size_t>(options_.buffer_count - 1);  // reads
  to.buffer_bytes = std::max<std::size_t>(options_.buffer_bytes, 1);
  to.extra_buffer_bytes = to.buffer_bytes;  // the optimizer's write-back
  to.holder = "parameter NVMe staging";
  NvmeTier tier = open_nvme_tier(to);
  read_pool_ = std::move(tier.pool);
  write_pool_ = std::move(tier.extra);
  store_ = std::move(tier.store);
  // host_budget: the first shards, while they fit, stay in host memory (in order: a later,
  // smaller shard does not overtake one that did not fit).
  std::int64_t room = options_.host_budget;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < bytes_.size(); ++i) {
    const auto b = static_cast<std::int64_t>(std::max<std::size_t>(bytes_[i], 1));
    if (room >= b) {
      room -= b;
      host_[i] = AlignedBuffer(static_cast<std::size_t>(b));
      ++kept;
    } else {
      room = 0;
      store_->register_tensor(name(static_cast<int>(i)), static_cast<std::size_t>(b));
    }
  }
  ZOE_LOG_INFO("rank {}: {} parameter shards on NVMe in {} ({}; {} x {} pinned buffers), {} in host memory "
               "({}, zoe.host_memory_budget)",
               options_.rank, bytes_.size() - kept, store_->path(), detail::byte_size(nvme_bytes()), options_.buffer_count,
               detail::byte_size(static_cast<std::int64_t>(read_pool_->buffer_bytes())), kept, detail::byte_size(host_bytes()));
}

std::optional<std::shared_ptr<ShardRead>> ParamShards::try_begin_read(int id, bool issue_now) {
  ZOE_CHECK_USAGE(finalized_, "ParamShards::try_begin_read before finalize");
  auto r = std::make_shared<ShardRead>();
  r->owner = this;
  r->id = id;
  if (in_host(id)) {
    r->home = host_[id].data();
    return r;
  }
  std::optional<PinnedBuffer> b = read_pool_->try_acquire();
  if (!b) return std::nullopt;
  r->buffer = std::move(*b);
  if (issue_now) issue(*r);
  return r;
}

int ParamShards::read_slots() const {
  return options_.device == OffloadDevice::cpu ? std::numeric_limits<int>::max() : options_.buffer_count - 1;
}

void ParamShards::issue(ShardRead& read) {
  read.io = store_->swap_in(name(read.id), read.buffer.data(), std::max<std::size_t>(bytes_[read.id], 1));
}

void* ParamShards::write_buffer(int id, bool with_stored_bytes) {
  ZOE_CHECK_USAGE(finalized_, "ParamShards::write_buffer before finalize");
  if (in_host(id)) return host_[id].data();
  ZOE_CHECK_USAGE(!writing_, "ParamShards: one write-back at a time");
  writing_ = write_pool_->acquire();
  if (with_stored_bytes) {
    try {
      store_->swap_in(name(id), writing_->data(), std::max<std::size_t>(bytes_[id], 1)).wait();
    } catch (...) {
      writing_.reset();
      throw;
    }
  }
  return writing_->data();
}

void* ParamShards::write_buffer_from(int id, ShardRead& stored) {
  ZOE_CHECK_USAGE(finalized_, "ParamShards::write_buffer_from before finalize");
  ZOE_CHECK_USAGE(stored.owner == this && stored.id == id && stored.buffer, "ParamShards::write_buffer_from(", id,
                  "): the read given is of shard ", stored.id, stored.buffer ? "" : " (not an NVMe read)");
  ZOE_CHECK_USAGE(!writing_, "ParamShards: one write-back at a time");
  stored.wait();
  writing_ = write_pool_->acquire();
  std::memcpy(writing_->data(), stored.data(), bytes_[id]);
  return writing_->data();
}

void ParamShards::commit(int id) {
  if (in_host(id)) return;
  ZOE_CHECK_USAGE(writing_.has_value(), "ParamShards::commit without write_buffer");
  SwapHandle h = store_->swap_out(name(id), writing_->data(), std::max<std::size_t>(bytes_[id], 1));
  try {
    h.wait();
  } catch (...) {
    writing_.reset();
    throw;
  }
  writing_.reset();
}

void ParamShards::read(int id, void* dst) {
  ZOE_CHECK_USAGE(finalized_, "ParamShards: read/write before finalize");
  check_host_accessible_in_process(dst, bytes_[id], "ParamShards::read (dst)");
  if (in_host(id)) {
    std::memcpy(dst, host_[id].data(), bytes_[id]);
    return;
  }
  PinnedBuffer b = write_pool_->acquire_wait();
  store_->swap_in(name(id), b.data(), std::max<std::size_t>(bytes_[id], 1)).wait();
  std::memcpy(dst, b.data(), bytes_[id]);
}

void ParamShards::write(int id, const void* src) {
  ZOE_CHECK_USAGE(finalized_, "ParamShards: read/write before finalize");
  check_host_accessible_in_process(src, bytes_[id], "ParamShards::write (src)");
  if (in_host(id)) {
    std::memcpy(host_[id].data(), src, bytes_[id]);
    return;
  }
  PinnedBuffer b = write_pool_->acquire_wait();
  std::memcpy(b.data(), src, bytes_[id]);
  store_->swap_out(name(id), b.data(), std::max<std::size_t>(bytes_[id], 1)).wait();
}

std::int64_t ParamShards::host_bytes() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < bytes_.size(); ++i)
    if (in_host(static_cast<int>(i))) total += static_cast<std::int64_t>(bytes_[i]);
  return total;
}

std::int64_t ParamShards::nvme_bytes() const {
  if (options_.device != OffloadDevice::nvme) return 0;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < bytes_.size(); ++i)
    if (!in_host(static_cast<int>(i))) total += static_cast<std::int64_t>(bytes_[i]);
  return total;
}

std::int64_t ParamShards::staging_bytes() const {
  if (!read_pool_) return 0;
  return static_cast<std::int64_t>(read_pool_->total_bytes() + write_pool_->total_bytes());
}

}  // namespace zoe::offload
