// Config::validate: ranges of single fields, then checks across fields, all of them: one
// ConfigError lists every failed check. Each names the JSON path of the field it blames and
// the value found there.
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "src/common/check.hpp"
#include "src/config/config_check.hpp"
#include "zoe/config.hpp"

namespace zoe {
namespace config_detail {
namespace {
constexpr double kMaxCommTimeoutS = 30.0 * 86400.0;
// Pinned buffers of one offload tier: far above DeepSpeed's defaults (4 and 5), and small
// enough that count x size x 4 bytes cannot overflow.
constexpr std::int64_t kMaxBufferCount = 1024;
// Elements of one parameter-offload buffer: 2^40 (4 TiB of fp32), above any layer.
constexpr std::int64_t kMaxParamBufferElements = std::int64_t{1} << 40;
// The CPU optimizer's threads: oneTBB makes one per slot, so a huge count is an allocation
// failure or a crash, not a faster step.
constexpr std::int64_t kMaxOptimizerThreads = 1024;
// The largest aio.block_size the NVMe store takes (one io_uring request's length).
constexpr std::int64_t kMaxAioBlockSize = std::int64_t{1} << 30;

// Collects the failed checks; each names its key (and, for a cross-field check, the other
// keys it read).
class Checker {
 public:
  template <class... Args>
  void fail(const char* path, std::vector<std::string> reads, const Args&... reason) {
    out.push_back({path, ::zoe::detail::concat(reason...), std::move(reads)});
  }
  void at_least(const char* path, std::int64_t value, std::int64_t min) {
    if (value < min) fail(path, {}, "must be >= ", min, ", got ", value);
  }
  void in_range(const char* path, std::int64_t value, std::int64_t lo, std::int64_t hi) {
    if (value < lo || value > hi) fail(path, {}, "must be in [", lo, ", ", hi, "], got ", value);
  }
  void finite_at_least(const char* path, double value, double min, bool strict) {
    const bool ok = std::isfinite(value) && (strict ? value > min : value >= min);
    if (!ok) fail(path, {}, "must be a finite number ", strict ? "> " : ">= ", min, ", got ", value);
  }
  std::vector<CheckProblem> out;
};

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

void check_fp16(Checker& k, const Fp16Config& f) {
  k.finite_at_least("fp16.loss_scale", f.loss_scale, 0.0, false);
  // 2^64 and beyond overflow fp32 gradients of any realistic magnitude at once.
  k.in_range("fp16.initial_scale_power", f.initial_scale_power, 0, 64);
  k.at_least("fp16.loss_scale_window", f.loss_scale_window, 1);
  k.at_least("fp16.hysteresis", f.hysteresis, 1);
  k.finite_at_least("fp16.min_loss_scale", f.min_loss_scale, 0.0, true);
}

void check_optimizer(Checker& k, const OptimizerConfig& o) {
  // The bounds torch.optim.AdamW checks.
  k.finite_at_least("optimizer.params.lr", o.lr, 0.0, false);
  for (double b : o.betas)
    if (!(b >= 0.0 && b < 1.0)) {
      k.fail("optimizer.params.betas", {}, "each beta must be in [0, 1), got [", o.betas[0], ", ", o.betas[1], "]");
      break;
    }
  k.finite_at_least("optimizer.params.eps", o.eps, 0.0, false);
  k.finite_at_least("optimizer.params.weight_decay", o.weight_decay, 0.0, false);
}

void check_scheduler(Checker& k, const SchedulerConfig& s) {
  if (s.type == SchedulerType::none) return;
  const char* name = s.type == SchedulerType::warmup_lr        ? "WarmupLR"
                     : s.type == SchedulerType::warmup_decay_lr ? "WarmupDecayLR"
                                                                : "WarmupCosineLR";
  // DeepSpeed raises ValueError for warmup_num_steps <= 0.
  if (s.warmup_num_steps < 1)
    k.fail("scheduler.params.warmup_num_steps", {}, "must be a positive integer (as DeepSpeed's ", name,
           " requires), got ", s.warmup_num_steps);
  if (s.type == SchedulerType::warmup_cosine_lr) {
    for (auto [key, v] : {std::pair{"scheduler.params.warmup_min_ratio", s.warmup_min_ratio},
                          std::pair{"scheduler.params.cos_min_ratio", s.cos_min_ratio}})
      if (!(v >= 0.0 && v <= 1.0)) k.fail(key, {}, "must be in [0, 1] (a fraction of optimizer.params.lr), got ", v);
  } else {
    k.finite_at_least("scheduler.params.warmup_min_lr", s.warmup_min_lr, 0.0, false);
    if (s.warmup_max_lr) k.finite_at_least("scheduler.params.warmup_max_lr", *s.warmup_max_lr, 0.0, false);
  }
  if (s.type != SchedulerType::warmup_lr && s.total_num_steps < 1)
    k.fail("scheduler.params.total_num_steps", {}, name, " needs total_num_steps >= 1 (a required argument of ",
           "DeepSpeed's ", name, "), got ", s.total_num_steps == 0 ? std::string("none") : std::to_string(s.total_num_steps));
}

void check_zero(Checker& k, const ZeroConfig& z) {
  k.in_range("zero_optimization.stage", z.stage, 0, 3);
  // 0 as in DeepSpeed: every group is a bucket of its own.
  k.at_least("zero_optimization.reduce_bucket_size", z.reduce_bucket_size, 0);
  if (!z.contiguous_gradients)
    k.fail("zero_optimization.contiguous_gradients", {}, "DeepSpeed key not supported by zoe with value false: zoe always "
           "keeps a module group's gradients in one contiguous flat buffer and its reduced shard in one contiguous "
           "buffer (what true means in DeepSpeed); the per-parameter gradient tensors of false do not exist in zoe "
           "(set true or remove the key)");
  k.at_least("zero_optimization.allgather_bucket_size", z.allgather_bucket_size, 1);
  k.at_least("zero_optimization.sub_group_size", z.sub_group_size, 1);
  k.at_least("zero_optimization.stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  k.at_least("zero_optimization.stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  k.at_least("zero_optimization.stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  k.at_least("zero_optimization.stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);

  const auto& oo = z.offload_optimizer;
  k.in_range("zero_optimization.offload_optimizer.buffer_count", oo.buffer_count, 1, kMaxBufferCount);
  if (oo.device == OffloadDevice::nvme && oo.buffer_count == 1)
    k.fail("zero_optimization.offload_optimizer.buffer_count", {"zero_optimization.offload_optimizer.device"},
           "must be >= 2 when device is \"nvme\" (one buffer reads ahead while another writes behind), got 1");
  if (!(oo.ratio > 0.0 && oo.ratio <= 1.0))
    k.fail("zero_optimization.offload_optimizer.ratio", {}, "must be in (0, 1], got ", oo.ratio);
  if (oo.device == OffloadDevice::nvme && oo.nvme_path.empty())
    k.fail("zero_optimization.offload_optimizer.nvme_path", {"zero_optimization.offload_optimizer.device"},
           "must name a directory when device is \"nvme\", got \"\"");
  if (oo.device != OffloadDevice::none && z.stage == 0)
    k.fail("zero_optimization.offload_optimizer.device", {"zero_optimization.stage"}, "\"", device_name(oo.device),
           "\" needs zero_optimization.stage >= 1 (the offloaded states are a rank's shard), got stage 0");

  const auto& op = z.offload_param;
  k.in_range("zero_optimization.offload_param.buffer_count", op.buffer_count, 1, kMaxBufferCount);
  if (op.device == OffloadDevice::nvme && op.buffer_count == 1)
    k.fail("zero_optimization.offload_param.buffer_count", {"zero_optimization.offload_param.device"},
           "must be >= 2 when device is \"nvme\" (a gathered module's shard is read while the next one is), got 1");
  k.in_range("zero_optimization.offload_param.buffer_size", op.buffer_size, 1, kMaxParamBufferElements);
  k.at_least("zero_optimization.offload_param.max_in_cpu", op.max_in_cpu, 0);
  if (op.device == OffloadDevice::nvme && op.nvme_path.empty())
    k.fail("zero_optimization.offload_param.nvme_path", {"zero_optimization.offload_param.device"},
           "must name a directory when device is \"nvme\", got \"\"");
  if (op.device != OffloadDevice::none && z.stage != 3)
    k.fail("zero_optimization.offload_param.device", {"zero_optimization.stage"}, "\"", device_name(op.device),
           "\" needs zero_optimization.stage 3 (only stage 3 shards parameters), got stage ", z.stage);
}

void check_aio(Checker& k, const AioConfig& a) {
  // O_DIRECT needs 4 KiB-aligned lengths.
  if (a.block_size < 4096 || a.block_size % 4096 != 0 || a.block_size > kMaxAioBlockSize)
    k.fail("aio.block_size", {}, "must be a positive multiple of 4096 bytes up to 1 GiB (", kMaxAioBlockSize,
           "), got ", a.block_size);
  k.in_range("aio.queue_depth", a.queue_depth, 1, 32768);  // io_uring's largest ring
  k.in_range("aio.intra_op_parallelism", a.intra_op_parallelism, 1, 64);  // the io engine's thread limit
}

void check_zoe(Checker& k, const Config& c) {
  const ZoeConfig& z = c.zoe;
  k.finite_at_least("zoe.comm_timeout_s", z.comm_timeout_s, 0.0, true);
  // A deadline is now + timeout on steady_clock (nanoseconds in int64, about 292 years from
  // boot): 1e10 s would overflow it into the past and every collective would time out at once.
  if (z.comm_timeout_s > kMaxCommTimeoutS)
    k.fail("zoe.comm_timeout_s", {}, "must be at most ", kMaxCommTimeoutS, " seconds (30 days), got ",
           z.comm_timeout_s);
  k.in_range("zoe.optimizer_threads", z.optimizer_threads, 0, kMaxOptimizerThreads);
  k.at_least("zoe.small_module_threshold", z.small_module_threshold, 0);
  k.at_least("zoe.pinned_budget_bytes", z.pinned_budget_bytes, 0);
  const bool auto_budget = z.host_memory_budget == ZoeConfig::kHostMemoryBudgetAuto;
  if (!auto_budget && z.host_memory_budget < 0)
    k.fail("zoe.host_memory_budget", {}, "must be >= 0 (bytes) or \"auto\" (what the machine can spare), got ",
           z.host_memory_budget);
  const bool nvme_params = c.zero_optimization.stage == 3 && c.zero_optimization.offload_param.device == OffloadDevice::nvme;
  if (z.host_memory_budget != 0 && c.zero_optimization.offload_optimizer.device != OffloadDevice::nvme && !nvme_params)
    k.fail("zoe.host_memory_budget", {"zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device"},
           auto_budget ? "\"auto\"" : "> 0", " needs an NVMe tier to spare (zero_optimization.offload_optimizer.device \"nvme\", or stage 3 with "
           "zero_optimization.offload_param.device \"nvme\"): it keeps what those would move over NVMe in host memory; "
           "with \"cpu\" tiers everything is there already; got ",
           auto_budget ? std::string("\"auto\"") : std::to_string(z.host_memory_budget));
  if (z.optimizer_state_dtype == OptimizerStateDType::bf16) {
    const auto& oo = c.zero_optimization.offload_optimizer;
    if (oo.device == OffloadDevice::none)
      k.fail("zoe.optimizer_state_dtype", {"zero_optimization.offload_optimizer.device"},
             "\"bf16\" needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (bf16 states are kept by "
             "the CPU optimizer; the device's AdamW keeps fp32 states), got \"none\"");
    else if (oo.ratio != 1.0)
      k.fail("zoe.optimizer_state_dtype", {"zero_optimization.offload_optimizer.ratio"},
             "\"bf16\" needs zero_optimization.offload_optimizer.ratio 1 (the sub-groups left on the device keep fp32 "
             "states), got ", oo.ratio);
  }
  if (z.split_master_weights) {
    // The high halves are the bf16 parameter shards of a parameter tier; the saving is NVMe bytes.
    const auto& zo = c.zero_optimization;
    if (zo.stage != 3 || zo.offload_param.device == OffloadDevice::none)
      k.fail("zoe.split_master_weights", {"zero_optimization.stage", "zero_optimization.offload_param.device"},
             "true needs zero_optimization.stage 3 with zero_optimization.offload_param.device \"cpu\" or \"nvme\" "
             "(the master weights' high halves are the bf16 parameter shards that tier keeps), got stage ", zo.stage,
             " with offload_param.device \"", device_name(zo.offload_param.device), "\"");
    else if (zo.offload_optimizer.device != OffloadDevice::nvme)
      k.fail("zoe.split_master_weights", {"zero_optimization.offload_optimizer.device"},
             "true needs zero_optimization.offload_optimizer.device \"nvme\" (it saves NVMe bytes; with \"",
             device_name(zo.offload_optimizer.device), "\" the master weights are not on NVMe), got \"",
             device_name(zo.offload_optimizer.device), "\"");
    else if (c.compute_dtype() != DType::bf16)
      k.fail("zoe.split_master_weights", {"bf16.enabled", "fp16.enabled"},
             "true needs bf16 compute (bf16.enabled true): the bf16 parameters are the master weights' high halves, "
             "an fp16 or fp32 copy is not; got ", dtype_name(c.compute_dtype()));
  }
  if (z.delayed_update && c.zero_optimization.offload_optimizer.device == OffloadDevice::none)
    k.fail("zoe.delayed_update", {"zero_optimization.offload_optimizer.device"},
           "true needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (it delays the "
           "host step), got \"none\"");
  if (z.update_in_backward) {
    // What a group's update may not wait for: every other gradient (norm, overflow).
    const auto& zo = c.zero_optimization;
    if (zo.offload_optimizer.device == OffloadDevice::none)
      k.fail("zoe.update_in_backward", {"zero_optimization.offload_optimizer.device"},
             "true needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (it starts the CPU "
             "optimizer's step in backward), got \"none\"");
    else if (zo.offload_optimizer.ratio != 1.0)
      k.fail("zoe.update_in_backward", {"zero_optimization.offload_optimizer.ratio"},
             "true needs zero_optimization.offload_optimizer.ratio 1 (every sub-group on the CPU optimizer), got ",
             zo.offload_optimizer.ratio);
    if (zo.stage < 2)
      k.fail("zoe.update_in_backward", {"zero_optimization.stage"},
             "true needs zero_optimization.stage 2 or 3 (the gradients are reduced in backward; stage ", zo.stage,
             " reduces them at step()), got ", zo.stage);
    if (c.gradient_clipping != 0.0)
      k.fail("zoe.update_in_backward", {"gradient_clipping"},
             "true cannot be combined with gradient_clipping ", c.gradient_clipping,
             ": clipping needs the global gradient norm, known only after the last group's backward");
    if (c.fp16.enabled)
      k.fail("zoe.update_in_backward", {"fp16.enabled"},
             "true cannot be combined with fp16.enabled true: its loss scaling skips a step on overflow, known only after the "
             "last group's backward (use bf16)");
    if (z.delayed_update)
      k.fail("zoe.update_in_backward", {"zoe.delayed_update"},
             "true cannot be combined with zoe.delayed_update true: one moves the update into this step's backward, "
             "the other a step later");
  }
}
}  // namespace

std::vector<CheckProblem> check(const Config& c) {
  Checker k;
  k.at_least("train_batch_size", c.train_batch_size, 0);
  k.at_least("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, 1);
  k.at_least("gradient_accumulation_steps", c.gradient_accumulation_steps, 1);
  k.finite_at_least("gradient_clipping", c.gradient_clipping, 0.0, false);
  k.finite_at_least("gradient_predivide_factor", c.gradient_predivide_factor, 0.0, true);
  k.at_least("steps_per_print", c.steps_per_print, 0);
  check_fp16(k, c.fp16);
  if (c.fp16.enabled && c.bf16.enabled)
    k.fail("bf16.enabled", {"fp16.enabled"}, "true conflicts with fp16.enabled true: enable at most one");
  check_optimizer(k, c.optimizer);
  check_scheduler(k, c.scheduler);
  check_zero(k, c.zero_optimization);
  check_aio(k, c.aio);
  check_zoe(k, c);
  return std::move(k.out);
}
}  // namespace config_detail

void Config::validate() const {
  std::vector<ConfigError::Problem> problems;
  for (auto& p : config_detail::check(*this)) problems.push_back({std::move(p.key), std::move(p.reason)});
  if (!problems.empty()) throw ConfigError(std::move(problems), __FILE__, __LINE__);
}

void Config::check_batch_size(int world_size) const {
  if (world_size < 1) ZOE_THROW_CONFIG("train_batch_size", "world size must be >= 1, got ", world_size);
  if (train_batch_size == 0) return;
  const std::int64_t product =
      std::int64_t{train_micro_batch_size_per_gpu} * gradient_accumulation_steps * world_size;
  if (product != train_batch_size)
    ZOE_THROW_CONFIG("train_batch_size", train_batch_size, " != train_micro_batch_size_per_gpu (",
                     train_micro_batch_size_per_gpu, ") * gradient_accumulation_steps (",
                     gradient_accumulation_steps, ") * world size (", world_size, ") = ", product);
}

}  // namespace zoe
