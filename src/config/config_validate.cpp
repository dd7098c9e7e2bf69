// Config::validate: ranges of single fields, then checks across fields. Each error names
// the JSON path of the field it blames and the value found there.
#include <cmath>
#include <limits>

#include "src/common/check.hpp"
#include "zoe/config.hpp"

namespace zoe {
namespace {
constexpr double kMaxCommTimeoutS = 30.0 * 86400.0;

void at_least(const char* path, std::int64_t value, std::int64_t min) {
  if (value < min) ZOE_THROW_CONFIG(path, "must be >= ", min, ", got ", value);
}

void in_range(const char* path, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) ZOE_THROW_CONFIG(path, "must be in [", lo, ", ", hi, "], got ", value);
}

void finite_at_least(const char* path, double value, double min, bool strict) {
  const bool ok = std::isfinite(value) && (strict ? value > min : value >= min);
  if (!ok) ZOE_THROW_CONFIG(path, "must be a finite number ", strict ? "> " : ">= ", min, ", got ", value);
}

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

void validate_fp16(const Fp16Config& f) {
  finite_at_least("fp16.loss_scale", f.loss_scale, 0.0, false);
  // 2^64 and beyond overflow fp32 gradients of any realistic magnitude at once.
  in_range("fp16.initial_scale_power", f.initial_scale_power, 0, 64);
  at_least("fp16.loss_scale_window", f.loss_scale_window, 1);
  at_least("fp16.hysteresis", f.hysteresis, 1);
  finite_at_least("fp16.min_loss_scale", f.min_loss_scale, 0.0, true);
}

void validate_optimizer(const OptimizerConfig& o) {
  // The bounds torch.optim.AdamW checks.
  finite_at_least("optimizer.params.lr", o.lr, 0.0, false);
  for (double b : o.betas)
    if (!(b >= 0.0 && b < 1.0))
      ZOE_THROW_CONFIG("optimizer.params.betas", "each beta must be in [0, 1), got [", o.betas[0], ", ",
                       o.betas[1], "]");
  finite_at_least("optimizer.params.eps", o.eps, 0.0, false);
  finite_at_least("optimizer.params.weight_decay", o.weight_decay, 0.0, false);
}

void validate_zero(const ZeroConfig& z) {
  in_range("zero_optimization.stage", z.stage, 0, 3);
  at_least("zero_optimization.reduce_bucket_size", z.reduce_bucket_size, 1);
  at_least("zero_optimization.allgather_bucket_size", z.allgather_bucket_size, 1);
  at_least("zero_optimization.sub_group_size", z.sub_group_size, 1);
  at_least("zero_optimization.stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  at_least("zero_optimization.stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  at_least("zero_optimization.stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  at_least("zero_optimization.stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);

  const auto& oo = z.offload_optimizer;
  at_least("zero_optimization.offload_optimizer.buffer_count", oo.buffer_count, 1);
  if (!(oo.ratio > 0.0 && oo.ratio <= 1.0))
    ZOE_THROW_CONFIG("zero_optimization.offload_optimizer.ratio", "must be in (0, 1], got ", oo.ratio);
  if (oo.device == OffloadDevice::nvme && oo.nvme_path.empty())
    ZOE_THROW_CONFIG("zero_optimization.offload_optimizer.nvme_path", "must name a directory when device is \"nvme\", got \"\"");
  if (oo.device != OffloadDevice::none && z.stage == 0)
    ZOE_THROW_CONFIG("zero_optimization.offload_optimizer.device", "\"", device_name(oo.device),
                     "\" needs zero_optimization.stage >= 1 (the offloaded states are a rank's shard), got stage 0");

  const auto& op = z.offload_param;
  at_least("zero_optimization.offload_param.buffer_count", op.buffer_count, 1);
  at_least("zero_optimization.offload_param.buffer_size", op.buffer_size, 1);
  at_least("zero_optimization.offload_param.max_in_cpu", op.max_in_cpu, 0);
  if (op.device == OffloadDevice::nvme && op.nvme_path.empty())
    ZOE_THROW_CONFIG("zero_optimization.offload_param.nvme_path", "must name a directory when device is \"nvme\", got \"\"");
  if (op.device != OffloadDevice::none && z.stage != 3)
    ZOE_THROW_CONFIG("zero_optimization.offload_param.device", "\"", device_name(op.device),
                     "\" needs zero_optimization.stage 3 (only stage 3 shards parameters), got stage ", z.stage);
}

void validate_aio(const AioConfig& a) {
  // O_DIRECT needs 4 KiB-aligned lengths.
  if (a.block_size < 4096 || a.block_size % 4096 != 0)
    ZOE_THROW_CONFIG("aio.block_size", "must be a positive multiple of 4096 bytes, got ", a.block_size);
  in_range("aio.queue_depth", a.queue_depth, 1, 32768);  // io_uring's largest ring
  in_range("aio.intra_op_parallelism", a.intra_op_parallelism, 1, 64);  // the io engine's thread limit
}

void validate_zoe(const Config& c) {
  const ZoeConfig& z = c.zoe;
  finite_at_least("zoe.comm_timeout_s", z.comm_timeout_s, 0.0, true);
  // A deadline is now + timeout on steady_clock (nanoseconds in int64, about 292 years from
  // boot): 1e10 s would overflow it into the past and every collective would time out at once.
  if (z.comm_timeout_s > kMaxCommTimeoutS)
    ZOE_THROW_CONFIG("zoe.comm_timeout_s", "must be at most ", kMaxCommTimeoutS, " seconds (30 days), got ",
                     z.comm_timeout_s);
  at_least("zoe.optimizer_threads", z.optimizer_threads, 0);
  at_least("zoe.pinned_budget_bytes", z.pinned_budget_bytes, 0);
  if (z.delayed_update && c.zero_optimization.offload_optimizer.device == OffloadDevice::none)
    ZOE_THROW_CONFIG("zoe.delayed_update",
                     "true needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (it delays the "
                     "host step), got \"none\"");
}
}  // namespace

void Config::validate() const {
  at_least("train_batch_size", train_batch_size, 0);
  at_least("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, 1);
  at_least("gradient_accumulation_steps", gradient_accumulation_steps, 1);
  finite_at_least("gradient_clipping", gradient_clipping, 0.0, false);
  validate_fp16(fp16);
  if (fp16.enabled && bf16.enabled)
    ZOE_THROW_CONFIG("bf16.enabled", "true conflicts with fp16.enabled true: enable at most one");
  validate_optimizer(optimizer);
  validate_zero(zero_optimization);
  validate_aio(aio);
  validate_zoe(*this);
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
