// Where a rank's optimizer states live: fp32 master weights, exp_avg and exp_avg_sq of
// each sub-group, in host memory (offload_optimizer.device = cpu) or on NVMe (= nvme,
// ZeRO-Infinity). A sub-group's three arrays are stored together ([master | exp_avg |
// exp_avg_sq], 3 * numel floats) so one swap moves them.
//
// for_each() is the optimizer pipeline over sub-groups: on NVMe, the read of sub-group
// k+1 and the write-back of k-1 run while the caller computes k (read-ahead and
// write-behind through `buffer_count` pinned staging buffers of the largest sub-group's
// size; buffer_count >= 3 gives full overlap, 2 serialises write-back and read-ahead).
// Host memory then holds only those buffers, however large the model.
//
// Units: elements (floats) unless named bytes. Thread-safety: one thread drives an
// OptimizerStates; its I/O runs on the store's io_uring threads.
// Errors: IoError / CorruptionError from the NVMe store (naming file, offset, tensor),
// OutOfMemoryError from the pinned pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/common/aligned_buffer.hpp"
#include "zoe/config.hpp"

namespace zoe::offload {

class NvmeStore;
class PinnedPool;

struct OptimizerStatesOptions {
  OffloadDevice device = OffloadDevice::cpu;  // cpu or nvme
  std::string nvme_path;
  int rank = 0;
  int buffer_count = 4;
  bool pin_memory = true;
  std::int64_t pinned_budget_bytes = 0;
  AioConfig aio;
  bool require_direct_io = false;
};

/// The three fp32 arrays of one sub-group, valid inside a for_each callback.
struct SubGroupStates {
  int id;
  std::int64_t numel;
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
};

class OptimizerStates {
 public:
  explicit OptimizerStates(const OptimizerStatesOptions& options);
  ~OptimizerStates();

  /// Adds a sub-group whose master weights start as `master` (exp_avg, exp_avg_sq zero).
  /// Must be called for every sub-group before the first for_each. Returns its id (0, 1, ...).
  int add(std::span<const float> master);
  /// Finishes registration: allocates the staging buffers and writes the initial states.
  void finalize();

  /// Calls fn on each sub-group of `ids` in order with its states loaded; changes are kept
  /// (written back). Rethrows the first error of fn or of the I/O, after draining I/O.
  void for_each(const std::vector<int>& ids, const std::function<void(const SubGroupStates&)>& fn);
  /// Copies sub-group `id`'s master weights (numel floats) into dst.
  void read_master(int id, float* dst);
  /// Copies all three arrays of sub-group `id` ([master | exp_avg | exp_avg_sq], 3 * numel
  /// floats) into / from `data` (checkpoints).
  void read_all(int id, float* data);
  void write_all(int id, const float* data);

  std::int64_t numel(int id) const { return numels_[id]; }
  std::size_t count() const { return numels_.size(); }
  /// Bytes of states held in host memory (cpu tier) and on NVMe (nvme tier).
  std::int64_t host_state_bytes() const;
  std::int64_t nvme_state_bytes() const;
  /// Bytes of pinned staging buffers (nvme tier).
  std::int64_t staging_bytes() const;

 private:
  std::string name(int id) const { return "optim.sg" + std::to_string(id); }
  std::size_t bytes(int id) const { return static_cast<std::size_t>(numels_[id]) * 3 * sizeof(float); }

  OptimizerStatesOptions options_;
  std::vector<std::int64_t> numels_;
  std::vector<AlignedBuffer> host_;  // cpu tier: one per sub-group; nvme tier: initial values until finalize
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<NvmeStore> store_;
  bool finalized_ = false;
};

}  // namespace zoe::offload
