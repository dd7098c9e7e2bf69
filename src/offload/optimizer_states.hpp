// Where a rank's optimizer states live: fp32 master weights, exp_avg and exp_avg_sq of
// each sub-group, in host memory (offload_optimizer.device = cpu) or on NVMe (= nvme,
// ZeRO-Infinity). A sub-group's three arrays are stored together ([master | exp_avg |
// exp_avg_sq]: numel floats, then two arrays of numel elements of the state dtype, fp32 or
// bf16 (zoe.optimizer_state_dtype): 12 or 8 bytes per element) so one swap moves them.
// Whatever the state dtype, the checkpoint view (read_all / write_all) is fp32: bf16 states
// are widened exactly on the way out and rounded to nearest even on the way in.
//
// Split master weights (OptimizerStatesOptions::split_master, zoe.split_master_weights; nvme
// tier only): the stored layout is [exp_avg | exp_avg_sq | master low halves (numel uint16)],
// 2 bytes of master per element instead of 4, each master's "rounded up" bit in the sign bit of
// its exp_avg_sq, which is never negative (src/optim/split_master.hpp says why that is exact). The high halves are the bf16 parameter
// shard, which the caller owns (the parameter tier): for_each hands the callback an fp32 master
// scratch array next to the stored bytes (SubGroupStates::master, undefined on entry) with the
// stored halves; the callback joins the master from the shard's current values before the
// update and splits it against the new ones after it. read_master / read_all take the high
// halves; write_initial / write_all compute them (kernels::f32_to_bf16, the rounding every
// parameter write of the engine uses).
//
// for_each() is the optimizer pipeline over sub-groups: on NVMe, reads of k+1, k+2, ... and
// the write-back of k-1 run while the caller computes k (read-ahead as deep as the free
// buffers allow and write-behind, through `buffer_count` pinned staging buffers of the largest
// sub-group's size; buffer_count >= 3 gives full overlap, 2 serialises write-back and
// read-ahead). The update pipeline passes a whole step's sub-groups in one call, so the
// read-ahead crosses group boundaries.
// Host memory then holds only those buffers, however large the model.
//
// Construction (nothing of the states is ever in host memory on the nvme tier): add(numel)
// registers each sub-group's size, finalize() opens the tier, write_initial(id, master) then
// writes each sub-group's initial states through the pinned staging buffers (write-behind).
//
// Gradients: each sub-group also keeps its gradient (ZeRO-Offload's fp32 gradient partition):
// add_grad() writes or accumulates the reduced shard as soon as it is ready, in host memory
// (cpu) or in its own NVMe tensor through a pinned gradient buffer (nvme), and for_each hands
// it to the optimizer with the states. It is kept in fp32 (grad_dtype f32: micro-batches
// accumulate in it) or, when a step has one micro-batch of 16-bit compute, as the reduced shard
// arrives (grad_dtype bf16 / fp16: 2 bytes instead of 4, exact: the optimizer widens it to the
// very fp32 value the cast would have stored, and its sum of squares is the same). add_grad's last call of a step also
// records the gradient's sum of squares and finiteness, so the global norm needs no extra pass.
// The gradient add is optim::CpuAdam::add_grad (cast or fp32 add, sum of squares and finiteness
// in one pass over the CpuAdam's threads; bitwise what host_ops cast / accumulate and
// sum_squares give): the engine hands the tier its own CpuAdam (OptimizerStatesOptions::adam),
// so the gradient add and the update share one oneTBB arena of zoe.optimizer_threads.
//
// Where a gradient waits (GradientHome): in a host buffer of its own (the cpu tier; on the nvme
// tier the sub-groups zoe.host_memory_budget covers, whole, in id order), in its NVMe tensor
// (the rest), or, once recycle_gradient_slots() asked for it (zoe.update_in_backward), in one
// of a few recycled host buffers from the step's first add_grad until for_each has updated it:
// then no gradient touches NVMe and host memory holds only those buffers.
//
// Where a sub-group's states live (StatesHome): host memory (the cpu tier; on the nvme tier the
// sub-groups whose states what is left of host_budget covers once no gradient is on NVMe,
// whole, in id order) or NVMe. States in host memory are updated in place, never staged, and
// keep fp32 masters (split masters save NVMe bytes only).
//
// Units: elements (floats) unless named bytes. Thread-safety: one thread drives an
// OptimizerStates, except that add_grad / zero_grad may run on a second thread (the gradient
// sink's I/O worker) while the driving thread runs for_each on other sub-groups: add_grad
// touches only that sub-group's gradient and sums, its own gradient buffer pool and the NvmeStore
// (callable from any thread), and CpuAdam::add_grad may run beside CpuAdam::step (cpu_adam.hpp).
// Its I/O runs on the store's io_uring threads.
// Errors: IoError / CorruptionError from the NVMe store (naming file, offset, tensor),
// OutOfMemoryError from the pinned pool.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "src/common/aligned_buffer.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/pinned_pool.hpp"
#include "src/optim/cpu_adam.hpp"
#include "zoe/config.hpp"
#include "zoe/dtype.hpp"

namespace zoe::offload {

struct OptimizerStatesOptions {
  OffloadDevice device = OffloadDevice::cpu;  // cpu or nvme
  std::string nvme_path;
  int rank = 0;
  int buffer_count = 4;
  bool pin_memory = true;
  /// The rank's zoe.pinned_budget_bytes, shared with its other pinned consumers (null: unbudgeted).
  std::shared_ptr<PinnedBudget> pinned_budget;
  AioConfig aio;
  bool require_direct_io = false;
  /// Registers host memory with the device so copies from / to it are the pinned kind
  /// (e.g. Device::register_host_memory, cudaHostRegister); null: not registered.
  std::function<bool(void*, std::size_t)> register_fn;
  std::function<void(void*)> unregister_fn;
  /// Runs add_grad's arithmetic (CpuAdam::add_grad on its threads); must outlive the
  /// OptimizerStates. Null: the OptimizerStates makes its own CpuAdam of one thread (tests,
  /// benches; same results bitwise, cpu_adam.hpp).
  optim::CpuAdam* adam = nullptr;
  /// nvme tier: bytes of host memory (pageable) for what would otherwise move over NVMe every
  /// step (zoe.host_memory_budget), in the order that saves the most per byte: first the
  /// gradients (whole sub-groups, in id order, while they fit; none needed with recycled
  /// buffers), then, once no gradient is on NVMe, the states (likewise; master, exp_avg and
  /// exp_avg_sq, fp32 masters). What it keeps never touches NVMe. 0: everything on NVMe.
  /// Ignored by the cpu tier (all in host memory).
  std::int64_t host_budget = 0;
  /// Storage of exp_avg and exp_avg_sq (zoe.optimizer_state_dtype); master weights are fp32.
  OptimizerStateDType state_dtype = OptimizerStateDType::fp32;
  /// Storage of the gradient: f32, or the compute dtype (bf16 / fp16) when every step has
  /// exactly one micro-batch: add_grad then takes shards of that dtype with first = last = true
  /// only (header comment).
  DType grad_dtype = DType::f32;
  /// Store the master weights split (header comment): nvme tier only, for bf16 parameters kept
  /// by a parameter tier; false: fp32 masters.
  bool split_master = false;
};

/// The arrays of one sub-group, valid inside a for_each callback: numel elements each.
struct SubGroupStates {
  int id;
  std::int64_t numel;
  /// fp32 master weights; with split masters a scratch array, undefined on entry: join it from
  /// master_low, exp_avg_sq's sign bits and the parameter shard before use, split it after.
  float* master;
  void* exp_avg;     // float (fp32 states) or uint16 bf16 bits (bf16 states)
  void* exp_avg_sq;  // likewise
  OptimizerStateDType state_dtype;
  const void* grad;  // the step's gradient (see add_grad), numel elements of grad_dtype
  DType grad_dtype;
  /// Split master weights only (else null): the stored low halves (numel uint16); the
  /// rounded-up bits are exp_avg_sq's sign bits (src/optim/split_master.hpp).
  std::uint16_t* master_low = nullptr;
  bool split_master() const { return master_low != nullptr; }
  /// Bytes of exp_avg and exp_avg_sq together (contiguous from exp_avg).
  std::size_t moment_bytes() const { return static_cast<std::size_t>(numel) * 2 * optimizer_state_dtype_size(state_dtype); }
};

/// Host-access check: every pointer argument below must be host memory. write_initial,
/// add_grad, read_master, read_all and write_all throw UsageError naming the call when it
/// lies in the memory of a device host code may not touch (check_host_accessible_in_process,
/// src/device/host_access.hpp: the discrete host device's arena, CUDA device memory).
class OptimizerStates {
 public:
  explicit OptimizerStates(const OptimizerStatesOptions& options);
  ~OptimizerStates();

  /// Registers a sub-group of `numel` elements (sizes only: its values come from
  /// write_initial). Before finalize(). Returns its id (0, 1, ...). cpu tier: allocates its
  /// host arrays (16 bytes/element); nvme tier: nothing in host memory.
  int add(std::int64_t numel);
  /// nvme tier, before finalize(): every gradient waits in one of `count` recycled host
  /// buffers (the largest sub-group's gradient each) from the step's first add_grad until
  /// for_each has updated its sub-group, and never touches NVMe; add_grad waits for a free
  /// one. The caller guarantees progress: count must cover the sub-groups of any one update
  /// wave's readiness (the engine: the most offloaded sub-groups of one group, plus one), since
  /// a wave waits for all of its gradients before its update frees their buffers (at most one
  /// per sub-group). cpu tier: no effect (every gradient is in host memory). Throws UsageError
  /// after finalize() or for count < 1.
  void recycle_gradient_slots(int count);
  /// Before finalize(): replaces OptimizerStatesOptions::host_budget (the engine gives the
  /// gradients and states what the parameter shards left of zoe.host_memory_budget). Throws
  /// UsageError after finalize() or for a negative budget.
  void set_host_budget(std::int64_t bytes);
  /// Finishes registration: nvme tier: allocates the pinned staging buffers, opens the file
  /// and registers every sub-group's tensors. Writes nothing.
  void finalize();
  /// Sets sub-group `id`'s initial states: master = `master` (numel(id) floats, host
  /// memory, copied before the call returns), exp_avg = exp_avg_sq = fp32 gradient = 0.
  /// After finalize(), for every sub-group before the first for_each, add_grad or read
  /// (a second call overwrites the first). nvme tier: written through a pinned staging buffer; up to buffer_count writes
  /// stay in flight (write-behind) until finish_initial() or the next call needing the
  /// buffers. Throws UsageError (wrong size, before finalize), IoError.
  void write_initial(int id, std::span<const float> master);
  /// Waits for the writes write_initial left in flight; rethrows the first I/O error.
  void finish_initial();

  /// Calls fn on each sub-group of `ids` in order with its states loaded; changes are kept
  /// (written back). Rethrows the first error of fn or of the I/O, after draining I/O.
  void for_each(const std::vector<int>& ids, const std::function<void(const SubGroupStates&)>& fn);
  /// Gradient of sub-group `id` from a reduced shard slice: numel elements of `dtype` at `src`
  /// (host memory), cast to fp32 (first micro-batch of a step) or added in fp32 (later ones);
  /// with a 16-bit grad_dtype (one micro-batch) copied as it is (dtype must be grad_dtype and
  /// first = last = true, else UsageError),
  /// exactly as Device::cast / Device::accumulate (bitwise; one exception, cpu_adam.hpp: an fp16
  /// signalling NaN arrives as a quiet NaN on the AVX-512 path). On the `last` micro-batch it also records
  /// grad_sum_squares / grad_finite. NVMe: read-modify-write through the gradient buffer.
  /// Runs in one pass on the CpuAdam of OptimizerStatesOptions::adam (its arena's threads).
  /// One thread at a time; may run beside for_each only on a sub-group for_each does not visit
  /// (the engine orders them by the sub-group's previous update, GroupDone).
  void add_grad(int id, const void* src, DType dtype, bool first, bool last);
  /// Gives back the recycled gradient buffers of sub-groups `ids` that an update did not consume
  /// (it failed); their gradients are gone (a later for_each of one of them, before its next
  /// add_grad or zero_grad, throws). Other homes are untouched. Call it from the thread that
  /// would have run for_each on them, after their add_grad.
  void discard_gradients(const std::vector<int>& ids);
  /// Sets sub-group `id`'s gradient to zero (a step in which no backward reached it).
  void zero_grad(int id);
  /// Sum of squares (fp64, in kernels::kSumSquaresChunk's order) and finiteness of the gradient
  /// recorded by the last add_grad(..., last = true) or zero_grad.
  double grad_sum_squares(int id) const { return grad_sum_squares_[id]; }
  bool grad_finite(int id) const { return grad_finite_[id]; }

  /// Copies sub-group `id`'s master weights (numel floats) into dst. Split masters: `high` is
  /// the sub-group's bf16 parameters (numel uint16, the high halves); required then (else
  /// UsageError), ignored otherwise.
  void read_master(int id, float* dst, const std::uint16_t* high = nullptr);
  /// Copies all three arrays of sub-group `id` ([master | exp_avg | exp_avg_sq], 3 * numel
  /// floats, fp32 whatever the state dtype) into / from `data` (checkpoints). bf16 states:
  /// read_all widens them (exact), write_all rounds them to nearest even (fp32 values that are
  /// bf16 values, as a bf16-state checkpoint's, come back bit for bit). Split masters: read_all
  /// takes `high` as read_master; write_all splits against the masters' own bf16 rounding,
  /// which the caller then stores as the parameters.
  void read_all(int id, float* data, const std::uint16_t* high = nullptr);
  void write_all(int id, const float* data);

  std::int64_t numel(int id) const { return numels_[id]; }
  std::size_t count() const { return numels_.size(); }
  /// Storage of exp_avg and exp_avg_sq.
  OptimizerStateDType state_dtype() const { return options_.state_dtype; }
  /// Whether the master weights are stored split (OptimizerStatesOptions::split_master): of any
  /// sub-group, or of sub-group `id` (its states on NVMe; after finalize()).
  bool split_master() const { return options_.split_master; }
  bool split_master(int id) const { return options_.split_master && states_home_[id] == StatesHome::nvme; }
  /// Whether sub-group `id`'s states live in host memory (the cpu tier, or host_budget's).
  bool states_in_host(int id) const { return states_home_[id] == StatesHome::host; }
  /// Bytes of states (master, exp_avg, exp_avg_sq and the fp32 gradient) held in host memory
  /// (cpu tier) and on NVMe (nvme tier).
  std::int64_t host_state_bytes() const;
  std::int64_t nvme_state_bytes() const;
  /// Bytes of pinned staging buffers (nvme tier): buffer_count state buffers plus one gradient buffer.
  std::int64_t staging_bytes() const;
  DType grad_dtype() const { return options_.grad_dtype; }
  /// Whether sub-group `id`'s gradient never touches NVMe (the cpu tier; on the nvme tier the
  /// sub-groups host_budget covers, or all with recycled buffers). After finalize().
  bool gradient_in_host(int id) const { return home_[id] != GradientHome::nvme; }
  /// Recycled host buffers for gradients (0 unless recycle_gradient_slots()).
  int gradient_slots() const { return static_cast<int>(slots_.size()); }

 private:
  /// Waits for the initial writes; throws UsageError if a sub-group was never written.
  void check_initialised();
  std::string name(int id) const { return "optim.sg" + std::to_string(id); }
  std::string grad_name(int id) const { return "optim.grad" + std::to_string(id); }
  /// Stored bytes of sub-group id: master (4, or split 2: split_master(id)), exp_avg and
  /// exp_avg_sq (4 or 2 each) per element.
  std::size_t bytes(int id) const;
  /// Where a staging buffer holds the fp32 master scratch of split masters: after the stored
  /// bytes, 64-byte aligned (bytes; unused without split masters).
  std::size_t scratch_offset(int id) const { return (std::max<std::size_t>(bytes(id), 1) + 63) / 64 * 64; }
  /// The stored bytes' end in a staging buffer: with split masters, the scratch's end.
  std::size_t staged_end(int id) const {
    return split_master(id) ? scratch_offset(id) + static_cast<std::size_t>(numels_[id]) * sizeof(float)
                            : std::max<std::size_t>(bytes(id), 1);
  }
  /// The view of sub-group id's states in a buffer of the stored layout at `base` (the master
  /// scratch, with split masters, at base + scratch_offset(id)).
  SubGroupStates view(int id, void* base, const void* grad) const;
  /// Copies sub-group id's states from `src` to `dst`: the stored layout to the fp32 checkpoint
  /// view (to_fp32: bf16 moments widened, split masters joined with `high`) or back (bf16
  /// moments rounded to nearest even, masters split against their bf16 rounding). With
  /// `initial_master` (write_initial: numel floats), src is unused and the moments are zeros.
  void convert_states(int id, const void* src, void* dst, bool to_fp32, const std::uint16_t* high = nullptr,
                      const float* initial_master = nullptr) const;
  std::size_t grad_bytes(int id) const {
    return std::max<std::size_t>(static_cast<std::size_t>(numels_[id]) * dtype_size(options_.grad_dtype), 1);
  }
  /// Where the gradient sits in a staging buffer: after the states, page-aligned (bytes).
  std::size_t grad_offset(int id) const { return (staged_end(id) + 4095) / 4096 * 4096; }

  /// Where sub-group id's gradient is (header comment). host and nvme are fixed at finalize();
  /// a recycled sub-group moves empty -> in_slot (first add_grad of a step) or zeros
  /// (zero_grad) -> empty (its update in for_each has read it).
  enum class GradientHome : std::uint8_t { host, nvme, empty, in_slot, zeros };
  /// Where sub-group id's states are (header comment); fixed at finalize().
  enum class StatesHome : std::uint8_t { host, nvme };
  /// Calls fn with sub-group id's stored bytes (host memory, or read from NVMe into a staging
  /// buffer); read_master and read_all.
  void with_stored(int id, const std::function<void(const void*)>& fn);
  /// finalize() on the nvme tier: places the gradients and then the states in host memory
  /// under host_budget (header comment) and registers the NVMe tensors of the rest.
  void place_in_host_memory(std::size_t largest_grad);
  /// Recycled buffers: takes a free one for sub-group id (waits for one), gives it back.
  void take_slot(int id);
  void give_back_slot(int id);
  /// The gradient for_each hands the update of sub-group id (null: on NVMe, in the staging buffer).
  const void* host_gradient(int id) const;

  OptimizerStatesOptions options_;
  std::unique_ptr<optim::CpuAdam> own_adam_;  // when options_.adam is null
  optim::CpuAdam* adam_;                      // add_grad's arithmetic
  std::vector<std::int64_t> numels_;
  /// An initial-state write in flight (nvme tier): its staging buffer returns when it is done.
  struct InitialWrite {
    PinnedBuffer buffer;
    SwapHandle states, grad;
  };

  std::vector<AlignedBuffer> host_;  // states in host memory ([master | exp_avg | exp_avg_sq]; StatesHome::host)
  std::vector<AlignedBuffer> grads_;  // gradients in host memory (cpu tier: all; nvme: host_budget's)
  std::vector<GradientHome> home_;
  std::vector<StatesHome> states_home_;
  // Recycled gradient buffers (recycle_gradient_slots): the buffers, the free ones, which one
  // each sub-group holds (-1: none), and a zero gradient of the largest sub-group for zeros.
  std::vector<AlignedBuffer> slots_;
  std::vector<int> free_slots_;
  std::vector<int> slot_of_;
  AlignedBuffer zero_gradient_;
  int requested_slots_ = 0;
  std::mutex slot_mutex_;
  std::condition_variable slot_freed_;
  std::vector<double> grad_sum_squares_;
  std::vector<char> grad_finite_;
  std::unique_ptr<PinnedPool> pool_, grad_pool_;
  std::deque<InitialWrite> initial_writes_;  // destroyed after store_ (which waits for its I/O)
  std::unique_ptr<NvmeStore> store_;
  std::vector<char> initialised_;    // per sub-group: write_initial done
  std::size_t uninitialised_ = 0;    // sub-groups still without initial states
  bool finalized_ = false;
};

}  // namespace zoe::offload
