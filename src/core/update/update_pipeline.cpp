#include "src/core/update/update_pipeline.hpp"

#include <cstring>
#include <exception>

#include "src/common/check.hpp"
#include "src/core/test_hooks.hpp"

namespace zoe::core {

void GroupDone::set() {
  {
    std::lock_guard lock(mutex_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void GroupDone::wait() const {
  if (ready()) return;
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
}

UpdatePipeline::UpdatePipeline(Device& device, offload::OptimizerStates* states, optim::CpuAdam& adam,
                               const UpdatePipelineOptions& options)
    : device_(device), states_(states), adam_(adam), options_(options), copy_(device.create_stream()) {
  if (options.staging_bytes > 0) {
    offload::PinnedPoolOptions po;
    po.buffer_count = static_cast<std::size_t>(std::max(1, options.staging_count));
    po.buffer_bytes = options.staging_bytes;
    po.budget = options.pinned_budget;
    po.holder = "update pipeline output staging";
    po.lock = options.pin_memory;
    // Registered with the device, so its copies are the pinned (asynchronous) kind.
    po.register_fn = [&device](void* p, std::size_t bytes) { return device.register_host_memory(p, bytes); };
    po.unregister_fn = [&device](void* p) { device.unregister_host_memory(p); };
    pool_ = std::make_unique<offload::PinnedPool>(po);
  }
}

UpdatePipeline::~UpdatePipeline() {
  try {
    worker_.synchronize();
  } catch (...) {
  }
  try {
    completion_.synchronize();
  } catch (...) {
  }
  try {
    device_.synchronize(*copy_);
  } catch (...) {
  }
}

void UpdatePipeline::start(std::vector<PipelineGroup> groups, const UpdatePlan& plan) {
  if (!running_) failed_ = false;  // a new update (the worker is idle: finish() drained it)
  running_ = true;
  auto shared = std::make_shared<std::vector<PipelineGroup>>(std::move(groups));
  worker_.enqueue([this, shared, plan] { run(*shared, plan); });
}

void UpdatePipeline::finish() {
  if (!running_) return;
  running_ = false;
  std::exception_ptr error;
  try {
    worker_.synchronize();
  } catch (...) {
    error = std::current_exception();
  }
  try {
    completion_.synchronize();
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  if (error) std::rethrow_exception(error);
}

void UpdatePipeline::run(std::vector<PipelineGroup>& groups, const UpdatePlan& plan) {
  // Every offloaded sub-group of the step, in forward order, and where each belongs.
  struct Slot {
    std::size_t group, sub;
  };
  std::vector<int> ids;
  std::vector<Slot> slots;
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t k = 0; k < groups[g].subgroups.size(); ++k) {
      ids.push_back(groups[g].subgroups[k].offload_id);
      slots.push_back(Slot{g, k});
    }
  const std::size_t esz = dtype_size(options_.out_dtype);
  // Groups [0, ended) are complete (`after` ran, done queued); [0, begun) have begun.
  std::size_t begun = 0, ended = 0;
  auto end_next = [&] {
    PipelineGroup& pg = groups[ended];
    if (pg.after) pg.after(true);  // if it throws, the error path below ends the group
    ++ended;
    if (test_hooks::after_group_update) test_hooks::after_group_update(pg.index);
    // Queued after the group's copies (FIFO): once it runs, the parameters are on the device.
    completion_.enqueue([done = pg.done] {
      if (done) done->set();
    });
  };
  // Begins groups up to g, ending each earlier one first (they are complete: their sub-groups
  // were visited, or they have none).
  auto begin_through = [&](std::size_t g) {
    for (; begun <= g && begun < groups.size(); ++begun) {
      while (ended < begun) end_next();
      if (groups[begun].before) groups[begun].before(groups[begun]);
    }
  };

  std::exception_ptr error;
  try {
    ZOE_CHECK(!failed_, "update pipeline: an earlier wave of this update failed");
    // The groups' gradients must be in the tier before the read-ahead reads them.
    for (const PipelineGroup& pg : groups)
      if (pg.ready) {
        pg.ready->wait();
        ZOE_CHECK(!pg.ready->failed(), "update pipeline: group ", pg.index,
                  "'s gradient did not reach the offload tier (its error is the gradient path's)");
      }
    std::size_t next_sub = 0;  // index into slots
    auto visit = [&](const offload::SubGroupStates& st) {
      const Slot s = slots[next_sub++];
      begin_through(s.group);
      const PipelineGroup& pg = groups[s.group];
      const PipelineSubGroup& sg = pg.subgroups[s.sub];
      ZOE_CHECK(st.numel == sg.numel, "update pipeline: sub-group ", sg.offload_id, " has ", st.numel,
                " elements, expected ", sg.numel);
      const std::size_t n = static_cast<std::size_t>(st.numel), bytes = n * esz;
      device_.check_host_accessible(st.master, n * sizeof(float), "the CPU optimizer's master weights");
      device_.check_host_accessible(st.exp_avg, st.moment_bytes(), "the CPU optimizer's exp_avg and exp_avg_sq");
      device_.check_host_accessible(st.grad, n * dtype_size(st.grad_dtype), "the CPU optimizer's gradient");
      offload::PinnedBuffer staging;
      void* const dst = static_cast<char*>(pg.out) + sg.out_offset;
      void* out = dst;
      if (pg.out_on_device) {
        ZOE_CHECK(pool_ && bytes <= pool_->buffer_bytes(), "update pipeline: no staging buffer for ", bytes, " bytes");
        staging = pool_->acquire_wait();  // the completion thread returns them
        out = staging.data();
      } else {
        device_.check_host_accessible(out, bytes, "the CPU optimizer's parameter output");
      }
      // Split master weights: the masters are rebuilt from the shard's current bf16 values (the
      // parameter tier's write buffer holds them, PipelineGroup::before) and the rounded-up bits
      // in exp_avg_sq's sign (cleared for the update), and split again against the new values
      // below; elements no run updates keep both halves, so they split as they were.
      auto* const high = static_cast<std::uint16_t*>(out);
      if (st.split_master()) {
        ZOE_CHECK(!pg.out_on_device && options_.out_dtype == DType::bf16,
                  "update pipeline: split master weights need bf16 parameters in a parameter tier");
        adam_.join_master_for_update(high, st.master_low, st.exp_avg_sq,
                                     st.state_dtype == OptimizerStateDType::bf16, st.master, n);
      }
      // Each run of equal per-parameter options with its own weight decay and lr (Adam is
      // elementwise: splitting the call changes no bit).
      const std::vector<OptimRun> whole{OptimRun{0, st.numel, plan.hyper.weight_decay, 1.0}};
      const std::size_t state_size = optimizer_state_dtype_size(st.state_dtype);
      for (const OptimRun& r : sg.runs.empty() ? whole : sg.runs) {
        const auto b = static_cast<std::size_t>(r.begin);
        adam_.step(hyper_for(plan.hyper, r), plan.step, plan.grad_scale, st.master + b,
                   static_cast<char*>(st.exp_avg) + b * state_size, static_cast<char*>(st.exp_avg_sq) + b * state_size,
                   st.state_dtype, static_cast<const char*>(st.grad) + b * dtype_size(st.grad_dtype), st.grad_dtype,
                   static_cast<std::size_t>(r.numel),
                   options_.out_dtype == DType::f32 ? nullptr : static_cast<char*>(out) + b * esz,
                   options_.out_dtype);
      }
      if (options_.out_dtype == DType::f32) std::memcpy(out, st.master, bytes);
      if (st.split_master())
        adam_.split_master(st.master, high, st.master_low, st.exp_avg_sq, st.state_dtype == OptimizerStateDType::bf16, n);
      if (pg.out_on_device) {
        device_.copy(dst, out, bytes, *copy_);
        auto copied = std::shared_ptr<Event>(device_.create_event());
        device_.record(*copied, *copy_);
        completion_.enqueue([this, copied, buf = std::make_shared<offload::PinnedBuffer>(std::move(staging))] {
          device_.synchronize(*copied);
          buf->release();
        });
      }
      // The group's last sub-group: it is complete.
      if (s.sub + 1 == pg.subgroups.size()) end_next();
    };
    if (!ids.empty()) {
      ZOE_CHECK(states_ != nullptr, "update pipeline: offloaded sub-groups without optimizer states");
      states_->for_each(ids, visit);
    }
    // Groups after the last sub-group (none of their own).
    if (!groups.empty()) begin_through(groups.size() - 1);
    while (ended < groups.size()) end_next();
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    failed_ = true;
    // The gradients this wave did not consume give their host buffers back (recycled buffers,
    // OptimizerStates::recycle_gradient_slots), once they have arrived, so that the gradient
    // path never waits for a buffer only a failed wave held.
    if (states_ && !ids.empty()) {
      for (const PipelineGroup& pg : groups)
        if (pg.ready) pg.ready->wait();
      states_->discard_gradients(ids);
    }
    // Every group not ended fails: its `after` learns it, and its waiters are released.
    for (; ended < groups.size(); ++ended) {
      PipelineGroup& pg = groups[ended];
      try {
        if (pg.after && ended < begun) pg.after(false);
      } catch (...) {
      }
      completion_.enqueue([done = pg.done] {
        if (done) done->set();
      });
    }
    std::rethrow_exception(error);
  }
}

}  // namespace zoe::core
