// The one update pipeline (every device): the CPU optimizer's part of a step, run on a
// dedicated worker thread while the trainer's next forward proceeds.
//
// start() takes every group of the step that has host work, in forward order, and returns at
// once. The worker then streams all their offloaded sub-groups through ONE
// OptimizerStates::for_each, so NVMe reads run `buffer_count` deep across group boundaries
// (read-ahead never drains at the end of a group), and runs CpuAdam (its own oneTBB arena,
// zoe.optimizer_threads) on each. start() may be called again before finish(): each call is a
// *wave* the worker runs after the earlier ones (zoe.update_in_backward starts one wave per
// group as its gradient becomes final in backward, then one at step() for the rest); a wave
// first waits for its groups' `ready` latches (their gradients are in the tier), because the
// read-ahead reads a sub-group's gradient with its states. A sub-group's new compute-dtype parameters are written into
// a pinned staging buffer (PinnedPool, `staging_count` buffers, registered with the device)
// and copied to the device on the pipeline's own copy stream; a completion thread waits for
// that copy, returns the buffer and, after a group's last copy, sets the group's GroupDone.
// So GroupDone set == "the group's new parameters are on the device". The engine orders its
// streams after it with a host-side wait (see update/updater.hpp): CUDA's rule that waiting on an
// event not yet recorded does not wait is why a host latch, not a device event, is the signal.
//
// Output into host memory instead (parameter offload: the shard's home in the parameter tier)
// skips the staging and the copy. A group's `before` / `after` callbacks run on the worker
// just before its first sub-group and just after its last (parameter offload: take the tier's
// write buffer and copy the device sub-groups' output into it / commit it).
//
// Units: elements unless named bytes. Thread-safety: start() / finish() / running() on one
// thread (the engine's); the callbacks run on the worker. Errors: the first error of the
// worker (I/O, CorruptionError, OutOfMemoryError, a callback's) is rethrown by finish(); every
// GroupDone of the step is set even then, so no waiter hangs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "src/device/device.hpp"
#include "src/device/host_stream.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/offload/pinned_pool.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::core {

/// The optimizer update of one step (Adam hyper-parameters, step number, gradient factor).
struct UpdatePlan {
  optim::AdamHyper hyper;
  std::int64_t step;
  float grad_scale;  // 1 / (loss_scale * world * micro_batches) * clip_coef
};

/// A run of elements of one sub-group whose parameters share their optimizer options
/// (ParamOptions: weight decay, lr factor). `begin` in elements from the sub-group's start.
/// Both optimizers step each run with hyper_for(plan.hyper, run), so they agree bitwise.
struct OptimRun {
  std::int64_t begin = 0, numel = 0;
  double weight_decay = 0.0;
  double lr_scale = 1.0;
  bool same_options(const OptimRun& o) const { return weight_decay == o.weight_decay && lr_scale == o.lr_scale; }
};

/// The hyper-parameters of one run: lr * lr_scale (in double; exact for lr_scale 1) and the
/// run's weight decay.
inline optim::AdamHyper hyper_for(const optim::AdamHyper& base, const OptimRun& run) {
  optim::AdamHyper h = base;
  h.lr = base.lr * run.lr_scale;
  h.weight_decay = run.weight_decay;
  return h;
}

/// A one-shot latch: a group's host part of the update is done and its new parameters are
/// where they belong. Thread-safe.
class GroupDone {
 public:
  /// Marks it done and wakes every waiter (idempotent).
  void set();
  /// Marks it done as failed (what it stood for did not happen) and wakes every waiter.
  void set_failed() {
    failed_.store(true, std::memory_order_release);
    set();
  }
  /// True once set_failed(). Never blocks.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// Blocks until set().
  void wait() const;
  /// True once set(). Never blocks.
  bool ready() const { return done_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::atomic<bool> failed_{false};
};

/// One offloaded sub-group of a step: its OptimizerStates id, its size and where its new
/// compute-dtype parameters go (`numel` elements of the pipeline's dtype at byte `out_offset`
/// of its group's `out`).
struct PipelineSubGroup {
  int offload_id = -1;
  std::int64_t numel = 0;
  std::size_t out_offset = 0;
  /// Runs of equal optimizer options covering [0, numel); empty: one run with plan.hyper.
  std::vector<OptimRun> runs;
};

/// One group's host part of a step.
struct PipelineGroup {
  int index = -1;                          // the group's index (test hook, errors)
  std::vector<PipelineSubGroup> subgroups;  // offloaded, in forward order (may be empty)
  void* out = nullptr;                     // base of the outputs (`before` may set it)
  bool out_on_device = true;               // true: device memory (staged + copied); false: host memory
  std::function<void(PipelineGroup&)> before;  // on the worker before the first sub-group (optional)
  std::function<void(bool ok)> after;      // on the worker after the last one; ok = no error so far
  std::shared_ptr<GroupDone> done;         // set once the group's output is in place
  std::shared_ptr<GroupDone> ready;        // waited for before the wave reads anything; failed: the wave fails (optional)
};

struct UpdatePipelineOptions {
  DType out_dtype = DType::bf16;  // compute dtype of the outputs
  /// Bytes of each pinned output staging buffer (>= the largest device-bound sub-group's
  /// output); 0: no staging (every output is host memory).
  std::size_t staging_bytes = 0;
  int staging_count = 2;  // staging buffers (double-buffered: Adam of k+1 overlaps the copy of k)
  bool pin_memory = true;
  std::shared_ptr<offload::PinnedBudget> pinned_budget;  // the rank's zoe.pinned_budget_bytes (null: unbudgeted)
};

class UpdatePipeline {
 public:
  /// Builds the staging pool (registered with `device`) and the copy stream; starts the worker
  /// and completion threads. `states` (null: no optimizer offload, so no group has sub-groups)
  /// and `adam` must outlive the pipeline. Throws OutOfMemoryError (pinned budget).
  UpdatePipeline(Device& device, offload::OptimizerStates* states, optim::CpuAdam& adam,
                 const UpdatePipelineOptions& options);
  /// Waits for a running update (errors dropped), then stops the threads.
  ~UpdatePipeline();
  UpdatePipeline(const UpdatePipeline&) = delete;
  UpdatePipeline& operator=(const UpdatePipeline&) = delete;

  /// Queues the update of `groups` (forward order) with `plan` as one wave, after every wave
  /// queued before it. Never blocks.
  void start(std::vector<PipelineGroup> groups, const UpdatePlan& plan);
  /// Blocks until every wave started is done; rethrows the first error. After an error every
  /// later wave's groups fail too (their `after(false)` runs, their GroupDone is set).
  void finish();
  /// Rethrows (without clearing) the first error of the waves and copies run so far; never
  /// blocks. zoe.update_in_backward never drains the pipeline between steps (each step's waves
  /// queue behind the last one's), so step() asks this instead of finish().
  void check() const {
    worker_.rethrow_error_up_to(worker_.last_ticket());
    completion_.rethrow_error_up_to(completion_.last_ticket());
  }
  /// True between the first start() and finish().
  bool running() const { return running_; }
  /// The stream the worker copies on (callbacks may queue on it from the worker).
  Stream& copy_stream() { return *copy_; }
  /// Bytes of the pinned staging pool.
  std::size_t staging_bytes() const { return pool_ ? pool_->total_bytes() : 0; }

 private:
  void run(std::vector<PipelineGroup>& groups, const UpdatePlan& plan);

  Device& device_;
  offload::OptimizerStates* states_;
  optim::CpuAdam& adam_;
  UpdatePipelineOptions options_;
  std::unique_ptr<offload::PinnedPool> pool_;
  std::unique_ptr<Stream> copy_;
  // Destroyed in reverse order, each draining its tasks: the worker first (it queues into the
  // completion thread), then the completion thread (it returns buffers to pool_).
  HostQueue completion_{"zoe-update-done"};
  HostQueue worker_{"zoe-update"};
  bool running_ = false;
  bool failed_ = false;  // a wave threw: the later waves of this update fail without running (worker only)
};

}  // namespace zoe::core
