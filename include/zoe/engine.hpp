// zoe::Engine: the ZeRO engine a C++ trainer drives. The trainer registers its
// parameters (grouped into modules, the unit of all-gather), brackets each module's
// forward and backward with begin/end calls, and calls step() once per global batch.
// The engine decides where every byte of model state lives and moves it just in time.
//
// Initial values are not copied at registration: each parameter comes with a ParamInitializer
// the engine calls at the first forward, chunk by chunk (at most sub_group_size elements),
// for this rank's part only, writing every chunk straight to its home (device sub-group,
// host or NVMe optimizer tier, parameter shard). Host memory during construction is therefore
// bounded by one chunk and the tiers' staging buffers, so a model whose optimizer states
// exceed RAM can be built with its states on NVMe (the add_parameter overload taking a span
// keeps a copy of the values instead, as the caller already holds them).
//
// Parameter groups as torch and DeepSpeed users know them: each parameter trains with its own
// weight decay and lr factor, or is frozen (ParamOptions, at add_parameter or by a named
// ParamGroup whose matcher picks parameters by name); the trainer can reduce its own scalars
// over the ranks (all_reduce), look parameters up by name and read or write their values
// between steps.
//
// One Engine per data-parallel rank. All ranks must make the same calls in the same
// order (like collectives). An Engine is not thread-safe: one thread drives it.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zoe/config.hpp"
#include "zoe/device_kind.hpp"
#include "zoe/dtype.hpp"
#include "zoe/error.hpp"
#include "zoe/half.hpp"
#include "zoe/param_initializer.hpp"  // ParamInitializer
#include "zoe/ranks.hpp"              // RankContext and the rank factories

namespace zoe {

/// Handle of a registered parameter (index in registration order).
struct ParamId {
  std::uint32_t index = 0;
};
/// Handle of a registered module (index in registration order).
struct ModuleId {
  std::uint32_t index = 0;
};

/// How the optimizer treats one parameter: torch's per-group options (`AdamW([{"params": ...,
/// "weight_decay": 0.0}, ...])`, DeepSpeed's model_parameters groups) and `requires_grad_(False)`.
/// Given at registration (Engine::add_parameter) or to every parameter whose name matches
/// (Engine::add_param_group). Plain value.
struct ParamOptions {
  /// This parameter's weight decay (AdamW: decoupled, Adam: L2, as optimizer.type says); finite,
  /// >= 0. nullopt: optimizer.params.weight_decay. GPT-2 practice: 0 for biases and LayerNorm gains.
  std::optional<double> weight_decay;
  /// Factor on the learning rate for this parameter: its step uses lr * lr_scale, where lr is
  /// Engine::lr() (set_lr's or the scheduler's). torch's per-group "lr" is lr_scale = group lr /
  /// base lr (a scheduler scales every group by the same factor). Finite, >= 0. 1: the lr as is.
  double lr_scale = 1.0;
  /// Frozen (torch's requires_grad = False, the fine-tuning case): the parameter is gathered and
  /// used in forward and backward as any other, but it has no gradient buffer (its entry in
  /// ModuleTensors::grads has data == nullptr), no fp32 master weight, no exp_avg / exp_avg_sq,
  /// takes no part in gradient reduction, the norm or clipping, and never changes unless the
  /// trainer writes it (Engine::write_parameter). Its only bytes are its compute-dtype value
  /// (full at stages 0-2, the shard at stage 3, on offload_param's tier). weight_decay and
  /// lr_scale are ignored for it.
  bool frozen = false;
};

/// A named set of parameters sharing ParamOptions, chosen by name (torch users build these
/// from `named_parameters()`, e.g. no decay for names ending in ".bias").
struct ParamGroup {
  std::string name;                                   // for errors and reports; not empty
  std::function<bool(const std::string& param_name)> match;  // true: the parameter belongs here
  ParamOptions options;
};

/// How Engine::all_reduce combines one value over the ranks.
enum class ScalarReduce : std::uint8_t {
  sum,   // the fp64 sum, added in rank order 0, 1, ..., N-1
  mean,  // that sum divided by the world size (once, in fp64)
  max,   // the largest (NaN if any rank's is NaN)
  min,   // the smallest (NaN if any rank's is NaN)
};

/// How a module's forward is bracketed (Engine::add_module).
enum class ForwardMode : std::uint8_t {
  /// begin_forward/end_forward(m) run in each micro-batch before begin_backward(m) (default).
  separate,
  /// The trainer computes m's forward inside its backward scope from the parameters
  /// begin_backward returns (e.g. a fused loss head, saving stage 3 a gather):
  /// begin_backward(m) needs no forward of m, only one backward per micro-batch.
  in_backward,
};

/// A dense row-major tensor in device memory (host memory on the host device).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  /// Product of shape (1 for a scalar); no overflow check.
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

/// A module's parameters (full, gathered) in the order given to add_module; during
/// backward also its gradient buffers, same shapes and order, dtype = compute dtype: the
/// trainer ADDS its gradients into them (never overwrites: the buffer may hold other
/// backward passes' sums). At begin_backward a gradient view holds what was added to that
/// parameter and not yet reduced: zero for its first use in the micro-batch at stages 2-3
/// (each micro-batch's buffer is reduced after its last user's end_backward, then freed, or at
/// stage 3 kept and zeroed again for a module below stage3_param_persistence_threshold); for a
/// parameter shared by several modules (tied weights), the sum its earlier uses in the
/// micro-batch added; at stages 0-1 also the sum of the step's earlier micro-batches (one
/// persistent buffer, reduced once per step and zeroed by step()). A frozen parameter's
/// gradient view has data == nullptr (its shape and dtype are set): add nothing.
/// Valid until the matching end_forward / end_backward; keep no pointer past it (to reuse
/// forward weights in backward, take them from begin_backward's views). Otherwise:
///  - stage 3: the gathered parameter buffer is freed (or kept for a later module, then
///    freed); a stale view reads freed memory, typically another module's values later. A
///    module below stage3_param_persistence_threshold keeps it: a stale view reads the current
///    (after step(): updated) values;
///  - stages 2-3: the gradient buffer is freed after the reduction; writes through a stale
///    gradient view corrupt whatever reuses the memory, and are lost. A stage-3 module below
///    the persistence threshold keeps it (zeroed at its next begin_backward): a write through
///    a stale gradient view races with the reduction, undefined results, as at stages 0-1;
///  - stages 0-1: both stay allocated (the persistent full copies), so a stale parameter view
///    reads the current (after step(): updated) values, and a write through a stale
///    gradient view races with the reduction: undefined results.
/// zoe.debug_poison (docs/config.md) turns stale reads at stages 2-3 into NaN: every buffer
/// the engine frees is filled with NaN before end_forward / end_backward returns (the
/// persistent modules' buffers are freed too), and the host device keeps freed blocks poisoned
/// in a quarantine instead of reusing them.
struct ModuleTensors {
  std::vector<TensorView> params;
  std::vector<TensorView> grads;  // empty during forward
};

/// Where the trainer computes: ModuleTensors point into this device's memory, and on CUDA the
/// trainer must queue its kernels on `stream` (the engine orders its gathers, gradient
/// reductions and frees against that stream; work on another stream races with them).
struct ComputePlace {
  DeviceKind kind = DeviceKind::host;
  int ordinal = -1;        // CUDA device ordinal to make current (cudaSetDevice); -1 on the host
  void* stream = nullptr;  // the engine's compute stream as a cudaStream_t; nullptr on the host
};

/// Result of one optimizer step.
struct StepResult {
  std::int64_t step = 0;        // optimizer steps taken so far (skipped ones not counted)
  bool skipped = false;         // an inf/NaN gradient on any rank: nothing was updated
  double grad_norm = 0.0;       // global L2 norm of the unscaled, averaged gradient (a skipped
                                // step: inf or NaN, the norm of the gradients that skipped it)
  double clip_coef = 1.0;       // factor applied (<= 1) by gradient clipping
  double loss_scale = 1.0;      // fp16 loss scale used for this step (1 otherwise)
};

/// Bytes a rank holds, per tier, split into model states (compute params, gradients,
/// master weights, exp_avg, exp_avg_sq) and buffers (gather buffers, staging, buckets; at
/// stage 3 also the gathered parameters and gradient buffers that modules below
/// stage3_param_persistence_threshold keep between steps).
/// The *_model_states and *_buffers are what the rank holds now (at the call).
/// device_peak: the allocated peak, the most bytes of live device buffers (model states and
/// buffers, including those freed by the engine but waiting for queued work to pass them) at
/// any time since the engine's device was created, as torch.cuda.max_memory_allocated counts.
/// device_reserved_peak: the most the device's allocator held at any time, live blocks plus
/// the freed ones it keeps for reuse (torch.cuda.max_memory_reserved); >= device_peak. On
/// CUDA it is the default memory pool's, which other users of the pool on that GPU share.
/// host_pinned_peak: the most pinned staging memory (NVMe tiers' buffers, page-locked when
/// RLIMIT_MEMLOCK allows) this rank holds at any time; the pools are sized once, so it equals
/// their total. A snapshot taken by Engine::memory_report() (called, like every Engine call,
/// from the thread that drives the engine).
struct MemoryReport {
  std::int64_t device_model_states = 0, device_buffers = 0, device_peak = 0, device_reserved_peak = 0;
  std::int64_t host_model_states = 0, host_buffers = 0, host_pinned_peak = 0;
  std::int64_t nvme_model_states = 0;
};

/// Collective traffic of the last step (all micro-batches), as nccl-tests counts bus bytes:
/// all-gather and reduce-scatter send (Nd-1)/Nd of their full size, all-reduce 2(Nd-1)/Nd.
/// The *_calls count the engine's collectives over parameters and gradients by kind (one per
/// gradient bucket, per coalesced stage-3 gather, per stage 1-2 all-gather chunk); `calls` is
/// every collective of the step, the step agreement and the norm's fp64 all-reduce included.
struct TrafficReport {
  std::int64_t bytes_sent = 0;
  std::int64_t elements_sent = 0;
  std::int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0;
  std::int64_t all_gather_calls = 0, reduce_scatter_calls = 0, all_reduce_calls = 0;
  std::int64_t calls = 0;
};

/// The engine's lifecycle: *registering* (add_parameter, add_param_group and add_module are
/// allowed) -> *built* at the first call that needs the parameters (begin_forward,
/// begin_backward, step, gather_parameter / read_parameter / write_parameter, a checkpoint or
/// export call) -> *broken* when that build fails (an initializer throws, a tier cannot be
/// opened or written) or a checkpoint load fails after its verification. Errors that leave the
/// engine usable: every UsageError and ConfigError a call's own checks throw (the call rules, a
/// bad argument, a registration after the build; "no modules registered" and "parameter ... is
/// not used by any module" at the first forward too: register what is missing and call again),
/// and a checkpoint save or load that every rank refused together. Errors that make it
/// unusable: a failed build or load as above (every later call, registration included, throws
/// UsageError naming the original cause: destroy the Engine), and any other runtime error of a
/// call (I/O, a collective, OutOfMemoryError), after which the communicator is aborted so the
/// peers fail fast (RankFailedError on them).
class Engine {
 public:
  /// Validates `config` (ConfigError), then binds to the rank's device and communicator.
  Engine(const Config& config, RankContext rank);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Registers a parameter of `shape` (elements per dimension, row-major; numel = product,
  /// 0 allowed) whose fp32 initial value `init` produces on demand at the first forward (see
  /// ParamInitializer: this rank's elements only, in chunks of at most sub_group_size
  /// elements). The values are rounded to the compute dtype for the parameters and kept in
  /// fp32 as master weights. `init` is kept until then and released after.
  /// Throws UsageError after the first forward, for a negative dimension or an empty `init`,
  /// and for a name that is empty, not valid UTF-8 or holds a NUL byte (names become checkpoint
  /// and safetensors keys; the error names the parameter's index and shows the name escaped and
  /// cut to 64 characters, as every error quoting a name does). If `init` throws, the call that initialises the engine (the first begin_forward,
  /// begin_backward, step, gather_parameter or checkpoint call) throws Error naming the
  /// parameter and the elements requested, with the initializer's message
  /// (OutOfMemoryError if it threw std::bad_alloc or OutOfMemoryError); the Engine is then
  /// unusable (every later call throws UsageError) and should be destroyed.
  /// `init` is any callable as ParamInitializer (a lambda, a function, a ParamInitializer);
  /// the template only keeps `add_parameter(name, shape, {})` meaning an empty span.
  /// `options`: weight decay, lr factor, frozen (ParamOptions; default: the config's optimizer
  /// for a trainable parameter). Names are unique: a second parameter of the same name throws
  /// UsageError (find_parameter looks them up). Throws ConfigError for a weight_decay or lr_scale
  /// that is negative or not finite (key "param '<name>'.weight_decay" / ".lr_scale").
  template <class Init>
    requires std::is_invocable_r_v<void, Init&, std::int64_t, std::span<float>>
  ParamId add_parameter(const std::string& name, std::vector<std::int64_t> shape, Init&& init,
                        const ParamOptions& options = {}) {
    return add_parameter_from(name, std::move(shape), ParamInitializer(std::forward<Init>(init)), options);
  }
  /// Registers a parameter of `shape` with its full fp32 value `initial` (numel elements,
  /// identical on every rank). The engine copies `initial` now (numel x 4 bytes of host
  /// memory until the first forward) and initialises from the copy exactly as from an
  /// initializer returning those values. Throws UsageError after the first forward, for a
  /// negative dimension, a name as the other overload refuses, or if initial.size() != numel;
  /// OutOfMemoryError if the copy cannot be allocated.
  ParamId add_parameter(const std::string& name, std::vector<std::int64_t> shape,
                        std::span<const float> initial, const ParamOptions& options = {});
  /// Gives `group.options` to every parameter registered so far whose name `group.match`
  /// accepts (torch's optimizer param groups; parameters in no group keep the options they were
  /// registered with). Returns how many matched. Before the first forward. Throws UsageError
  /// after the first forward, for a name as add_parameter refuses (naming the group's index),
  /// an empty matcher, a group name used before, when no
  /// parameter matches (a typo in the matcher would otherwise train with the wrong decay), or
  /// when a matched parameter is already in another group (naming the parameter and both
  /// groups); ConfigError as add_parameter for the options; Error (or OutOfMemoryError) with the
  /// message of an exception the matcher throws. Nothing changes when it throws.
  int add_param_group(const ParamGroup& group);
  /// The options a parameter trains with (weight_decay resolved against the config). Throws
  /// UsageError for an unknown id.
  ParamOptions param_options(ParamId param) const;
  /// The parameter registered under `name`, or nullopt. Any time; no collective.
  std::optional<ParamId> find_parameter(const std::string& name) const;
  /// The parameter registered under `name`. Throws UsageError naming it when there is none
  /// (with the closest registered names).
  ParamId parameter(const std::string& name) const;
  /// Registration name and shape of a parameter. Throw UsageError for an unknown id.
  const std::string& parameter_name(ParamId param) const;
  const std::vector<std::int64_t>& parameter_shape(ParamId param) const;
  /// Parameters registered so far.
  std::size_t parameter_count() const;
  /// Groups parameters into a module, the unit of all-gather and of gradient reduction.
  /// Consecutive small modules (each under zoe.small_module_threshold elements of its own)
  /// share one unit, gathered and reduced together (docs/config.md). A parameter may appear
  /// in several modules (tied weights); its gradients add up.
  /// `mode`: whether the module's forward has its own begin/end calls (see ForwardMode).
  /// Throws UsageError after the first forward, for an unknown or repeated parameter, and for
  /// a name as add_parameter refuses (naming the module's index).
  ModuleId add_module(const std::string& name, const std::vector<ParamId>& params,
                      ForwardMode mode = ForwardMode::separate);

  // Call rules (docs/architecture.md, "Rules a trainer follows"). A call that breaks one
  // throws UsageError naming the module and the rule, before changing anything:
  //  - begin_*(m) needs m idle; end_forward / end_backward close the phase m is in;
  //  - begin_backward(m) needs a completed forward of m in the micro-batch, i.e. since m's
  //    last backward in this step (ForwardMode::in_backward: some module's forward since then);
  //    so each module runs one backward per micro-batch, at most
  //    gradient_accumulation_steps per step. Forwards without backward (evaluation) and a
  //    forward recomputed before its backward (activation checkpointing) are allowed.
  //  - every rank makes the same calls in the same order: step() checks it (a small
  //    all-gather) and throws UsageError on every rank naming the ranks that differ; the host
  //    communicators already throw CommError at the first collective that differs ("mismatched
  //    collectives", naming both ranks' modules). A module without gradients on one rank still
  //    runs its begin_backward/end_backward there, adding nothing (its gradient counts as zero).
  // After a CommError, TimeoutError, or the step's UsageError about ranks, destroy the Engine.

  /// Gathers the module's parameters (stage 3) and returns full views. Prefetches the next
  /// modules of the order recorded in the previous step. Throws UsageError for an unknown
  /// module or if it is not idle (see the call rules). The returned object is the engine's
  /// (one per module for forward, another for backward), refreshed in place by each
  /// begin_forward of the module (no allocation per call); the reference stays valid for the
  /// Engine's life. Its data pointers, like any copy of them, are valid only until
  /// end_forward (see ModuleTensors): a copy keeps the shapes, dtypes and old pointers, not
  /// the values (read_parameter / gather_parameter read those between steps).
  const ModuleTensors& begin_forward(ModuleId module);
  /// Ends the forward (stage 3: the gathered buffer may be freed). Throws UsageError unless
  /// the module is in forward.
  void end_forward(ModuleId module);
  /// Gathers again (stage 3) and returns params + gradient buffers (what they hold at this
  /// call: see ModuleTensors). Throws UsageError
  /// if the module is not idle, had no forward in this micro-batch (ForwardMode::separate),
  /// already ran its backward in this micro-batch, or ran gradient_accumulation_steps
  /// backward passes since the last step(). The returned object is the engine's backward
  /// views of the module (not begin_forward's object), refreshed by each begin_backward of the
  /// module; its pointers are valid until end_backward, as begin_forward's.
  const ModuleTensors& begin_backward(ModuleId module);
  /// Queues the gradient reduction of the module (bucketed, overlapping the rest of backward).
  /// Throws UsageError unless the module is in backward.
  void end_backward(ModuleId module);

  /// Applies the optimizer to the gradients accumulated over the
  /// `gradient_accumulation_steps` micro-batches since the last step (their mean over
  /// micro-batches and ranks). A collective. A module that ran no backward pass in the step
  /// (none at all: an evaluation-only forward, or a forgotten backward, which zoe cannot tell
  /// apart) adds a zero gradient: its groups are still updated (AdamW's momentum and weight
  /// decay move them, as DeepSpeed ZeRO does for parameters without gradients). Throws
  /// UsageError if a module ran some but not gradient_accumulation_steps backward passes or a
  /// module is still active, and, on every rank, if the ranks made
  /// different forward/backward calls this step (nothing is updated then); rethrows the
  /// CommError / TimeoutError of a failed collective of the step.
  StepResult step();

  /// Waits for all queued work (the asynchronous optimizer step included).
  void synchronize();

  /// Learning rate used by the following step() calls (e.g. a warmup/cosine schedule).
  /// Throws ConfigError if lr is negative or not finite, UsageError if the config has a
  /// scheduler (it drives the lr then: DeepSpeed's scheduler would overwrite it at its next step).
  void set_lr(double lr);
  /// The lr the next step() uses: the last set_lr's (optimizer.params.lr before any), or with
  /// a configured scheduler config().scheduler.lr_at(optimizer.params.lr, global_step()).
  double lr() const;
  /// The fp16 loss scale the trainer multiplies its loss by before backward (1 unless
  /// fp16 is enabled). Gradients handed to end_backward carry this factor.
  double loss_scale() const;
  /// Optimizer steps taken (skipped steps not counted).
  std::int64_t global_step() const;

  /// The full fp32 master value of a parameter (gathered from all ranks; a collective:
  /// every rank must call it). numel elements. read_parameter into a new vector.
  std::vector<float> gather_parameter(ParamId param);
  /// Reads the full value of `param` (numel fp32 elements, row-major) into `out` (host memory):
  /// its fp32 master weights (a frozen parameter: its compute-dtype value widened). Between
  /// steps: waits for a running update first (the delayed update is applied). A collective in
  /// every stage (every rank calls it, in the same order; stages 1-3 all-gather the shards),
  /// tagged, so a rank reading another parameter fails on the host communicators. Throws
  /// UsageError naming the parameter for an unknown id, out.size() != numel, or a module between
  /// begin_* and end_*.
  void read_parameter(ParamId param, std::span<float> out);
  /// Sets the full value of `param` to `value` (numel fp32 elements, identical on every rank),
  /// between steps: the fp32 master weights (its elements in this rank's optimizer range) and
  /// the compute-dtype parameters (`value` rounded to the compute dtype, as at initialisation)
  /// both take it; exp_avg / exp_avg_sq are kept (torch's `p.data.copy_(v)`). A frozen
  /// parameter has only the compute-dtype value. A collective in every stage: the ranks first
  /// compare a hash of `value` and, if any differs, every rank throws UsageError before anything
  /// is written. Throws UsageError naming the parameter for an unknown id, value.size() != numel,
  /// a non-finite element (its index), ranks that disagree, or a module between begin_* and
  /// end_*. Before the first forward it initialises the engine first (the value replaces the
  /// initializer's).
  void write_parameter(ParamId param, std::span<const float> value);

  /// The trainer's own scalars (loss, eval metrics) combined over all ranks, in place: values[i]
  /// on every rank becomes op over the ranks' values[i] (ScalarReduce: fp64, rank order, so every
  /// rank gets the same bits). A collective: every rank calls it with the same `name`, op and
  /// values.size(), in the same order as its other engine calls. It carries a tag (name, op),
  /// as the engine's own collectives do, so on the host communicators a rank that reduces
  /// another name, op or count at that position makes every rank throw CommError naming both
  /// sides; on NCCL the next step()'s agreement fails instead (the tag is in the step's
  /// fingerprint). Any time (also inside a module's scope); blocks until the result is there.
  /// Throws UsageError for an empty name; CommError / TimeoutError of a failed collective.
  void all_reduce(std::span<double> values, ScalarReduce op, const std::string& name);
  /// One value: all_reduce({value}).
  double all_reduce(double value, ScalarReduce op, const std::string& name);

  /// Exports every registered parameter's fp32 master value to a safetensors file at `path`
  /// (Hugging Face's format), rounded to `dtype` (f32: the master weights bit for bit; bf16 /
  /// fp16: rounded to nearest even, the same bits as the engine's compute-dtype copy). A
  /// collective: every rank must call it; each rank streams its own part of the states a
  /// sub-group at a time (stages 1-3: broadcast to the others in rank order; stage 0: rank
  /// 0 holds them all) and rank 0 writes the file, so host memory holds about two sub-groups
  /// (sub_group_size elements each) whatever the model's size. Tensor names are the names
  /// given to add_parameter, shapes theirs, dtype "F32" / "BF16" / "F16"; a parameter shared
  /// by several modules (tied weights) is stored once. Tensors are in the engine's storage
  /// order (by owning module in registration order, then the module's own parameters in its
  /// order). `metadata` becomes the header's "__metadata__" (Hugging Face's loaders expect
  /// {"format": "pt"}). The file appears only when complete (written to `path`.tmp, fsynced,
  /// renamed, the directory fsynced); a failure on any rank fails the call on every rank once
  /// they agree (no collective waits for a failed rank) and leaves `path` as it was: the
  /// failing rank throws its own error (IoError with ENOSPC for a full disk, naming the file),
  /// the others an Error naming the failed ranks. Throws UsageError (before any collective)
  /// while a module is between begin_* and end_*, and at stage 3 when
  /// zero_optimization.gather_16bit_weights_on_model_save is false (DeepSpeed's save_16bit_model
  /// then saves nothing), and for a metadata key or value that is not valid UTF-8. Frozen parameters (ParamOptions::frozen)
  /// are exported too: their compute-dtype values widened to fp32 (they have no master weights).
  void export_safetensors(const std::string& path, DType dtype = DType::f32,
                          const std::map<std::string, std::string>& metadata = {});

  /// The device this rank computes on and, on CUDA, the stream to compute on. Host: the views
  /// are host memory, valid for the calling thread as soon as begin_* returns.
  ComputePlace compute_place() const;
  MemoryReport memory_report() const;
  TrafficReport last_step_traffic() const;
  const Config& config() const;
  int rank() const;
  int world_size() const;

  /// Saves the model and optimizer states to `dir` (a collective): every rank streams its
  /// optimizer range (fp32 master weights, exp_avg, exp_avg_sq) one sub-group at a time into
  /// `dir`/rank<R>.zoe, rank 0 writes `dir`/manifest.json (model, ranges, step counters, lr,
  /// loss scaler, `client_state`, CRC32C checksums; docs/checkpoints.md). Written into
  /// `dir`.tmp, every file and directory fsynced, then renamed into place: at any moment of a
  /// crash `dir` or `dir`.old holds a complete checkpoint (load_checkpoint takes either).
  /// `client_state`: opaque text (e.g. the trainer's JSON) returned by load_checkpoint; valid
  /// UTF-8 (it is a JSON string in the manifest), else UsageError before anything is written.
  /// If any rank cannot write its file, every rank throws once they agree (no collective
  /// timeout) and the temp dir is removed: the failing rank its own error (a full disk:
  /// IoError ENOSPC, naming the file and the bytes it needs), the others an Error naming the
  /// failed ranks and their messages. Frozen parameters (ParamOptions::frozen) are stored as
  /// their compute-dtype values, each rank its shard (manifest version 3; without frozen
  /// parameters a save writes version 2, which zoe before frozen records reads).
  void save_checkpoint(const std::string& dir, const std::string& client_state = {});
  /// Loads what save_checkpoint wrote, at any world size, stage, sub_group_size and offload
  /// settings (the states are re-partitioned from the saved unpadded layout), or a checkpoint
  /// of format 1 (zoe before the manifest). A collective; returns the saved client_state.
  /// Reads `dir`, or `dir`.old if `dir` is incomplete (a crash in a save), the same on every
  /// rank. Before changing anything every rank verifies the manifest (checksum, the model's
  /// parameter names and shapes: UsageError for another model, naming the parameter; the
  /// saved groups may cut them otherwise, zoe.small_module_threshold) and every part of
  /// the rank files it will read (header, rank, save id, size, CRC32C: CorruptionError naming
  /// the file); if any rank fails every rank throws, naming the failed ranks and their errors,
  /// and the engine is unchanged. Host memory: one sub-group's states. Frozen parameters come
  /// back bit for bit (at another compute dtype: rounded to it, as an initializer's values
  /// are). Throws UsageError, before changing anything, when the engine's frozen parameters
  /// are not the checkpoint's, naming the first parameter that differs.
  std::string load_checkpoint(const std::string& dir);

 private:
  /// add_parameter with an initializer (see there).
  ParamId add_parameter_from(const std::string& name, std::vector<std::int64_t> shape, ParamInitializer init,
                             const ParamOptions& options);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// RAII: begin_forward in the constructor, end_forward in the destructor. If an exception
/// leaves the scope, end_forward is not called (it may throw, and would mask the exception):
/// the module stays in forward, so a trainer that catches the exception and goes on calls
/// end_forward(module) itself first. BackwardScope alike.
class ForwardScope {
 public:
  ForwardScope(Engine& e, ModuleId m) : e_(e), m_(m), t_(e.begin_forward(m)) {}
  ~ForwardScope() noexcept(false) {
    if (std::uncaught_exceptions() == uncaught_) e_.end_forward(m_);
  }
  const ModuleTensors& tensors() const { return t_; }

 private:
  Engine& e_;
  ModuleId m_;
  const ModuleTensors& t_;  // the engine's (see begin_forward)
  int uncaught_ = std::uncaught_exceptions();
};

/// RAII: begin_backward in the constructor, end_backward in the destructor.
class BackwardScope {
 public:
  BackwardScope(Engine& e, ModuleId m) : e_(e), m_(m), t_(e.begin_backward(m)) {}
  /// end_backward may throw; an exception already in flight is not masked.
  ~BackwardScope() noexcept(false) {
    if (std::uncaught_exceptions() == uncaught_) e_.end_backward(m_);
  }
  const ModuleTensors& tensors() const { return t_; }

 private:
  Engine& e_;
  ModuleId m_;
  const ModuleTensors& t_;  // the engine's (see begin_forward)
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace zoe
