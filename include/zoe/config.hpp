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

/// Where a model state lives when offloaded.
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
};

struct Bf16Config {
  bool enabled = false;
};

enum class OptimizerType { adam, adamw };

/// optimizer{type, params{...}}: Adam (Kingma & Ba 2015, Alg. 1) or AdamW (Loshchilov &
/// Hutter 2019, Alg. 2, decoupled weight decay), as torch.optim.Adam / AdamW.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
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
  /// Fraction (0..1] of sub-groups whose optimizer step runs on the host; the rest stay on
  /// the device optimizer.
  double ratio = 1.0;
};

/// zero_optimization.offload_param (stage 3 only): where parameter shards live.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path = "/tmp/zoe_nvme";
  bool pin_memory = true;
  int buffer_count = 5;
  /// Bytes per pinned staging buffer (elements in DeepSpeed; zoe stores elements too).
  std::int64_t buffer_size = 100'000'000;
  /// Elements of parameter shards cached in host memory at most.
  std::int64_t max_in_cpu = 1'000'000'000;
};

struct ZeroConfig {
  /// 0 = plain data parallel, 1 = optimizer states sharded, 2 = + gradients, 3 = + parameters.
  int stage = 0;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  /// Elements per gradient bucket (reduce-scatter / all-reduce unit).
  std::int64_t reduce_bucket_size = 500'000'000;
  /// Elements per all-gather bucket (stage 1-2 parameter all-gather after the step).
  std::int64_t allgather_bucket_size = 500'000'000;
  /// Elements per optimizer sub-group (unit of NVMe swapping and of the pipelined step).
  std::int64_t sub_group_size = 1'000'000'000;
  /// Elements of parameters prefetched ahead of use (stage 3).
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  /// Modules with fewer elements than this stay gathered (stage 3).
  std::int64_t stage3_param_persistence_threshold = 100'000;
  /// Cap on gathered (live) parameter elements at any time (stage 3).
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  /// A module reused within this many elements of execution is not freed (stage 3).
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
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
};

/// zoe's own keys (JSON section "zoe").
struct ZoeConfig {
  /// Collective timeout in seconds; a rank that never arrives raises TimeoutError.
  double comm_timeout_s = 300.0;
  /// Threads for the CPU optimizer (0 = all hardware threads).
  int optimizer_threads = 0;
  /// Require O_DIRECT on the NVMe tier (error if the filesystem refuses it).
  bool require_direct_io = false;
  /// Pinned host memory budget in bytes for the offload tiers (0 = unlimited).
  std::int64_t pinned_budget_bytes = 0;
  /// Overlap the CPU optimizer step with the next forward (results unchanged).
  bool overlap_step = true;
  /// ZeRO-Offload's one-step-delayed parameter update (changes the math; off by default).
  bool delayed_update = false;
};

/// The whole configuration. Validated by validate() (and by Engine's constructor).
struct Config {
  int train_micro_batch_size_per_gpu = 1;
  int gradient_accumulation_steps = 1;
  /// Max global L2 norm of the gradients; 0 = no clipping.
  double gradient_clipping = 0.0;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ZoeConfig zoe;

  /// Compute (parameter) dtype: f16 if fp16.enabled, bf16 if bf16.enabled, else f32.
  DType compute_dtype() const {
    return fp16.enabled ? DType::f16 : bf16.enabled ? DType::bf16 : DType::f32;
  }

  /// Throws ConfigError naming the first invalid key and its value (e.g. stage 5,
  /// both fp16 and bf16 enabled, betas outside [0,1), negative sizes).
  void validate() const;

  /// Parse DeepSpeed-style JSON text. Unknown keys, wrong types and bad values throw
  /// ConfigError with the JSON path, the value and a "did you mean" for near misses.
  static Config from_json(const std::string& json_text);
  /// Read and parse a JSON file. Throws SystemError if it cannot be read, else as from_json.
  static Config from_json_file(const std::string& path);
  /// Serialise to DeepSpeed-style JSON (round-trips through from_json).
  std::string to_json() const;
};

}  // namespace zoe
