// zoe's configuration: DeepSpeed's key names for what zoe does, as a C++ struct
// with defaults (a trainer needs no JSON), plus zoe's own keys under `zoe`.
// Every field is documented in docs/config.md (default, unit, meaning).
// Plain value type; thread-safe to copy and read.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "zoe/dtype.hpp"

namespace zoe {

/// Where a model state lives when offloaded: none = stays on the device, cpu = pinned host
/// memory, nvme = files under nvme_path (io_uring, O_DIRECT).
enum class OffloadDevice { none, cpu, nvme };

/// fp16{...}: dynamic loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", §3.2).
struct Fp16Config {
  bool enabled = false;
  /// 0 = dynamic scaling; > 0 = this static scale.
  double loss_scale = 0.0;
  /// Initial dynamic scale is 2^initial_scale_power.
  int initial_scale_power = 16;
  /// Steps without overflow before the scale doubles (growth interval).
  int loss_scale_window = 1000;
  /// Overflowing steps tolerated before the scale is halved.
  int hysteresis = 2;
  /// The scale never goes below this.
  double min_loss_scale = 1.0;

  bool operator==(const Fp16Config&) const = default;
};

/// bf16{enabled}: compute parameters and gradients in bfloat16 (no loss scaling needed).
struct Bf16Config {
  bool enabled = false;

  bool operator==(const Bf16Config&) const = default;
};

enum class OptimizerType { adam, adamw };

/// optimizer{type, params{...}}: Adam (Kingma & Ba 2015, Alg. 1; weight decay added to the
/// gradient, L2) or AdamW (Loshchilov & Hutter 2019, Alg. 2, decoupled weight decay), as
/// torch.optim.Adam / AdamW. As in DeepSpeed, JSON type "Adam" means AdamW unless
/// params.adam_w_mode is false (DeepSpeed's ADAM_W_MODE_DEFAULT is true); defaults are
/// DeepSpeed's FusedAdam / DeepSpeedCPUAdam defaults (weight_decay 0).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  /// Learning rate (>= 0).
  double lr = 1e-3;
  /// Decay rates of exp_avg and exp_avg_sq, each in [0, 1).
  std::array<double, 2> betas{0.9, 0.999};
  /// Added to sqrt(exp_avg_sq) (>= 0).
  double eps = 1e-8;
  /// Decoupled (AdamW) or L2 (Adam) weight decay (>= 0).
  double weight_decay = 0.0;
  /// false: Adam without the moment bias correction (DeepSpeed's bias_correction of FusedAdam /
  /// DeepSpeedCPUAdam): the step is lr * m / (sqrt(v) + eps) instead of
  /// lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). Same on the CPU and the
  /// device optimizer (one coefficient computation, kernels::adam_coeffs).
  bool bias_correction = true;

  bool operator==(const OptimizerConfig&) const = default;
};

enum class SchedulerType { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr };
/// How the warmup rises: log = log(i + 1) / log(warmup_num_steps), linear = i / warmup_num_steps.
enum class WarmupType { log, linear };

/// scheduler{type, params{...}}: DeepSpeed's learning-rate schedules WarmupLR, WarmupDecayLR and
/// WarmupCosineLR with DeepSpeed's parameter names, defaults and formulas
/// (deepspeed/runtime/lr_schedules.py), stepped by Engine::step() as DeepSpeed's engine steps
/// them: after each applied optimizer step, not after a skipped fp16 step.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  /// WarmupLR, WarmupDecayLR: the lr the warmup starts from (>= 0).
  double warmup_min_lr = 0.0;
  /// WarmupLR, WarmupDecayLR: the lr the warmup reaches (>= 0). Not given: WarmupLR uses
  /// optimizer.params.lr, WarmupDecayLR 0.001 (DeepSpeed's defaults).
  std::optional<double> warmup_max_lr;
  /// Steps of the warmup (>= 1; DeepSpeed then uses max(2, this)).
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  /// WarmupDecayLR, WarmupCosineLR: the step where the decay ends (required, >= 1; 0 = not given).
  std::int64_t total_num_steps = 0;
  /// WarmupCosineLR: the warmup starts at this fraction of optimizer.params.lr, in [0, 1].
  double warmup_min_ratio = 0.0;
  /// WarmupCosineLR: the cosine ends at this fraction of optimizer.params.lr, in [0, 1].
  double cos_min_ratio = 0.0001;

  /// The lr of the optimizer step that follows `applied_steps` applied (not skipped) steps,
  /// given optimizer.params.lr `optimizer_lr`: DeepSpeed's get_lr() at last_batch_iteration =
  /// applied_steps - 1 (its scheduler starts at -1 and steps after each applied step), so the
  /// first step uses warmup_min_lr (WarmupLR, WarmupDecayLR) or 0 (WarmupCosineLR). With type
  /// none: optimizer_lr. Pure, thread-safe, computed in double as DeepSpeed's Python does.
  double lr_at(double optimizer_lr, std::int64_t applied_steps) const;

  bool operator==(const SchedulerConfig&) const = default;
};

/// zero_optimization.offload_optimizer: where master weights, exp_avg, exp_avg_sq and the
/// fp32 gradient shards live.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  /// Directory for the NVMe tier's files (one file per rank and engine).
  std::string nvme_path = "/tmp/zoe_nvme";
  bool pin_memory = true;
  /// Pinned staging buffers for NVMe sub-group swaps (>= 2 for read-ahead/write-behind).
  int buffer_count = 4;
  /// Fraction (0..1] of sub-groups whose optimizer step runs on the host (rounded up to whole
  /// sub-groups; the last ones in forward order); the rest stay on the device optimizer.
  /// Only used with device cpu or nvme.
  double ratio = 1.0;

  bool operator==(const OffloadOptimizerConfig&) const = default;
};

/// zero_optimization.offload_param (stage 3 only): where parameter shards live.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path = "/tmp/zoe_nvme";
  bool pin_memory = true;
  int buffer_count = 5;
  /// Elements (not bytes, as in DeepSpeed) per pinned staging buffer of the NVMe tier.
  std::int64_t buffer_size = 100'000'000;
  /// Elements of parameter shards cached in host memory at most (NVMe tier).
  std::int64_t max_in_cpu = 1'000'000'000;

  bool operator==(const OffloadParamConfig&) const = default;
};

struct ZeroConfig {
  /// 0 = plain data parallel, 1 = optimizer states sharded, 2 = + gradients, 3 = + parameters.
  int stage = 0;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  /// Elements per gradient bucket (reduce-scatter / all-reduce unit).
  std::int64_t reduce_bucket_size = 500'000'000;
  /// Stages 1-2: the all-gather of a group's updated shard after the step is cut into pieces
  /// of about this many elements (DeepSpeed's all_gather_dp_groups); with ranks as threads,
  /// small groups' whole shards go together up to this many elements (see docs/config.md).
  std::int64_t allgather_bucket_size = 500'000'000;
  /// Elements per optimizer sub-group (unit of NVMe swapping and of the pipelined step).
  /// zoe's default is 1e7, not DeepSpeed's 1e9: with 1e9 a module's shard is one sub-group
  /// and its read, Adam and write-back cannot overlap (the key keeps DeepSpeed's meaning).
  std::int64_t sub_group_size = 10'000'000;
  /// Elements of parameters prefetched ahead of use (stage 3).
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  /// Modules with fewer elements than this stay gathered (stage 3).
  std::int64_t stage3_param_persistence_threshold = 100'000;
  /// Cap on gathered (live) parameter elements at any time (stage 3).
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  /// A module reused within this many elements of execution is not freed (stage 3).
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  /// DeepSpeed's gather_16bit_weights_on_model_save (JSON aliases
  /// stage3_gather_16bit_weights_on_model_save and the deprecated
  /// stage3_gather_fp16_weights_on_model_save): whether a stage-3 model may be consolidated
  /// into one file of whole parameters, which DeepSpeed's save_16bit_model does and zoe's
  /// Engine::export_safetensors does. false at stage 3: export_safetensors refuses (DeepSpeed
  /// saves nothing and returns False). zoe's default is true, not DeepSpeed's false: zoe's
  /// export streams one sub-group at a time, so it costs no model-sized host memory (the reason
  /// DeepSpeed leaves it off). No effect at stages 0-2, as in DeepSpeed.
  bool gather_16bit_weights_on_model_save = true;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;

  bool operator==(const ZeroConfig&) const = default;
};

/// aio{...}: the io_uring engine (names kept from DeepSpeed's libaio section).
struct AioConfig {
  /// Bytes per I/O request.
  std::int64_t block_size = 1 << 20;
  /// Requests in flight per ring.
  int queue_depth = 32;
  /// I/O threads (one ring each).
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;

  bool operator==(const AioConfig&) const = default;
};

/// zoe's own keys (JSON section "zoe").
struct ZoeConfig {
  /// Collective timeout in seconds; a rank that never arrives raises TimeoutError.
  double comm_timeout_s = 300.0;
  /// Threads for the CPU optimizer (0 = all hardware threads).
  int optimizer_threads = 0;
  /// Elements, >= 0. A run of consecutive modules (registration order), each owning fewer than
  /// min(this, stage3_param_persistence_threshold) trainable elements in total, shares one
  /// flat group while the run's total stays below that (FSDP's size-based wrapping): one
  /// gather, reduction, update and norm piece for all of them, so thousands of tiny modules
  /// cost little more than one module of their size. Same parameters as a group per module
  /// without gradient_clipping (the reported norm's last bits may differ). 0: every module a
  /// group of its own. docs/config.md.
  std::int64_t small_module_threshold = 100'000;
  /// Require O_DIRECT on the NVMe tier (error if the filesystem refuses it).
  bool require_direct_io = false;
  /// Pinned host memory budget in bytes for the offload tiers (0 = unlimited).
  std::int64_t pinned_budget_bytes = 0;
  /// Host memory (bytes, per rank) the NVMe tiers may use to keep what would otherwise move
  /// over NVMe every step, spent in the order that saves the most NVMe bytes per byte of host
  /// memory: first the stage-3 parameter shards of offload_param nvme (each read twice a step
  /// and written once: 3 bytes saved per byte), whole shards in group order while they fit;
  /// then the reduced gradients of sub-groups on offload_optimizer nvme (4 bytes per element in
  /// fp32; 2 with one micro-batch per step of bf16 / fp16 compute, kept as reduced; 2 bytes
  /// saved per byte), whole sub-groups in registration order while they fit (with
  /// zoe.update_in_backward and one micro-batch they need none: they wait in recycled buffers);
  /// then, once no gradient is on NVMe, the optimizer states of those sub-groups (master,
  /// exp_avg and exp_avg_sq, updated in place, fp32 masters: 2 bytes saved per byte), likewise
  /// whole sub-groups in order. What it keeps never touches NVMe; exact (the same values). 0
  /// (default): everything on NVMe, as DeepSpeed's ZeRO-Infinity (a tier the config names
  /// "nvme" stays on NVMe unless asked). kHostMemoryBudgetAuto (JSON "auto"): what the machine
  /// can spare, resolved once at Engine construction and logged: MemAvailable (capped by a
  /// cgroup v2 memory limit's room) less max(MemTotal / 10, 2 GiB), divided by the ranks on
  /// this machine (RankContext::local_world_size). Needs offload_optimizer nvme or (stage 3)
  /// offload_param nvme when > 0 or auto. Pageable memory, outside pinned_budget_bytes.
  std::int64_t host_memory_budget = 0;
  /// host_memory_budget's "auto": what the machine can spare (see above).
  static constexpr std::int64_t kHostMemoryBudgetAuto = -1;
  /// Storage of the CPU optimizer's exp_avg and exp_avg_sq: "fp32" (default, DeepSpeed's) or
  /// "bf16" (2 bytes each instead of 4: 8 bytes of states per element instead of 12, on
  /// whichever tier offload_optimizer names). The master weights stay fp32 and the AdamW math
  /// fp32; after each step exp_avg and exp_avg_sq are rounded to nearest, ties to even (as
  /// torch's .to(torch.bfloat16), so a run is deterministic and matches a torch reference). Not
  /// exact: the update differs from fp32 states by that rounding (reported with no accuracy
  /// change by DeepSpeed's CPU-offload bf16 states). Checkpoints hold fp32 states in every mode,
  /// so one mode's checkpoint loads into the other (bf16 -> fp32 exactly, fp32 -> bf16 rounded
  /// once). Needs offload_optimizer cpu or nvme with ratio 1 (the device's AdamW keeps fp32).
  OptimizerStateDType optimizer_state_dtype = OptimizerStateDType::fp32;
  /// Split master weights, exact: each fp32 master weight on the NVMe optimizer tier is stored
  /// as its low 16 bits (2 bytes instead of 4) plus one "rounded up" bit kept in the sign of its
  /// exp_avg_sq (never negative), and rebuilt bit for bit before the update from the bf16
  /// parameter shard, which is the master rounded to nearest even and so holds its high half
  /// (the bit settles the ties). The update then reads the shard (2 bytes per element; none for a
  /// shard zoe.host_memory_budget keeps in host memory, and none with zoe.update_in_backward,
  /// whose update takes the step's own read of it) and moves 2 + 2 bytes of master instead of
  /// 4 + 4: a stage-3 step on NVMe moves 32 bytes per parameter instead of 34, 26 with the update
  /// in backward (18 with bf16 optimizer states), 24 instead of 28 with every shard in host
  /// memory. Parameters, states, losses and checkpoints are bitwise those of fp32 masters
  /// (a checkpoint holds fp32 masters either way, so they load into one another). Needs stage 3
  /// with bf16 compute, offload_param "cpu" or "nvme" (the shard holds the high halves) and
  /// offload_optimizer "nvme" (with "cpu" the masters are in host memory already). false
  /// (default): fp32 masters, as DeepSpeed.
  bool split_master_weights = false;
  /// Overlap the CPU optimizer step with the next forward (results unchanged).
  bool overlap_step = true;
  /// ZeRO-Offload's one-step-delayed parameter update (Ren et al. 2021, §4.2): step k+1's
  /// forward/backward use the parameters of update k-1 (changes the math; off by default).
  /// Needs offload_optimizer cpu/nvme; not with offload_param.
  bool delayed_update = false;
  /// The optimizer step in backward, exact (PyTorch's optimizer-in-backward hooks, LOMO's
  /// fused update, with the states offloaded): a group's CPU update starts as soon as the
  /// step's last micro-batch has reduced its gradient, so the update's NVMe reads and writes
  /// overlap the rest of backward as well as the next forward; parameters and states are
  /// bitwise those of the plain step. Needs what lets a group's update go before the others'
  /// gradients exist: offload_optimizer cpu/nvme with ratio 1, stage 2 or 3 (stage 1 reduces at
  /// step()), gradient_clipping 0 and no fp16 (both need the global norm first); not with
  /// delayed_update. An inf/NaN gradient cannot skip the step (some groups are already
  /// updated): step() throws instead. Between the last backward and step(), set_lr,
  /// checkpoints, parameter reads/writes, the export and a forward of an updated module throw
  /// UsageError.
  bool update_in_backward = false;
  /// Debugging stale views (off by default; costs speed and memory, never changes results):
  /// buffers the engine frees (stage-3 gathered parameters, stage-2/3 gradient buffers) are
  /// filled with NaN as they are released, every released stage-3 gather is freed (persistent
  /// and soon-reused groups too), and on the host device freed blocks are poisoned and held
  /// in a quarantine instead of being reused, so a TensorView read past its scope reads NaN.
  bool debug_poison = false;

  bool operator==(const ZoeConfig&) const = default;
};

/// The whole configuration. Validated by validate() (and by Engine's constructor).
struct Config {
  /// Global batch = micro batch * accumulation steps * world size; 0 = not given. Only
  /// checked (check_batch_size), never used to derive the other two.
  int train_batch_size = 0;
  int train_micro_batch_size_per_gpu = 1;
  int gradient_accumulation_steps = 1;
  /// Max global L2 norm of the gradients; 0 = no clipping.
  double gradient_clipping = 0.0;
  /// DeepSpeed's prescale_gradients: true divides each gradient by the world size before its
  /// reduction (a smaller sum, against fp16 overflow) instead of after it. Same mean, other
  /// rounding. Takes precedence over gradient_predivide_factor, as in DeepSpeed.
  bool prescale_gradients = false;
  /// DeepSpeed's gradient_predivide_factor f (with prescale_gradients false): each gradient is
  /// divided by f before its reduction and the sum by world / f after it. 1.0 = all after. > 0.
  double gradient_predivide_factor = 1.0;
  /// steps_per_print (DeepSpeed's progress report): every this many Engine::step() calls
  /// (skipped fp16 steps included, as DeepSpeed's global_steps), rank 0 logs the step count,
  /// skipped steps, lr, betas, loss scale and gradient norm at info level; 0 = never
  /// (DeepSpeed's default, None). >= 0.
  int steps_per_print = 0;
  /// wall_clock_breakdown: after every step() rank 0 logs at info level the milliseconds since
  /// the previous step() returned (the trainer's forward and backward with the engine's calls;
  /// for the first step, since the Engine was built) and those of the step() call itself.
  bool wall_clock_breakdown = false;
  /// dump_state: rank 0 logs the whole configuration (to_json) at info level when an Engine is
  /// built, as DeepSpeed prints its configuration.
  bool dump_state = false;
  /// memory_breakdown: after every step() rank 0 logs Engine::memory_report() at info level.
  bool memory_breakdown = false;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ZoeConfig zoe;

  /// Compute (parameter) dtype: f16 if fp16.enabled, bf16 if bf16.enabled, else f32.
  DType compute_dtype() const {
    return fp16.enabled ? DType::f16 : bf16.enabled ? DType::bf16 : DType::f32;
  }

  bool operator==(const Config&) const = default;

  /// Throws one ConfigError listing every failed check (ConfigError::problems(): each key and
  /// its value, e.g. stage 5, both fp16 and bf16 enabled, betas outside [0,1), negative
  /// sizes, offload_param without stage 3, offload_optimizer.ratio outside (0, 1], a
  /// scheduler without total_num_steps); key() is the first's.
  void validate() const;

  /// Throws ConfigError("train_batch_size") if it is given (> 0) and differs from
  /// train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size, as DeepSpeed.
  void check_batch_size(int world_size) const;

  /// The trainer's values for the keys a file gives as "auto", with Hugging Face's meaning
  /// (transformers' HfTrainerDeepSpeedConfig: the value comes from the trainer's arguments, not
  /// from a default). Each value left empty makes an "auto" key it fills an error naming the key
  /// and this field. Units and ranges are those of the keys filled.
  struct AutoValues {
    /// train_micro_batch_size_per_gpu (HF: per_device_train_batch_size).
    std::optional<int> micro_batch_size_per_gpu;
    /// gradient_accumulation_steps (HF: gradient_accumulation_steps).
    std::optional<int> gradient_accumulation_steps;
    /// With the two above: train_batch_size = world_size * micro batch * accumulation steps.
    std::optional<int> world_size;
    /// gradient_clipping (HF: max_grad_norm).
    std::optional<double> max_grad_norm;
    /// optimizer.params.lr and scheduler.params.warmup_max_lr (HF: learning_rate).
    std::optional<double> lr;
    /// optimizer.params.betas (HF: [adam_beta1, adam_beta2]).
    std::optional<std::array<double, 2>> betas;
    /// optimizer.params.eps (HF: adam_epsilon).
    std::optional<double> eps;
    /// optimizer.params.weight_decay (HF: weight_decay).
    std::optional<double> weight_decay;
    /// fp16.enabled, bf16.enabled (HF: fp16, bf16).
    std::optional<bool> fp16, bf16;
    /// scheduler.params.warmup_num_steps (HF: get_warmup_steps(num_training_steps)).
    std::optional<std::int64_t> warmup_steps;
    /// scheduler.params.total_num_steps (HF: num_training_steps).
    std::optional<std::int64_t> total_steps;
    /// The model's hidden size: zero_optimization.reduce_bucket_size = h * h,
    /// stage3_prefetch_bucket_size = int(0.9 * h * h), stage3_param_persistence_threshold = 10 * h.
    std::optional<std::int64_t> hidden_size;
    /// zero_optimization.stage3_gather_16bit_weights_on_model_save (and its other spellings):
    /// whether the trainer will consolidate a stage-3 model into one file (accelerate:
    /// DeepSpeedPlugin.zero3_save_16bit_model, default False; zoe-gpt: --export given).
    std::optional<bool> gather_16bit_weights_on_model_save;
  };

  /// Parse DeepSpeed-style JSON text, then validate(). Unknown keys, DeepSpeed keys zoe does
  /// not implement, wrong types and bad values throw ConfigError with the JSON path, the value
  /// and a "did you mean" for near misses; one ConfigError lists every problem of the text.
  /// Absent keys keep their defaults. "auto" (where Hugging Face fills it) takes the trainer's
  /// value from `auto_values`, read and checked as if the file held it (scheduler's
  /// warmup_min_lr: 0, as Hugging Face writes); an "auto" whose value is not given is a
  /// problem naming the key and the AutoValues field. Thread-safe (no shared state).
  static Config from_json(const std::string& json_text, const AutoValues& auto_values = {});
  /// Read and parse a JSON file. Throws SystemError if it cannot be read, CorruptionError if it
  /// is not a regular file (a FIFO, /dev/zero, a directory) or is over 64 MiB, else as from_json
  /// (the message then also names the file).
  static Config from_json_file(const std::string& path, const AutoValues& auto_values = {});
  /// Serialise to DeepSpeed-style JSON (round-trips through from_json).
  std::string to_json() const;
};

}  // namespace zoe
