// Memory and traffic model of ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
// Toward Training Trillion Parameter Models", arXiv 1910.02054, §5 and §7) with zoe's offload
// tiers, for zoe-estimate and for comparing a plan with Engine::memory_report().
//
// Model states per rank, mixed precision with Adam, Ψ parameters, Nd ranks, K = 12 (fp32
// master weights, exp_avg, exp_avg_sq): stage 0 (2+2+K)Ψ = 16Ψ; stage 1 4Ψ + 12Ψ/Nd;
// stage 2 2Ψ + 14Ψ/Nd; stage 3 16Ψ/Nd (paper §5.3, Figure 1). Shards are ceil(Ψ/Nd) elements.
// Offload moves states off the device (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity,
// Rajbhandari et al. 2021): offload_optimizer moves the 12-byte optimizer-state shard to host
// (cpu) or disk (nvme) together with an fp32 gradient shard for it (4 bytes per element; at
// stages 2-3 the device then keeps no gradient shard unless ratio < 1), as zoe's Engine does;
// offload_param (stage 3) moves the parameter shard.
// Buffers (gradient buckets, gathered layers, pinned NVMe staging) are counted separately by
// the rules documented on RankEstimate::buffers.
//
// Pure functions of their arguments; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zoe/config.hpp"

namespace zoe::estimate {

/// Bytes on each tier: device (GPU memory, or host memory on the host device), host (RAM,
/// pinned where pin_memory), nvme (files).
struct TierBytes {
  std::int64_t device = 0, host = 0, nvme = 0;
  std::int64_t total() const { return device + host + nvme; }
  TierBytes& operator+=(const TierBytes& o);
  bool operator==(const TierBytes&) const = default;
};

/// What is trained: parameter count Ψ (elements), the largest module's parameter count
/// (elements; 0 = unknown, then the per-module device buffers of stages 2-3 are not counted),
/// the second largest module's (elements; 0 = unknown: taken as the largest; a GPT's
/// transformer block beside its embedding), and how many of the Ψ are frozen (Ψf,
/// ParamOptions::frozen: the fine-tuning case). Frozen parameters
/// cost only their compute-dtype value (full at stages 0-2, the shard at stage 3, on
/// offload_param's tier) and their stage-3 gathers; gradients, optimizer states and gradient
/// traffic count only the trainable Ψt = Ψ - Ψf.
struct ModelShape {
  std::int64_t parameters = 0;
  std::int64_t largest_layer = 0;
  std::int64_t frozen_parameters = 0;
  std::int64_t next_largest_layer = 0;
};

/// How the communicator runs a coalesced all-gather or a gradient bucket's reduce-scatter
/// (Communicator::gathers_parts_in_place): `packed` through one flattened buffer (NCCL, Gloo:
/// the staging copies are device buffers), `in_place` straight between the groups' own buffers
/// (ranks as threads of one process: no staging).
enum class Coalescing { packed, in_place };

/// One rank's bytes for one configuration.
struct RankEstimate {
  int stage = 0;
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;
  /// Bytes per element of the compute dtype (2 for fp16/bf16, 4 for fp32).
  int compute_bytes = 2;
  /// Elements of this rank's shard: ceil(Ψ / Nd).
  std::int64_t shard_elements = 0;
  /// Elements of this rank's shard of the trainable parameters: ceil(Ψt / Nd) (= shard_elements
  /// without frozen parameters). Gradients and optimizer states are counted on it.
  std::int64_t trainable_shard_elements = 0;

  /// Model states, each by tier. Gradients and optimizer states are of the trainable
  /// parameters (Ψt, its shard t = trainable_shard_elements; Ψ and s without frozen ones).
  /// params: compute-dtype parameters, frozen ones included (full at stages 0-2, the
  /// shard at stage 3, on offload_param's tier; nvme: in host memory for the first min(B·s,
  /// zoe.host_memory_budget) bytes). gradients: on the device, compute-dtype (full
  /// at stages 0-1, the shard at 2-3, fp32 at 2-3 with gradient_accumulation_steps > 1, none
  /// at 2-3 when every sub-group is offloaded); with offload_optimizer, 4 bytes per offloaded
  /// element on its tier (the fp32 gradient shard; B with one micro-batch per step, the
  /// compute-dtype shard; nvme: in host memory for the first min(o, zoe.host_memory_budget /
  /// those bytes) of them). optimizer_states: 12 bytes per element of
  /// the shard (the full model at stage 0): fp32 master, exp_avg, exp_avg_sq; `ratio` of them
  /// on offload_optimizer's tier (nvme: once every gradient is off NVMe, in host memory for the
  /// first of them what is left of zoe.host_memory_budget covers), the rest on the device; 8 on the tier with
  /// zoe.optimizer_state_dtype bf16 (exp_avg, exp_avg_sq 2 bytes each); the master 2 bytes and
  /// 1 bit instead of 4 with zoe.split_master_weights.
  TierBytes params, gradients, optimizer_states;
  /// params + gradients + optimizer_states: what Engine's MemoryReport calls model states.
  TierBytes model_states;

  /// Working buffers, by these rules (B = compute_bytes, s = shard_elements, Ψ):
  ///  device: the allocated peak of the device's working buffers, the most bytes of live
  ///    buffers at any moment of a step (torch.cuda.max_memory_allocated; Engine's
  ///    MemoryReport::device_peak is this plus model_states.device), not the allocator's
  ///    reserved bytes. In elements of B, with L the largest module, m the second largest
  ///    (L if unknown), r(n) = ⌈n/Nd⌉ for a reduced shard that needs a buffer of its own (every
  ///    sub-group offloaded, or gradient_accumulation_steps > 1; else 0) and the bucket
  ///    b = min(reduce_bucket_size, Ψt), bucketed = 2b + ⌈b/Nd⌉ (its groups' gradients, their
  ///    flattened copy, the reduced shards; Coalescing::in_place at stages 2-3: b + r(b), no
  ///    flattened copy, the shards reduced straight into the gradient shards where they can):
  ///    stages 2-3, grads = max(L + r(L) + m + r(m), bucketed): the gradient and reduced shard
  ///      of the module in backward and of the one before it, whose buffers the engine frees
  ///      after the side stream passes them and gets back at the next module's acquire;
  ///    stage 3, the larger of the first step, L + ⌈L/Nd⌉·[offload_param] (its shard staged
  ///      from the parameter tier) + m + ⌈m/Nd⌉·[offload_param] (the module before it: its
  ///      gather and staged shard, given back at the next acquire) + grads, and later steps,
  ///      G + grads + c + ⌈c/Nd⌉ with
  ///      G = min(Ψ, max(L + P, min(stage3_max_live_parameters, stage3_max_reuse_distance + L)))
  ///      (modules reused within the reuse distance stay gathered, up to the live cap; P =
  ///      min(stage3_prefetch_bucket_size, Ψ)) and, at Nd > 1 while G < Ψ, a coalesced
  ///      prefetch's staging c = min(Ψ, P + m) (else c = 0; Coalescing::in_place: only the
  ///      shards staged from the parameter tier, ⌈c/Nd⌉·[offload_param], and no c);
  ///    stage 2, the larger of grads and Ψt + r(Ψt) + 2t (t = trainable_shard_elements): no
  ///      acquire reaps at stage 2, so every gradient buffer of the step waits for step(),
  ///      beside the new shards of this step and of the last one;
  ///    stages 0-1: bucketed;
  ///    stages 1-2, when the largest layer holds 2·a or more with a = allgather_bucket_size,
  ///      also the gather pieces' staging 2a; without offload_param in a 16-bit dtype at least
  ///      the construction's fp32 chunk, 4/B · min(sub_group_size, the largest module's part).
  ///    L unknown: bucketed, and at stage 3 also P gathered plus a coalesced gather's staging
  ///    P + ⌈P/Nd⌉ (in place: ⌈P/Nd⌉·[offload_param]; P capped by stage3_max_live_parameters). Measured against the engine
  ///    (tests/estimate/test_device_peak.cpp, tests/gpt/test_memory_estimate.cpp: within 10%)
  ///    with reduce_bucket_size 0. The previous module's gradient and reduced shard are given
  ///    back at a fixed point whatever the side stream's pace: the engine's rate limit (an
  ///    acquire returns what was released before the previous module began, waiting for the
  ///    side stream if it fell behind, and nothing newer), so the peak is the same on a quiet
  ///    or a loaded machine. A small
  ///    stage3_max_reuse_distance, which gathers every module again in backward, holds more
  ///    (up to 1.32x measured).
  ///    Covers zoe's own allocations only, not the trainer's activations.
  ///  host: offload_optimizer nvme: buffer_count pinned buffers, each the largest sub-group's
  ///    three fp32 states then its fp32 gradient, page(page(12·l) + 4·l) bytes with
  ///    l = min(sub_group_size, module shard, o) and page() rounding up to whole 4096-byte
  ///    pages (module shard = ceil(L/Nd) rounded up to 16, or s if L is unknown; o = offloaded
  ///    shard elements), plus one gradient buffer page(4·l);
  ///    offload_optimizer cpu or nvme: the update pipeline's pinned staging, 2·page(B·l) for the
  ///    reduced gradients on their way to the tier and, unless offload_param moves the outputs
  ///    into the parameter tier, 2·page(B·l) for the new parameters on their way to the device;
  ///    offload_param nvme: buffer_count staging buffers of buffer_size·B bytes, each rounded
  ///    up to whole 4096-byte pages (zoe keeps no other host copy of the shards).
  TierBytes buffers;

  /// Collective traffic per rank per step of one micro-batch, in elements, as the paper
  /// counts it (§7): 2Ψ at stages 0-2 (reduce-scatter + all-gather, or all-reduce), 3Ψ at
  /// stage 3 (parameters all-gathered in forward and in backward, gradients reduce-scattered).
  /// With frozen parameters: 2Ψt at stages 0-2, 2Ψ + Ψt at stage 3 (frozen ones are gathered,
  /// never reduced or updated).
  std::int64_t traffic_elements = 0;
  /// traffic_elements · B · (Nd-1)/Nd: the bytes a ring sends (what TrafficReport counts).
  std::int64_t traffic_bytes_sent = 0;

  /// NVMe traffic per rank per step, in bytes read from and written to the tiers' files (what
  /// /proc/self/io counts for them: the files are O_DIRECT); 0 without an NVMe tier. With o the
  /// elements of the trainable shard on offload_optimizer nvme (ratio of t), G =
  /// gradient_accumulation_steps, s = shard_elements, t = trainable_shard_elements, B =
  /// compute_bytes:
  ///  offload_optimizer nvme: with g the bytes of the tier's gradient (4: fp32, when
  ///    micro-batches accumulate, G > 1; B with one micro-batch per step, the reduced shard
  ///    kept as it arrives) and K the bytes of the states (12: fp32 master, exp_avg, exp_avg_sq;
  ///    8 with zoe.optimizer_state_dtype bf16): the update reads each sub-group's states and
  ///    gradient (K·o + g·o) and writes the states (K·o); each micro-batch's reduced gradient is
  ///    written (g·o), every one after the first read first to add to (g·o): read K·o + g·G·o,
  ///    written K·o + g·G·o; the h elements whose gradients zoe.host_memory_budget keeps in host
  ///    memory (h = min(o, budget / g)) move none of their gradient bytes, and once h = o the
  ///    q elements whose states what is left keeps in host memory (q = min(o, left / K) with K
  ///    of fp32 masters) move none of theirs: read and written K·(o-q) + g·G·(o-h) each;
  ///  offload_param nvme (stage 3): each gather of a module reads its shard, at most once in
  ///    forward and once in backward per micro-batch (2·G·B·s: less where a shard is still in a
  ///    staging buffer or stays gathered within stage3_max_reuse_distance), and the update
  ///    writes the new trainable shard (B·t); the p bytes of shards zoe.host_memory_budget
  ///    keeps in host memory (it spends itself there first: p = min(B·s, budget), the
  ///    gradients' h then from what is left) move none: read 2·G·(B·s - p), written B·t - p;
  ///  zoe.split_master_weights: K counts the master as 2 bytes (K = 10, 6 with bf16 states; the
  ///    rounded-up bit rides in exp_avg_sq's sign), and the update also reads the
  ///    shard it rewrites: read B·t - p more, except with zoe.update_in_backward, whose updates
  ///    take the step's last read of the shard (while the prefetch reads at most
  ///    offload_param.buffer_count - 2 modules ahead);
  /// Everything on NVMe, 16-bit compute, one micro-batch, no frozen parameters: read 18·Ψ/Nd,
  /// written 16·Ψ/Nd, 34 bytes per parameter (ZeRO-Infinity's count, with its fp32 gradient,
  /// is 38); 30 with every gradient in host memory (zoe.host_memory_budget), 22 with that and
  /// bf16 optimizer states; split master weights take 2 bytes from each of the master's read
  /// and write and add the shard's read: 32, and 26 with the update in backward (18 with bf16
  /// states; measured by zoe-offload-bench --cases nvme-bytes and the scale demo).
  struct Traffic {
    std::int64_t read = 0, written = 0;
  } nvme_traffic;
};

/// Estimate for an engine configuration: stage, offload devices, ratio, buffer knobs and
/// compute dtype are taken from `config` (validated first). Throws ConfigError if `config` is
/// invalid or if model.parameters is outside [1, 1e15], model.largest_layer < 0, model.frozen_parameters
/// outside [0, model.parameters] or world_size < 1.
/// `coalescing` only changes the device buffers (see RankEstimate::buffers).
RankEstimate estimate_rank(const ModelShape& model, int world_size, const Config& config,
                           Coalescing coalescing = Coalescing::packed);

/// `config` with zoe.host_memory_budget "auto" (ZoeConfig::kHostMemoryBudgetAuto) replaced by
/// what the engine resolves it to on a node of `node_available` bytes of MemAvailable and
/// `node_total` bytes of MemTotal running `ranks_per_node` ranks (spare_host_memory_per_rank);
/// any other budget unchanged. estimate_rank needs a resolved budget (UsageError for "auto").
Config with_host_memory_budget_resolved(Config config, std::int64_t node_available, std::int64_t node_total,
                                        int ranks_per_node);

/// The machines: `world_size` ranks, `gpus_per_node` per node. Memory sizes in bytes.
struct Cluster {
  int world_size = 1;
  int gpus_per_node = 1;
  std::int64_t gpu_bytes = 0;             // per GPU
  std::int64_t host_bytes_per_node = 0;   // RAM per node
  std::int64_t nvme_bytes_per_node = 0;   // free NVMe per node
  /// Fraction of GPU memory left for activations, workspace and fragmentation.
  double gpu_headroom = 0.2;
  /// Fraction of host memory left for the OS, the data loader and the page cache.
  double host_headroom = 0.1;

  int ranks_per_node() const { return gpus_per_node < world_size ? gpus_per_node : world_size; }
  std::int64_t usable_gpu_bytes() const;
  std::int64_t usable_host_bytes() const;
};

/// One row of the planner's table: a configuration and whether it fits.
struct PlanRow {
  RankEstimate rank;
  std::string label;                 // "stage 3, optimizer cpu, params nvme"
  std::int64_t device_bytes = 0;     // model states + buffers on one GPU
  std::int64_t host_bytes_per_node = 0;
  std::int64_t nvme_bytes_per_node = 0;
  bool fits_device = false, fits_host = false, fits_nvme = false;
  bool fits() const { return fits_device && fits_host && fits_nvme; }
  /// "" when it fits, else e.g. "needs 30.18 GiB per GPU, 23.84 GiB usable".
  std::string shortfall;
};

struct Plan {
  ModelShape model;
  Cluster cluster;
  /// Stage 0; stages 1 and 2 with offload_optimizer none/cpu/nvme; stage 3 with
  /// (optimizer, params) none/none, cpu/none, cpu/cpu, nvme/none, nvme/cpu, nvme/nvme.
  std::vector<PlanRow> rows;
  /// Index into rows of the recommendation; nullopt when nothing fits.
  std::optional<std::size_t> recommended;
  /// One line saying why.
  std::string why;
};

/// Every row for `model` on `cluster`, buffer knobs from `knobs` (its stage and offload
/// devices are replaced per row, ratio set to 1; fp16/bf16 stays, so compute bytes follow
/// it: use mixed_precision_knobs() for the paper's numbers), and the
/// recommendation by the rule of the issue: stage 1 if its whole model state fits on one
/// GPU; else stage 2 if parameters, gradients and the sharded rest fit; else stage 3; then
/// stage 3 with CPU offload (optimizer, then also parameters); then NVMe offload (optimizer,
/// then parameters to host, then both to NVMe). Throws ConfigError for an invalid cluster
/// (world_size or gpus_per_node < 1, negative bytes, headroom outside [0, 1)).
/// Sizes in `why` and shortfalls are GiB, or GB (1e9 bytes) when binary_units is false.
Plan plan(const ModelShape& model, const Cluster& cluster, const Config& knobs, bool binary_units = true);

/// Config{} with bf16 enabled: the paper's mixed-precision setting (2-byte parameters and
/// gradients) and zoe's default buffer knobs.
Config mixed_precision_knobs();

/// "7.50 GB" style: bytes / 1e9 with 2 decimals (the ZeRO paper's GB) or / 2^30 ("GiB").
std::string format_bytes(std::int64_t bytes, bool binary);

/// The trainer's side of a config's "auto" keys as zoe-estimate fills them (Hugging Face's
/// meaning: the value comes from the trainer, which an estimate has not got).
struct AutoInputs {
  int world_size = 1;              // train_batch_size = world · micro · accumulation
  int micro_batch = 1;             // train_micro_batch_size_per_gpu
  int gradient_accumulation = 1;   // gradient_accumulation_steps
  /// "bf16", "fp16" or "fp32": fp16.enabled / bf16.enabled (the compute dtype the estimate uses).
  std::string precision = "bf16";
  /// The model's hidden size (reduce_bucket_size = h², stage3_prefetch_bucket_size =
  /// int(0.9 h²), stage3_param_persistence_threshold = 10 h); unknown: those "auto" stay a
  /// problem naming the field.
  std::optional<std::int64_t> hidden_size;
};
/// Config::AutoValues from `in`, with fixed stand-ins for the keys the memory estimate never
/// reads: lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0, max_grad_norm 0 (no
/// clipping), warmup_steps 1000, total_steps 10000. Throws ConfigError naming `--precision`
/// for another precision.
Config::AutoValues auto_values(const AutoInputs& in);

}  // namespace zoe::estimate
