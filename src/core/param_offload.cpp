// Parameter offload (stage 3, ZeRO-Infinity's parameter tier): a group's compute-dtype shard
// lives in offload::ParamShards (host memory or NVMe). gather() brings it in through a
// pinned read buffer (begin_shard_read); the update pipeline's worker writes the updated shard
// straight into the tier's write buffer and commits it (param_host_part) before the group's
// GroupDone is set, so the next gather, ordered after it, reads the new values.
#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"

namespace zoe::core {

std::shared_ptr<offload::ShardRead> EngineImpl::begin_shard_read(Group& g) {
  // Read ahead now if the shard is final (its update is done); else the side stream issues
  // the read when it reaches it, after the update.
  const bool final_now = device.query(*g.update_done) && (!g.host_done || g.host_done->ready());
  for (;;) {
    if (auto read = param_store->try_begin_read(g.param_id, final_now)) return *read;
    // Every read buffer belongs to a gather still on the side stream: wait for the oldest.
    ZOE_CHECK(frees.reap_oldest(), "parameter offload: no pinned read buffer free and none in flight");
  }
}

PipelineGroup EngineImpl::param_host_part(Group& g, int index, std::shared_ptr<DeviceBuffer> device_out) {
  PipelineGroup pg;
  pg.index = index;
  pg.out_on_device = false;  // the CPU optimizer writes straight into the shard's home
  const std::size_t esz = dtype_size(dtype);
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded())
      pg.subgroups.push_back(
          PipelineSubGroup{sg.offload_id, sg.numel, static_cast<std::size_t>(sg.begin) * esz, sg.runs});
  // On the worker: take the tier's write buffer and copy the device sub-groups' output into it
  // (after their update on the update stream, recorded before the pipeline started).
  Event* device_part = g.update_done.get();
  const int id = g.param_id;
  pg.before = [this, &g, id, esz, device_part, device_out](PipelineGroup& self) {
    void* home = param_store->write_buffer(id);
    self.out = home;
    if (!device_out || !*device_out) return;
    Stream& copies = pipeline->copy_stream();
    device.wait(copies, *device_part);
    for (const SubGroup& sg : g.subgroups) {
      if (sg.offloaded()) continue;
      const std::size_t off = static_cast<std::size_t>(sg.begin) * esz, bytes = static_cast<std::size_t>(sg.numel) * esz;
      device.check_host_accessible(static_cast<char*>(home) + off, bytes, "the parameter tier's write buffer");
      device.copy(static_cast<char*>(home) + off, static_cast<const char*>(device_out->data()) + off, bytes, copies);
    }
    device.synchronize(copies);
  };
  pg.after = [this, id](bool ok) {
    if (ok) {
      param_store->commit(id);
    } else {
      param_store->abort_write();  // NVMe: the stored shard keeps its last good bytes
    }
  };
  return pg;
}

}  // namespace zoe::core
