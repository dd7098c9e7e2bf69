// The host-part builder: what the UpdatePipeline's worker does for one group of an update.
// Its offloaded sub-groups step on the CPU optimizer; their new compute-dtype parameters go
// either to device memory (staged and copied by the pipeline), or, with parameter offload
// (stage 3, ZeRO-Infinity's parameter tier), straight into the shard's home: the worker takes
// the tier's write buffer, copies the device sub-groups' output into it, lets the CPU optimizer
// write the rest and commits it before the group's GroupDone is set, so the next gather,
// ordered after that latch, reads the new values. With split master weights the write buffer
// starts with the shard's stored values (the masters' high halves): copied from the step's last
// read of the shard when one was kept for this update (KeptShardReads), else read from NVMe.
#include "src/common/check.hpp"
#include "src/core/update/updater.hpp"

namespace zoe::core {

PipelineGroup Updater::host_part(Group& g, int gi, void* out, std::shared_ptr<DeviceBuffer> device_out) {
  PipelineGroup pg;
  pg.index = gi;
  const std::size_t esz = dtype_size(cx_.dtype);
  for (const SubGroup& sg : g.subgroups)
    if (sg.offloaded())
      pg.subgroups.push_back(
          PipelineSubGroup{sg.offload_id, sg.numel, static_cast<std::size_t>(sg.begin) * esz, sg.runs});
  if (!tiers_.params) {
    pg.out = out;
    pg.out_on_device = true;
    return pg;
  }
  pg.out_on_device = false;  // the CPU optimizer writes straight into the shard's home
  // On the worker: take the tier's write buffer and copy the device sub-groups' output into it
  // (after their update on the update stream, recorded before the pipeline started).
  Event* device_part = g.update_done.get();
  const int id = g.param_id;
  // Split master weights (on NVMe) rebuild the masters from the shard's current values (read
  // first: the device sub-groups' output below overwrites only their own ranges).
  bool split = false;
  for (const SubGroup& sg : g.subgroups) split = split || (sg.offloaded() && tiers_.states->split_master(sg.offload_id));
  // The step's last read of the shard, when one was kept for this update: copied, not read
  // again (a shard in host memory is read from its home, nothing kept).
  const bool reads_nvme = split && keeps_reads_[static_cast<std::size_t>(gi)] && !tiers_.params->in_host(id);
  std::shared_ptr<KeptShardReads::Handoff> kept = reads_nvme ? kept_reads_.hand_over(gi) : nullptr;
  pg.before = [this, &g, id, esz, device_part, device_out, split, kept](PipelineGroup& self) mutable {
    void* home = kept ? tiers_.params->write_buffer_from(id, *kept->read) : tiers_.params->write_buffer(id, split);
    kept.reset();  // its read buffer goes back to the gathers
    self.out = home;
    if (!device_out || !*device_out) return;
    Stream& copies = pipeline_->copy_stream();
    cx_.device.wait(copies, *device_part);
    for (const SubGroup& sg : g.subgroups) {
      if (sg.offloaded()) continue;
      const std::size_t off = static_cast<std::size_t>(sg.begin) * esz, bytes = static_cast<std::size_t>(sg.numel) * esz;
      cx_.device.check_host_accessible(static_cast<char*>(home) + off, bytes, "the parameter tier's write buffer");
      cx_.device.copy(static_cast<char*>(home) + off, static_cast<const char*>(device_out->data()) + off, bytes, copies);
    }
    cx_.device.synchronize(copies);
  };
  pg.after = [this, id](bool ok) {
    if (ok) {
      tiers_.params->commit(id);
    } else {
      tiers_.params->abort_write();  // NVMe: the stored shard keeps its last good bytes
    }
  };
  return pg;
}

}  // namespace zoe::core
