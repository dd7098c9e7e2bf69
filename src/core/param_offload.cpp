// Parameter offload (stage 3, ZeRO-Infinity's parameter tier): a group's compute-dtype shard
// lives in offload::ParamShards (host memory or NVMe). gather() brings it in through a
// pinned read buffer (begin_shard_read); the optimizer writes the updated shard straight into
// the tier's write buffer and commits it (update_offloaded_params), before the group's
// update_done event, so the next gather reads the new values.
#include <cstring>

#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

std::shared_ptr<offload::ShardRead> EngineImpl::begin_shard_read(Group& g) {
  // Read ahead now if the shard is final (its update is done); else the side stream issues
  // the read when it reaches it, after the update.
  const bool final_now = device.query(*g.update_done);
  for (;;) {
    if (auto read = param_store->try_begin_read(g.param_id, final_now)) return *read;
    // Every read buffer belongs to a gather still on the side stream: wait for the oldest.
    ZOE_CHECK(!pending_frees.empty(), "parameter offload: no pinned read buffer free and none in flight");
    device.synchronize(*pending_frees.front().after);
    releasing_elements -= pending_frees.front().gathered_elements;
    pending_frees.pop_front();
  }
}

void EngineImpl::copy_to_host_now(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  if (device.kind() == DeviceKind::host) {
    std::memcpy(dst, src, bytes);
  } else {
    device.copy(dst, src, bytes, stream);
    device.synchronize(stream);
  }
}

void EngineImpl::update_offloaded_params(Group& g, const UpdatePlan& plan, const DeviceBuffer& device_out) {
  void* home = param_store->write_buffer(g.param_id);
  try {
    const std::size_t esz = dtype_size(dtype);
    // Device sub-groups were updated on the update stream (ordered before this work).
    for (const SubGroup& sg : g.subgroups) {
      if (sg.offloaded()) continue;
      const std::size_t off = static_cast<std::size_t>(sg.begin) * esz;
      copy_to_host_now(static_cast<char*>(home) + off, static_cast<const char*>(device_out.data()) + off,
                       static_cast<std::size_t>(sg.numel) * esz, *update_stream);
    }
    update_offloaded(g, plan, home, *update_stream);
  } catch (...) {
    param_store->abort_write();  // NVMe: the stored shard keeps its last good bytes
    throw;
  }
  param_store->commit(g.param_id);
}

}  // namespace zoe::core
