#include "src/offload/optimizer_states.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>

#include "src/common/byte_size.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/host_access.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/nvme_tier.hpp"
#include "src/offload/pinned_pool.hpp"
#include "src/optim/split_master.hpp"
#include "kernels/half.hpp"

namespace zoe::offload {

OptimizerStates::OptimizerStates(const OptimizerStatesOptions& options)
    : options_(options),
      own_adam_(options.adam ? nullptr : std::make_unique<optim::CpuAdam>(1)),
      adam_(options.adam ? options.adam : own_adam_.get()) {
  ZOE_CHECK_USAGE(options.device != OffloadDevice::none, "OptimizerStates needs offload device cpu or nvme");
  ZOE_CHECK_USAGE(!options.split_master || options.device == OffloadDevice::nvme,
                  "OptimizerStates: split master weights need the nvme tier");
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
  states_home_.push_back(cpu ? StatesHome::host : StatesHome::nvme);  // nvme: finalize() decides
  host_.push_back(cpu ? AlignedBuffer(std::max<std::size_t>(bytes(id), 1)) : AlignedBuffer());
  AlignedBuffer g(cpu ? grad_bytes(id) : 0);
  if (g.data()) std::memset(g.data(), 0, grad_bytes(id));
  grads_.push_back(std::move(g));
  home_.push_back(cpu ? GradientHome::host : GradientHome::nvme);  // nvme: finalize() decides
  slot_of_.push_back(-1);
  grad_sum_squares_.push_back(0.0);
  grad_finite_.push_back(1);
  initialised_.push_back(0);
  ++uninitialised_;
  return id;
}

void OptimizerStates::recycle_gradient_slots(int count) {
  ZOE_CHECK_USAGE(!finalized_, "OptimizerStates::recycle_gradient_slots after finalize");
  ZOE_CHECK_USAGE(count >= 1, "OptimizerStates::recycle_gradient_slots: count must be >= 1, got ", count);
  requested_slots_ = count;
}

void OptimizerStates::set_host_budget(std::int64_t bytes) {
  ZOE_CHECK_USAGE(!finalized_, "OptimizerStates::set_host_budget after finalize");
  ZOE_CHECK_USAGE(bytes >= 0, "OptimizerStates::set_host_budget: negative budget ", bytes);
  options_.host_budget = bytes;
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
  place_in_host_memory(largest_grad);
  std::size_t grads_in_host = 0, states_in_host = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    grads_in_host += home_[i] != GradientHome::nvme ? 1 : 0;
    states_in_host += states_home_[i] == StatesHome::host ? 1 : 0;
  }
  ZOE_LOG_INFO("rank {}: optimizer states of {} sub-groups ({} master, {} exp_avg / exp_avg_sq) on NVMe in {} "
               "({}, {} x {} staging, O_DIRECT {}); in host memory ({}, zoe.host_memory_budget): "
               "{} gradients of {}{}, the states of {}",
               options_.rank, numels_.size(),
               options_.split_master ? "split (low halves beside the bf16 shards, rounded-up bits in exp_avg_sq's signs)" : "fp32",
               optim::optimizer_state_dtype_name(options_.state_dtype), store_->path(), detail::byte_size(nvme_state_bytes()),
               pool_->buffer_count(), detail::byte_size(static_cast<std::int64_t>(pool_->buffer_bytes())), store_->direct_io(),
               detail::byte_size(host_state_bytes()),
               dtype_name(options_.grad_dtype), grads_in_host,
               slots_.empty() ? std::string() : " (" + std::to_string(slots_.size()) + " recycled buffers, zoe.update_in_backward)",
               states_in_host);
}

void OptimizerStates::place_in_host_memory(std::size_t largest_grad) {
  const std::size_t sub_groups = numels_.size();
  std::int64_t room = options_.host_budget;
  if (requested_slots_ > 0) {
    // Recycled buffers (zoe.update_in_backward): no gradient on NVMe, and none needs the budget.
    const std::size_t count = std::min(static_cast<std::size_t>(requested_slots_), sub_groups);
    for (std::size_t k = 0; k < count; ++k) {
      slots_.emplace_back(largest_grad);
      free_slots_.push_back(static_cast<int>(k));
    }
    zero_gradient_ = AlignedBuffer(largest_grad);
    std::memset(zero_gradient_.data(), 0, largest_grad);
    for (std::size_t i = 0; i < sub_groups; ++i) home_[i] = GradientHome::zeros;  // the initial gradient: 0
  } else {
    // The first sub-groups' gradients, while they fit (each byte saves two of NVMe traffic a
    // step: written, then read by the update; more with micro-batches that accumulate).
    for (std::size_t i = 0; i < sub_groups; ++i) {
      const int id = static_cast<int>(i);
      const auto gb = static_cast<std::int64_t>(grad_bytes(id));
      if (room < gb) {
        room = -1;  // in order: a later, smaller sub-group does not overtake this one
        break;
      }
      room -= gb;
      grads_[i] = AlignedBuffer(grad_bytes(id));
      std::memset(grads_[i].data(), 0, grad_bytes(id));
      home_[i] = GradientHome::host;
    }
  }
  // Then, once every gradient is off NVMe, the first sub-groups' states (read and written each
  // step: two bytes saved per byte too), with fp32 masters.
  const std::size_t state_element_bytes = sizeof(float) + 2 * optimizer_state_dtype_size(options_.state_dtype);
  for (std::size_t i = 0; i < sub_groups && room >= 0; ++i) {
    const auto sb = static_cast<std::int64_t>(static_cast<std::size_t>(numels_[i]) * state_element_bytes);
    if (room < sb) break;
    room -= sb;
    states_home_[i] = StatesHome::host;
    host_[i] = AlignedBuffer(std::max<std::size_t>(static_cast<std::size_t>(sb), 1));
  }
  for (std::size_t i = 0; i < sub_groups; ++i) {
    const int id = static_cast<int>(i);
    if (states_home_[i] == StatesHome::nvme) store_->register_tensor(name(id), std::max<std::size_t>(bytes(id), 1));
    if (home_[i] == GradientHome::nvme) store_->register_tensor(grad_name(id), grad_bytes(id));
  }
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
  auto fill = [&](void* base) { convert_states(id, nullptr, base, false, nullptr, master.data()); };
  if (states_in_host(id)) {  // the cpu tier, or host_budget's; its gradient is in host memory too
    fill(host_[id].data());
    if (home_[id] == GradientHome::host) std::memset(grads_[id].data(), 0, grad_bytes(id));
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
  if (home_[id] == GradientHome::host) std::memset(grads_[id].data(), 0, grad_bytes(id));
  // Queued before the swaps start, so a failing second swap leaves the first one's buffer
  // leased until the store (destroyed first) has finished with it.
  InitialWrite& w = initial_writes_.emplace_back(InitialWrite{std::move(*b), {}, {}});
  w.states = store_->swap_out(name(id), w.buffer.data(), std::max<std::size_t>(bytes(id), 1));
  if (home_[id] == GradientHome::nvme) w.grad = store_->swap_out(grad_name(id), grad, grad_bytes(id));
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
  if (options_.device == OffloadDevice::cpu) {
    for (int id : ids) fn(view(id, host_[id].data(), grads_[id].data()));  // never split (nvme only)
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
    ZOE_CHECK(home_[ids[next]] != GradientHome::empty, "OptimizerStates::for_each: sub-group ", ids[next],
              " has no gradient since its last update (no add_grad or zero_grad)");
    if (states_in_host(ids[next])) {  // updated in place: nothing to read (its gradient is in host memory)
      reads.push_back(Slot{ids[next++], PinnedBuffer{}, {}, {}});
      return true;
    }
    std::optional<PinnedBuffer> b = pool_->try_acquire();
    while (!b && !writes.empty() && (must || writes.front().io.ready())) {
      writes.front().io.wait();
      writes.pop_front();  // returns its buffer
      b = pool_->try_acquire();
    }
    if (!b) return false;
    const int id = ids[next++];
    SwapHandle h = store_->swap_in(name(id), b->data(), size_of(id));
    SwapHandle g = home_[id] != GradientHome::nvme ? SwapHandle{}
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
      const void* grad = home_[cur.id] != GradientHome::nvme ? host_gradient(cur.id)
                                                             : static_cast<std::byte*>(cur.buffer.data()) + grad_offset(cur.id);
      const bool in_host = states_in_host(cur.id);
      fn(view(cur.id, in_host ? host_[cur.id].data() : cur.buffer.data(), grad));
      if (home_[cur.id] == GradientHome::in_slot || home_[cur.id] == GradientHome::zeros) give_back_slot(cur.id);
      if (in_host) continue;  // updated in place
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
  const bool as_arrives = options_.grad_dtype != DType::f32;
  ZOE_CHECK_USAGE(!as_arrives || (dtype == options_.grad_dtype && first && last),
                  "OptimizerStates::add_grad: a ", dtype_name(options_.grad_dtype),
                  " gradient tier takes one micro-batch of that dtype per step, got ", dtype_name(dtype),
                  first ? "" : " (not the first micro-batch)", last ? "" : " (not the last micro-batch)");
  auto apply = [&](void* grad) {
    if (as_arrives) {  // kept as it arrives: the sums are those of the values the cast would store
      std::memcpy(grad, src, n * dtype_size(dtype));
      grad_sum_squares_[id] = adam_->sum_squares(grad, dtype, n);
      // Its finite check (one pass, not two): an fp64 sum of squares never overflows and is
      // finite exactly when every element is (an fp32 square is at most 1.2e77).
      grad_finite_[id] = std::isfinite(grad_sum_squares_[id]) ? 1 : 0;
      return;
    }
    // One pass: the cast or fp32 add, and its sum of squares and finiteness (kept on the last
    // micro-batch only; the earlier ones' cost nothing extra: they come from the same pass).
    const optim::CpuAdam::GradStats st = adam_->add_grad(src, dtype, static_cast<float*>(grad), n, first);
    if (last) {
      grad_sum_squares_[id] = st.sum_squares;
      grad_finite_[id] = st.finite ? 1 : 0;
    }
  };
  if (home_[id] == GradientHome::host) {  // the cpu tier, or host_budget's
    apply(grads_[id].data());
    return;
  }
  if (home_[id] != GradientHome::nvme) {  // recycled buffers: the step's first add takes one
    if (first && home_[id] != GradientHome::in_slot) take_slot(id);
    ZOE_CHECK(home_[id] == GradientHome::in_slot, "OptimizerStates::add_grad: sub-group ", id,
              " has no gradient buffer (a later micro-batch before the first)");
    apply(slots_[static_cast<std::size_t>(slot_of_[id])].data());
    return;
  }
  PinnedBuffer b = grad_pool_->acquire_wait();
  if (!first) store_->swap_in(grad_name(id), b.data(), grad_bytes(id)).wait();
  apply(b.data());
  store_->swap_out(grad_name(id), b.data(), grad_bytes(id)).wait();
}

void OptimizerStates::discard_gradients(const std::vector<int>& ids) {
  for (int id : ids)
    if (home_[id] == GradientHome::in_slot || home_[id] == GradientHome::zeros) give_back_slot(id);
}

void OptimizerStates::zero_grad(int id) {
  if (home_[id] == GradientHome::empty || home_[id] == GradientHome::in_slot || home_[id] == GradientHome::zeros) {
    give_back_slot(id);  // a zero gradient needs no buffer of its own
    home_[id] = GradientHome::zeros;
    grad_sum_squares_[id] = 0.0;
    grad_finite_[id] = 1;
    return;
  }
  const auto n = static_cast<std::size_t>(numels_[id]);
  std::vector<std::byte> zeros(n * dtype_size(options_.grad_dtype));  // +0 in every dtype
  add_grad(id, zeros.data(), options_.grad_dtype, true, true);
}

void OptimizerStates::read_master(int id, float* dst, const std::uint16_t* high) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  const auto n = static_cast<std::size_t>(numels_[id]);
  check_host_accessible_in_process(dst, n * sizeof(float), "OptimizerStates::read_master (dst)");
  ZOE_CHECK_USAGE(!split_master(id) || high, "OptimizerStates::read_master: split master weights need the "
                  "sub-group's bf16 parameters (the high halves)");
  with_stored(id, [&](const void* stored) {
    if (split_master(id)) {
      const SubGroupStates st = view(id, const_cast<void*>(stored), nullptr);
      optim::join_master(high, st.master_low, st.exp_avg_sq, st.state_dtype == OptimizerStateDType::bf16, dst, n);
    } else {
      std::memcpy(dst, stored, n * sizeof(float));
    }
  });
}

void OptimizerStates::read_all(int id, float* data, const std::uint16_t* high) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  check_host_accessible_in_process(data, static_cast<std::size_t>(numels_[id]) * 3 * sizeof(float),
                                   "OptimizerStates::read_all (data)");
  ZOE_CHECK_USAGE(!split_master(id) || high, "OptimizerStates::read_all: split master weights need the "
                  "sub-group's bf16 parameters (the high halves)");
  with_stored(id, [&](const void* stored) { convert_states(id, stored, data, true, high); });
}

void OptimizerStates::write_all(int id, const float* data) {
  check_initialised();
  if (numels_[id] == 0) return;  // nothing to copy (and `data` may be null)
  check_host_accessible_in_process(data, static_cast<std::size_t>(numels_[id]) * 3 * sizeof(float),
                                   "OptimizerStates::write_all (data)");
  if (states_in_host(id)) {
    convert_states(id, data, host_[id].data(), false);
    return;
  }
  PinnedBuffer b = pool_->acquire_wait();
  convert_states(id, data, b.data(), false);
  store_->swap_out(name(id), b.data(), std::max<std::size_t>(bytes(id), 1)).wait();
}

void OptimizerStates::with_stored(int id, const std::function<void(const void*)>& fn) {
  if (states_in_host(id)) {
    fn(host_[id].data());
    return;
  }
  PinnedBuffer b = pool_->acquire_wait();
  store_->swap_in(name(id), b.data(), std::max<std::size_t>(bytes(id), 1)).wait();
  fn(b.data());
}

std::int64_t OptimizerStates::host_state_bytes() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    if (states_home_[i] == StatesHome::host) total += static_cast<std::int64_t>(bytes(static_cast<int>(i)));  // master, exp_avg, exp_avg_sq
    if (grads_[i].data()) total += numels_[i] * static_cast<std::int64_t>(dtype_size(options_.grad_dtype));  // the gradient
  }
  for (const AlignedBuffer& b : slots_) total += static_cast<std::int64_t>(b.size());  // recycled gradient buffers
  return total;
}

std::int64_t OptimizerStates::nvme_state_bytes() const {
  if (options_.device != OffloadDevice::nvme) return 0;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    if (states_home_[i] == StatesHome::nvme) total += static_cast<std::int64_t>(bytes(static_cast<int>(i)));
    if (home_[i] == GradientHome::nvme) total += numels_[i] * static_cast<std::int64_t>(dtype_size(options_.grad_dtype));
  }
  return total;
}

void OptimizerStates::take_slot(int id) {
  std::unique_lock lock(slot_mutex_);
  slot_freed_.wait(lock, [&] { return !free_slots_.empty(); });
  slot_of_[id] = free_slots_.back();
  free_slots_.pop_back();
  home_[id] = GradientHome::in_slot;
}

void OptimizerStates::give_back_slot(int id) {
  if (slot_of_[id] >= 0) {
    std::lock_guard lock(slot_mutex_);
    free_slots_.push_back(slot_of_[id]);
    slot_of_[id] = -1;
  }
  slot_freed_.notify_one();
  home_[id] = GradientHome::empty;
}

const void* OptimizerStates::host_gradient(int id) const {
  switch (home_[id]) {
    case GradientHome::host: return grads_[id].data();
    case GradientHome::in_slot: return slots_[static_cast<std::size_t>(slot_of_[id])].data();
    case GradientHome::zeros: return zero_gradient_.data();
    case GradientHome::nvme:
    case GradientHome::empty: break;
  }
  return nullptr;
}

std::size_t OptimizerStates::bytes(int id) const {
  const auto n = static_cast<std::size_t>(numels_[id]);
  const std::size_t moments = 2 * n * optimizer_state_dtype_size(options_.state_dtype);
  return split_master(id) ? moments + n * sizeof(std::uint16_t) : n * sizeof(float) + moments;
}

SubGroupStates OptimizerStates::view(int id, void* base, const void* grad) const {
  const std::int64_t n = numels_[id];
  const std::size_t un = static_cast<std::size_t>(n);
  const std::size_t s = optimizer_state_dtype_size(options_.state_dtype);
  auto* b = static_cast<std::byte*>(base);
  if (!split_master(id)) {  // [master | exp_avg | exp_avg_sq]
    std::byte* m = b + un * sizeof(float);
    return SubGroupStates{id, n, reinterpret_cast<float*>(b), m, m + un * s, options_.state_dtype, grad,
                          options_.grad_dtype};
  }
  // [exp_avg | exp_avg_sq | low halves], the fp32 master scratch after them.
  SubGroupStates st{id, n, reinterpret_cast<float*>(b + scratch_offset(id)), b, b + un * s, options_.state_dtype,
                    grad, options_.grad_dtype};
  st.master_low = reinterpret_cast<std::uint16_t*>(b + 2 * un * s);
  return st;
}

void OptimizerStates::convert_states(int id, const void* src, void* dst, bool to_fp32, const std::uint16_t* high,
                                     const float* initial_master) const {
  const auto n = static_cast<std::size_t>(numels_[id]);
  if (n == 0) return;  // nothing stored (and the pointers may be null)
  const bool bf16 = options_.state_dtype == OptimizerStateDType::bf16;
  if (!split_master(id)) {
    // The master weights are fp32 in both layouts, and so are the moments with fp32 states.
    if (initial_master) {
      std::memcpy(dst, initial_master, n * sizeof(float));
      std::memset(static_cast<float*>(dst) + n, 0, bytes(id) - n * sizeof(float));  // +0 in fp32 and bf16
      return;
    }
    std::memcpy(dst, src, bf16 ? n * sizeof(float) : bytes(id));
    if (!bf16) return;
  }
  // The stored layout's arrays, and the checkpoint view's [master | exp_avg | exp_avg_sq].
  const SubGroupStates st = view(id, const_cast<void*>(to_fp32 ? src : dst), nullptr);
  // (Null for the initial write, which has only `initial_master`.)
  float* view_master = static_cast<float*>(to_fp32 ? dst : const_cast<void*>(src));
  float* view_moments = view_master ? view_master + n : nullptr;
  // Split masters: the stored exp_avg_sq carries the rounded-up bits in its signs, so the
  // master is joined before the moments are copied out, and split after they are copied in.
  if (split_master(id) && to_fp32) optim::join_master(high, st.master_low, st.exp_avg_sq, bf16, view_master, n);
  if (initial_master) {
    std::memset(st.exp_avg, 0, st.moment_bytes());  // +0 in fp32 and bf16
  } else if (!bf16) {
    if (to_fp32) {
      std::memcpy(view_moments, st.exp_avg, st.moment_bytes());
    } else {
      std::memcpy(st.exp_avg, view_moments, st.moment_bytes());
    }
  } else {
    auto* half = static_cast<std::uint16_t*>(st.exp_avg);  // exp_avg_sq follows it
    if (to_fp32) {
      for (std::size_t i = 0; i < 2 * n; ++i) view_moments[i] = kernels::bf16_to_f32(half[i]);
    } else {
      for (std::size_t i = 0; i < 2 * n; ++i) half[i] = kernels::f32_to_bf16(view_moments[i]);
    }
  }
  if (!split_master(id)) return;
  if (to_fp32) {
    // The view's exp_avg_sq without the bits: the moment's own value (never negative).
    for (std::size_t i = n; i < 2 * n; ++i)
      view_moments[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(view_moments[i]) & 0x7fffffffu);
    return;
  }
  const float* master = initial_master ? initial_master : view_master;
  std::vector<std::uint16_t> rounded(n);
  for (std::size_t i = 0; i < n; ++i) rounded[i] = kernels::f32_to_bf16(master[i]);
  optim::split_master(master, rounded.data(), st.master_low, st.exp_avg_sq, bf16, n);
}

std::int64_t OptimizerStates::staging_bytes() const {
  return pool_ ? static_cast<std::int64_t>(pool_->total_bytes() + grad_pool_->total_bytes()) : 0;
}

}  // namespace zoe::offload
