#include "src/offload/optimizer_states.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>

#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/host_access.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/nvme_tier.hpp"
#include "src/offload/pinned_pool.hpp"

namespace zoe::offload {

OptimizerStates::OptimizerStates(const OptimizerStatesOptions& options)
    : options_(options),
      own_adam_(options.adam ? nullptr : std::make_unique<optim::CpuAdam>(1)),
      adam_(options.adam ? options.adam : own_adam_.get()) {
  ZOE_CHECK_USAGE(options.device != OffloadDevice::none, "OptimizerStates needs offload device cpu or nvme");
  if (options.device == OffloadDevice::nvme) {
    if (options.buffer_count < 2)
      ZOE_THROW_CONFIG("zero_optimization.offload_optimizer.buffer_count",
                       "must be >= 2 for NVMe offload (read-ahead and write-behind), got ", options.buffer_count);
  }
}

OptimizerStates::~OptimizerStates() = default;

int OptimizerStates::add(std::int64_t numel) {
  ZOE_CHECK_USAGE(!finalized_, "OptimizerStates::add after finalize");
  ZOE_CHECK_USAGE(numel >= 0, "OptimizerStates::add: negative size ", numel);
  const int id = static_cast<int>(numels_.size());
  numels_.push_back(numel);
  const bool cpu = options_.device == OffloadDevice::cpu;
  host_.push_back(cpu ? AlignedBuffer(std::max<std::size_t>(bytes(id), 1)) : AlignedBuffer());
  AlignedBuffer g(cpu ? grad_bytes(id) : 0);
  if (g.data()) std::memset(g.data(), 0, grad_bytes(id));
  grads_.push_back(std::move(g));
  grad_sum_squares_.push_back(0.0);
  grad_finite_.push_back(1);
  initialised_.push_back(0);
  ++uninitialised_;
  return id;
}

void OptimizerStates::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (options_.device != OffloadDevice::nvme) return;
  std::size_t largest = 4096, largest_grad = 4096;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    const int id = static_cast<int>(i);
    largest = std::max(largest, grad_offset(id) + grad_bytes(id));  // states, then the gradient
    largest_grad = std::max(largest_grad, grad_bytes(id));
  }
  NvmeTierOptions to = nvme_tier_options(options_);
  to.buffer_count = static_cast<std::size_t>(options_.buffer_count);
  to.buffer_bytes = largest;
  to.extra_buffer_bytes = largest_grad;  // the gradient buffer
  to.holder = "optimizer NVMe staging";
  NvmeTier tier = open_nvme_tier(to);
  pool_ = std::move(tier.pool);
  grad_pool_ = std::move(tier.extra);
  store_ = std::move(tier.store);
  // host_grad_budget: the first sub-groups' gradients, while they fit, stay in host memory.
  std::int64_t room = options_.host_grad_budget;
  std::size_t in_host = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    const int id = static_cast<int>(i);
    store_->register_tensor(name(id), std::max<std::size_t>(bytes(id), 1));
    const auto gb = static_cast<std::int64_t>(grad_bytes(id));
    if (room >= gb) {
      room -= gb;
      grads_[i] = AlignedBuffer(grad_bytes(id));
      std::memset(grads_[i].data(), 0, grad_bytes(id));
      ++in_host;
    } else {
      room = 0;  // in order: a later, smaller sub-group does not overtake this one
      store_->register_tensor(grad_name(id), grad_bytes(id));
    }
  }
  ZOE_LOG_INFO("rank {}: optimizer states of {} sub-groups on NVMe in {} ({} MiB, {} x {} MiB staging, O_DIRECT {}); "
               "gradients of {} in host memory ({} MiB, zoe.host_memory_budget)",
               options_.rank, numels_.size(), store_->path(), nvme_state_bytes() >> 20, pool_->buffer_count(),
               pool_->buffer_bytes() >> 20, store_->direct_io(), in_host, host_state_bytes() >> 20);
}

void OptimizerStates::write_initial(int id, std::span<const float> master) {
  ZOE_CHECK_USAGE(finalized_, "OptimizerStates::write_initial before finalize");
  ZOE_CHECK_USAGE(id >= 0 && static_cast<std::size_t>(id) < numels_.size(), "OptimizerStates::write_initial: unknown sub-group ", id);
  check_host_accessible_in_process(master.data(), master.size_bytes(), "OptimizerStates::write_initial (master)");
  const auto n = static_cast<std::size_t>(numels_[id]);
  ZOE_CHECK_USAGE(master.size() == n, "OptimizerStates::write_initial: sub-group ", id, " has ", n,
                  " elements, got ", master.size());
  if (!initialised_[id]) {
    initialised_[id] = 1;
    --uninitialised_;
  }
  auto fill = [&](void* base) {
    float* p = static_cast<float*>(base);
    std::copy(master.begin(), master.end(), p);
    std::fill(p + n, p + 3 * n, 0.0f);
  };
  if (options_.device == OffloadDevice::cpu) {
    fill(host_[id].data());
    return;
  }
  // A free staging buffer, reclaiming the oldest write in flight if there is none.
  std::optional<PinnedBuffer> b = pool_->try_acquire();
  while (!b && !initial_writes_.empty()) {
    InitialWrite w = std::move(initial_writes_.front());
    initial_writes_.pop_front();
    w.states.wait();
    w.grad.wait();
    w.buffer.release();
    b = pool_->try_acquire();
  }
  if (!b) b = pool_->acquire();  // throws OutOfMemoryError naming the pool if all are leased elsewhere
  fill(b->data());
  std::byte* grad = static_cast<std::byte*>(b->data()) + grad_offset(id);
  std::memset(grad, 0, grad_bytes(id));
  if (gradient_in_host(id)) std::memset(grads_[id].data(), 0, grad_bytes(id));
  // Queued before the swaps start, so a failing second swap leaves the first one's buffer
  // leased until the store (destroyed first) has finished with it.
  InitialWrite& w = initial_writes_.emplace_back(InitialWrite{std::move(*b), {}, {}});
  w.states = store_->swap_out(name(id), w.buffer.data(), std::max<std::size_t>(bytes(id), 1));
  if (!gradient_in_host(id)) w.grad = store_->swap_out(grad_name(id), grad, grad_bytes(id));
}

void OptimizerStates::finish_initial() {
  std::exception_ptr error;
  while (!initial_writes_.empty()) {
    InitialWrite w = std::move(initial_writes_.front());
    initial_writes_.pop_front();
    for (SwapHandle* h : {&w.states, &w.grad}) {
      try {
        h->wait();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

void OptimizerStates::check_initialised() {
  finish_initial();
  ZOE_CHECK_USAGE(uninitialised_ == 0, "OptimizerStates: ", uninitialised_, " of ", numels_.size(),
                  " sub-groups have no initial states (write_initial)");
}

void OptimizerStates::for_each(const std::vector<int>& ids, const std::function<void(const SubGroupStates&)>& fn) {
  ZOE_CHECK_USAGE(finalized_, "OptimizerStates::for_each before finalize");
  check_initialised();
  auto view = [&](int id, void* base, const void* grad) {
    float* p = static_cast<float*>(base);
    const std::int64_t n = numels_[id];
    return SubGroupStates{id, n, p, p + n, p + 2 * n, static_cast<const float*>(grad)};
  };
  if (options_.device == OffloadDevice::cpu) {
    for (int id : ids) fn(view(id, host_[id].data(), grads_[id].data()));
    return;
  }
  struct Slot {
    int id;
    PinnedBuffer buffer;
    SwapHandle io, grad_io;
  };
  std::deque<Slot> reads, writes;  // reads in order of ids; writes oldest first
  std::size_t next = 0;
  auto size_of = [&](int id) { return std::max<std::size_t>(bytes(id), 1); };
  // Issues the next read if a staging buffer is free, reclaiming finished writes first.
  auto issue_read = [&](bool must) {
    if (next >= ids.size()) return false;
    std::optional<PinnedBuffer> b = pool_->try_acquire();
    while (!b && !writes.empty() && (must || writes.front().io.ready())) {
      writes.front().io.wait();
      writes.pop_front();  // returns its buffer
      b = pool_->try_acquire();
    }
    if (!b) return false;
    const int id = ids[next++];
    SwapHandle h = store_->swap_in(name(id), b->data(), size_of(id));
    SwapHandle g = gradient_in_host(id) ? SwapHandle{}
                                        : store_->swap_in(grad_name(id), static_cast<std::byte*>(b->data()) + grad_offset(id), grad_bytes(id));
    reads.push_back(Slot{id, std::move(*b), h, g});
    return true;
  };
  std::exception_ptr error;
  try {
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (reads.empty()) issue_read(true);
      // Read-ahead as deep as the free buffers allow (io_uring-cp keeps its queue full), across
      // group boundaries when the caller passes a whole step's sub-groups.
      while (issue_read(false)) {
      }
      Slot cur = std::move(reads.front());
      reads.pop_front();
      cur.io.wait();
      cur.grad_io.wait();
      const void* grad = gradient_in_host(cur.id) ? grads_[cur.id].data()
                                                  : static_cast<std::byte*>(cur.buffer.data()) + grad_offset(cur.id);
      fn(view(cur.id, cur.buffer.data(), grad));
      cur.io = store_->swap_out(name(cur.id), cur.buffer.data(), size_of(cur.id));
      writes.push_back(std::move(cur));  // write-behind; the buffer returns when it is done
    }
  } catch (...) {
    error = std::current_exception();
  }
  for (Slot& s : reads) {
    try {
      s.io.wait();
    } catch (...) {
    }
    try {
      s.grad_io.wait();
    } catch (...) {
    }
  }
  for (Slot& s : writes) {
    try {
      s.io.wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void OptimizerStates::add_grad(int id, const void* src, DType dtype, bool first, bool last) {
  ZOE_CHECK_USAGE(finalized_, "OptimizerStates::add_grad before finalize");
  check_initialised();
  const auto n = static_cast<std::size_t>(numels_[id]);
  check_host_accessible_in_process(src, n * dtype_size(dtype), "OptimizerStates::add_grad (src)");
  auto apply = [&](float* grad) {
    // One pass: the cast or fp32 add, and its sum of squares and finiteness (kept on the last
    // micro-batch only; the earlier ones' cost nothing extra: they come from the same pass).
    const optim::CpuAdam::GradStats st = adam_->add_grad(src, dtype, grad, n, first);
    if (last) {
      grad_sum_squares_[id] = st.sum_squares;
      grad_finite_[id] = st.finite ? 1 : 0;
    }
  };
  if (gradient_in_host(id)) {  // the cpu tier, or host_grad_budget's
    apply(static_cast<float*>(grads_[id].data()));
    return;
  }
  PinnedBuffer b = grad_pool_->acquire_wait();
  if (!first) store_->swap_in(grad_name(id), b.data(), grad_bytes(id)).wait();
  apply(static_cast<float*>(b.data()));
  store_->swap_out(grad_name(id), b.data(), grad_bytes(id)).wait();
}

void OptimizerStates::zero_grad(int id) {
  const auto n = static_cast<std::size_t>(numels_[id]);
  std::vector<float> zeros(n, 0.0f);
  add_grad(id, zeros.data(), DType::f32, true, true);
}

void OptimizerStates::read_master(int id, float* dst) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  check_host_accessible_in_process(dst, static_cast<std::size_t>(numels_[id]) * sizeof(float),
                                   "OptimizerStates::read_master (dst)");
  if (options_.device == OffloadDevice::cpu) {
    std::memcpy(dst, host_[id].data(), static_cast<std::size_t>(numels_[id]) * sizeof(float));
    return;
  }
  PinnedBuffer b = pool_->acquire_wait();
  store_->swap_in(name(id), b.data(), std::max<std::size_t>(bytes(id), 1)).wait();
  std::memcpy(dst, b.data(), static_cast<std::size_t>(numels_[id]) * sizeof(float));
}

void OptimizerStates::read_all(int id, float* data) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  check_host_accessible_in_process(data, static_cast<std::size_t>(numels_[id]) * 3 * sizeof(float),
                                   "OptimizerStates::read_all (data)");
  if (options_.device == OffloadDevice::cpu) {
    std::memcpy(data, host_[id].data(), bytes(id));
    return;
  }
  PinnedBuffer b = pool_->acquire_wait();
  store_->swap_in(name(id), b.data(), std::max<std::size_t>(bytes(id), 1)).wait();
  std::memcpy(data, b.data(), bytes(id));
}

void OptimizerStates::write_all(int id, const float* data) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  check_host_accessible_in_process(data, static_cast<std::size_t>(numels_[id]) * 3 * sizeof(float),
                                   "OptimizerStates::write_all (data)");
  if (options_.device == OffloadDevice::cpu) {
    std::memcpy(host_[id].data(), data, bytes(id));
    return;
  }
  PinnedBuffer b = pool_->acquire_wait();
  std::memcpy(b.data(), data, bytes(id));
  store_->swap_out(name(id), b.data(), std::max<std::size_t>(bytes(id), 1)).wait();
}

std::int64_t OptimizerStates::host_state_bytes() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    if (options_.device == OffloadDevice::cpu) total += numels_[i] * 12;  // master, exp_avg, exp_avg_sq
    if (grads_[i].data()) total += numels_[i] * 4;                      // the fp32 gradient
  }
  return total;
}

std::int64_t OptimizerStates::nvme_state_bytes() const {
  if (options_.device != OffloadDevice::nvme) return 0;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) total += numels_[i] * (grads_[i].data() ? 12 : 16);
  return total;
}

std::int64_t OptimizerStates::staging_bytes() const {
  return pool_ ? static_cast<std::int64_t>(pool_->total_bytes() + grad_pool_->total_bytes()) : 0;
}

}  // namespace zoe::offload
