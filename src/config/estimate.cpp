#include "src/config/estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "src/common/check.hpp"
#include "src/common/host_memory.hpp"
#include "src/config/group_sharing.hpp"
#include "src/config/stage_policy.hpp"

namespace zoe::estimate {
namespace {
constexpr std::int64_t kOptimizerBytes = 12;  // K: fp32 master + exp_avg + exp_avg_sq
constexpr std::int64_t kAlign = 16;           // the engine's shard alignment (elements)
constexpr std::int64_t kPage = 4096;          // pinned buffers are whole pages

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

// Adds `bytes` to the tier where `device` puts it (none = the device).
void put(TierBytes& t, OffloadDevice device, std::int64_t bytes) {
  (device == OffloadDevice::cpu ? t.host : device == OffloadDevice::nvme ? t.nvme : t.device) += bytes;
}

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

}  // namespace

TierBytes& TierBytes::operator+=(const TierBytes& o) {
  device += o.device;
  host += o.host;
  nvme += o.nvme;
  return *this;
}

std::string format_bytes(std::int64_t bytes, bool binary) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", static_cast<double>(bytes) / (binary ? 1073741824.0 : 1e9),
                binary ? "GiB" : "GB");
  return buf;
}

RankEstimate estimate_rank(const ModelShape& model, int world_size, const Config& config, Coalescing coalescing) {
  // 1e15 parameters (a thousand times the largest models trained) keeps every byte count
  // below, up to (2+2+12)·Ψ and the per-step traffic, exact in int64.
  constexpr std::int64_t kMaxParameters = 1'000'000'000'000'000;
  if (model.parameters < 1 || model.parameters > kMaxParameters)
    ZOE_THROW_CONFIG("parameters", "must be in [1, 1e15], got ", model.parameters);
  if (model.largest_layer < 0) ZOE_THROW_CONFIG("largest_layer", "must be >= 0, got ", model.largest_layer);
  if (model.next_largest_layer < 0)
    ZOE_THROW_CONFIG("next_largest_layer", "must be >= 0, got ", model.next_largest_layer);
  if (world_size < 1) ZOE_THROW_CONFIG("world_size", "must be >= 1, got ", world_size);
  if (model.frozen_parameters < 0 || model.frozen_parameters > model.parameters)
    ZOE_THROW_CONFIG("frozen_parameters", "must be in [0, parameters = ", model.parameters, "], got ",
                     model.frozen_parameters);
  config.validate();
  const auto& z = config.zero_optimization;
  const StagePolicy stage(z.stage);
  const std::int64_t psi = model.parameters;
  const std::int64_t nd = world_size;
  // The largest group: the largest module's, or one small modules share (under
  // small_module_share_below elements, the engine's rule), which may be larger than any of
  // its modules.
  const std::int64_t share_below = small_module_share_below(config);
  const std::int64_t largest_group =
      model.largest_layer > 0 ? std::max(model.largest_layer, std::min(share_below - 1, psi)) : 0;
  const std::int64_t B = static_cast<std::int64_t>(dtype_size(config.compute_dtype()));

  RankEstimate r;
  r.stage = z.stage;
  r.offload_optimizer = z.offload_optimizer.device;
  r.offload_param = z.offload_param.device;
  r.compute_bytes = static_cast<int>(B);
  r.shard_elements = (psi + nd - 1) / nd;
  // Gradients, optimizer states and gradient traffic: the trainable parameters only.
  const std::int64_t psi_t = psi - model.frozen_parameters;
  r.trainable_shard_elements = (psi_t + nd - 1) / nd;
  const std::int64_t t = r.trainable_shard_elements;

  // Parameters: full at stages 0-2, the shard at 3 (where offload_param may move it).
  // zoe.host_memory_budget keeps an NVMe parameter tier's shards in host memory first (whole
  // shards in group order, so the engine may keep up to one shard's less); the gradients get
  // what is left.
  ZOE_CHECK_USAGE(config.zoe.host_memory_budget != ZoeConfig::kHostMemoryBudgetAuto,
                  "estimate_rank: zoe.host_memory_budget \"auto\" depends on the machine: resolve it first "
                  "(with_host_memory_budget_resolved)");
  std::int64_t params_in_host = 0, budget_left = config.zoe.host_memory_budget;
  if (stage.shards_params) {
    put(r.params, z.offload_param.device, B * r.shard_elements);
    if (z.offload_param.device == OffloadDevice::nvme) {
      params_in_host = std::min(r.params.nvme, budget_left);
      r.params.nvme -= params_in_host;
      r.params.host += params_in_host;
      budget_left -= params_in_host;
    }
  } else {
    r.params.device = B * psi;
  }

  // Optimizer states: the whole model at stage 0, else the shard; `ratio` of it offloaded.
  const bool offloaded = stage.shards_optimizer && z.offload_optimizer.device != OffloadDevice::none;
  const std::int64_t state_elements = stage.shards_optimizer ? t : psi_t;
  const std::int64_t off = offloaded ? std::llround(z.offload_optimizer.ratio * static_cast<double>(t)) : 0;
  // The offloaded states of n elements: the fp32 master plus exp_avg and exp_avg_sq of
  // zoe.optimizer_state_dtype (12 or 8 bytes per element), or with zoe.split_master_weights the
  // master's low halves (2 bytes per element; the rounded-up bit rides in exp_avg_sq's sign); the
  // device keeps fp32 (kOptimizerBytes).
  const bool split = config.zoe.split_master_weights;
  const std::int64_t moment_bytes = 2 * static_cast<std::int64_t>(optimizer_state_dtype_size(config.zoe.optimizer_state_dtype));
  auto offloaded_state_bytes = [&](std::int64_t n) { return (split ? moment_bytes + 2 : moment_bytes + 4) * n; };
  r.optimizer_states.device += kOptimizerBytes * (state_elements - off);

  // Gradients, as the engine keeps them: on the device full at stages 0-1 (the trainer
  // accumulates there) and the shard at 2-3 (fp32 when micro-batches accumulate), unless
  // every sub-group is offloaded; the offloaded elements' gradients on the offload tier.
  const std::int64_t grad_bytes = stage.shards_grads && config.gradient_accumulation_steps > 1 ? 4 : B;
  if (!stage.shards_grads) {
    r.gradients.device = B * psi_t;
  } else if (off < t) {
    r.gradients.device = grad_bytes * t;
  }
  // The offloaded gradient shard: fp32 (micro-batches accumulate in it), or with one
  // micro-batch per step the 16-bit shard as it arrives (exact, OptimizerStates::add_grad).
  const std::int64_t kGradientBytes = config.gradient_accumulation_steps == 1 ? B : 4;
  // zoe.update_in_backward on NVMe with one micro-batch: the gradients wait in recycled host
  // buffers until their group's update, none on NVMe (OptimizerStates::recycle_gradient_slots):
  // the most sub-groups of one group plus one (at most one per sub-group), each the largest
  // sub-group's gradient (at least a page). Otherwise zoe.host_memory_budget keeps the NVMe
  // tier's gradients in host memory while they fit (the engine places whole sub-groups, so it
  // may keep up to one sub-group's less). Once no gradient is on NVMe, what is left of the
  // budget keeps states in host memory (fp32 masters; likewise whole sub-groups).
  const bool recycled = offloaded && z.offload_optimizer.device == OffloadDevice::nvme && config.zoe.update_in_backward &&
                        config.gradient_accumulation_steps == 1;
  std::int64_t grads_in_host = 0;
  if (recycled) {
    const std::int64_t sub_group = std::max(kAlign, z.sub_group_size / kAlign * kAlign);
    const std::int64_t module_shard = largest_group > 0 ? round_up((largest_group + nd - 1) / nd, kAlign) : t;
    const std::int64_t slot = std::max(kPage, kGradientBytes * std::min({sub_group, module_shard, off}));
    // Sub-groups never span groups: those of one group's shard, and of all of them.
    const std::int64_t group = std::min(module_shard, off), per_group = (group + sub_group - 1) / sub_group;
    const std::int64_t slots = std::min(per_group + 1, (off + group - 1) / group * per_group);  // at most one per sub-group
    grads_in_host = off;
    r.gradients.host += slots * slot;
  } else {
    grads_in_host = z.offload_optimizer.device == OffloadDevice::nvme
                        ? std::min(kGradientBytes * off, budget_left) / kGradientBytes
                        : 0;
    put(r.gradients, z.offload_optimizer.device, kGradientBytes * (off - grads_in_host));
    r.gradients.host += kGradientBytes * grads_in_host;
    budget_left -= kGradientBytes * grads_in_host;
  }
  std::int64_t states_in_host = 0;  // elements
  if (z.offload_optimizer.device == OffloadDevice::nvme && grads_in_host == off && off > 0) {
    const std::int64_t host_element_bytes = 4 + moment_bytes;  // fp32 masters in host memory
    states_in_host = std::min(off, std::max<std::int64_t>(budget_left, 0) / host_element_bytes);
    r.optimizer_states.host += host_element_bytes * states_in_host;
  }
  put(r.optimizer_states, z.offload_optimizer.device, offloaded_state_bytes(off - states_in_host));

  r.model_states = r.params;
  r.model_states += r.gradients;
  r.model_states += r.optimizer_states;

  // Buffers, by the rules documented in the header: the device's allocated peak (the most
  // bytes of live device buffers at any time, as torch.cuda.max_memory_allocated counts), less
  // the model states.
  const std::int64_t L = std::min(model.largest_layer, psi);
  const std::int64_t m = model.next_largest_layer > 0 ? std::min(model.next_largest_layer, L) : L;
  auto shard_of = [nd](std::int64_t n) { return (n + nd - 1) / nd; };
  // The gradient bucket: its groups' gradients, their flattened copy and the reduced shards.
  const std::int64_t bucket = std::min(z.reduce_bucket_size, psi_t);
  // A reduced shard goes into a buffer of its own (freed once the tier has copied it) unless it
  // lands straight in a device gradient shard (a model state) of one micro-batch.
  const bool own_reduced = (offloaded && off == t) || (stage.shards_grads && config.gradient_accumulation_steps > 1);
  auto reduced = [&](std::int64_t n) { return own_reduced ? shard_of(n) : 0; };
  const bool in_place = coalescing == Coalescing::in_place;
  // Reduced in place (stages 2-3), a bucket needs no flattened copy, and its shards a buffer
  // only where they could not land in the gradient shards.
  const std::int64_t bucketed = in_place && stage.shards_grads ? bucket + reduced(bucket) : 2 * bucket + shard_of(bucket);
  std::int64_t elements = 0;  // of the compute dtype
  if (stage.shards_grads && L > 0) {
    // The module in backward: its gradient and reduced shard; the module before it: the same,
    // freed but given back only at the next module's acquire (the engine's deferred frees).
    const std::int64_t grads = std::max(L + reduced(L) + m + reduced(m), bucketed);
    if (stage.shards_params) {
      const std::int64_t P = std::min(z.stage3_prefetch_bucket_size, psi);
      const bool staged = z.offload_param.device != OffloadDevice::none;
      const std::int64_t staging = staged ? shard_of(L) : 0;
      // The first step (no recorded order: nothing prefetched or kept): the largest module
      // gathered, its shard staged from the parameter tier, and the module before it still held
      // (its gather and its staged shard, freed but given back only at the next module's
      // acquire, and its gradients in `grads`).
      const std::int64_t first = L + staging + m + (staged ? shard_of(m) : 0) + grads;
      // Later steps: modules reused within stage3_max_reuse_distance stay gathered, next ones
      // are prefetched, never past stage3_max_live_parameters (a module's own gather always
      // runs); several groups prefetched together are all-gathered through one staging copy.
      const std::int64_t gathered =
          std::min(psi, std::max(L + P, std::min(z.stage3_max_live_parameters, z.stage3_max_reuse_distance > psi ? psi : z.stage3_max_reuse_distance + L)));
      const std::int64_t coalesced = nd > 1 && P > 0 && gathered < psi ? std::min(psi, P + m) : 0;
      // Packed: the gathered copy and the shards (staged from the tier, or packed); in place:
      // only the shards staged from the parameter tier.
      const std::int64_t coalescing_staging =
          in_place ? (z.offload_param.device != OffloadDevice::none ? shard_of(coalesced) : 0) : coalesced + shard_of(coalesced);
      const std::int64_t later = gathered + grads + coalescing_staging;
      elements = std::max(first, later);
    } else {
      // Stage 2 gives gradient buffers back at step() only (no gathers, so no acquire reaps
      // them): every module's gradient and reduced shard, and the step's new shards (of this
      // step and of the last one, freed after its all-gather in this step's forward).
      const std::int64_t all = psi_t + reduced(psi_t) + 2 * t;
      elements = std::max(grads, all);
    }
  } else if (stage.shards_params) {
    // Largest module unknown: the prefetch bucket gathered and staged once more (a coalesced
    // all-gather's copy and its shards).
    const std::int64_t P = std::min({z.stage3_prefetch_bucket_size, z.stage3_max_live_parameters, psi});
    const std::int64_t staged = z.offload_param.device != OffloadDevice::none ? shard_of(P) : 0;
    elements = bucketed + P + (in_place ? staged : P + shard_of(P));
  } else {
    elements = bucketed;  // stages 0-1 (the gradients are model states, reduced at the step), or L unknown
  }
  r.buffers.device = B * elements;
  if (stage.gathers_updates) {
    // allgather_bucket_size pieces of an updated shard land in a staging buffer (under two
    // pieces' worth, all ranks') when a group holds two buckets or more.
    // (L unknown counts 0.)
    if (L > 0 && L >= 2 * z.allgather_bucket_size) r.buffers.device += B * 2 * z.allgather_bucket_size;
  }
  if (z.offload_param.device == OffloadDevice::none && B != 4 && L > 0) {
    // Construction: 16-bit device parameters are cast from an fp32 chunk on the device.
    const std::int64_t chunk = std::min(std::max(kAlign, z.sub_group_size / kAlign * kAlign),
                                        stage.shards_params ? round_up(shard_of(L), kAlign) : L);
    r.buffers.device = std::max(r.buffers.device, 4 * chunk);
  }
  // Sub-groups never span groups: the largest is bounded by the largest group's shard.
  const std::int64_t sub_group = std::max(kAlign, z.sub_group_size / kAlign * kAlign);
  const std::int64_t module_shard = largest_group > 0 ? round_up((largest_group + nd - 1) / nd, kAlign) : t;
  const std::int64_t largest = std::min({sub_group, module_shard, off});
  if (offloaded && largest > 0) {
    // The update pipeline's pinned staging of one sub-group each (src/core/update/gradient_sink.hpp,
    // update_pipeline.hpp): two for gradients, two for new parameters bound for the device.
    const bool outputs_to_param_tier = stage.shards_params && z.offload_param.device != OffloadDevice::none;
    r.buffers.host += (outputs_to_param_tier ? 2 : 4) * round_up(B * largest, kPage);
  }
  if (offloaded && z.offload_optimizer.device == OffloadDevice::nvme) {
    // Each staging buffer holds a sub-group's states (split masters: then, 64-byte aligned,
    // the fp32 master scratch), page-aligned, then its gradient; one more buffer stages
    // gradient writes.
    const std::int64_t staged = split ? round_up(offloaded_state_bytes(largest), 64) + 4 * largest
                                      : std::max<std::int64_t>(offloaded_state_bytes(largest), 1);
    r.buffers.host += std::int64_t{z.offload_optimizer.buffer_count} *
                          round_up(round_up(staged, kPage) + kGradientBytes * largest, kPage) +
                      round_up(std::max(kPage, kGradientBytes * largest), kPage);
  }
  if (stage.shards_params && z.offload_param.device == OffloadDevice::nvme)
    // As offload::ParamShards: buffer_count pinned buffers (reads + one write-back), each in
    // whole pages; no host cache beyond them.
    r.buffers.host += std::int64_t{z.offload_param.buffer_count} *
                      round_up(std::max(kPage, z.offload_param.buffer_size * B), kPage);

  // NVMe traffic per step (the header's formula).
  const std::int64_t G = config.gradient_accumulation_steps;
  if (offloaded && z.offload_optimizer.device == OffloadDevice::nvme) {
    r.nvme_traffic.read += offloaded_state_bytes(off - states_in_host) + kGradientBytes * G * (off - grads_in_host);
    r.nvme_traffic.written += offloaded_state_bytes(off - states_in_host) + kGradientBytes * G * (off - grads_in_host);
  }
  if (stage.shards_params && z.offload_param.device == OffloadDevice::nvme) {
    r.nvme_traffic.read += 2 * G * (B * r.shard_elements - params_in_host);
    r.nvme_traffic.written += std::max<std::int64_t>(B * t - params_in_host, 0);
    // Split masters: the update reads the shard it rewrites (the masters' high halves), except
    // the first groups' whose shards or states are in host memory (both are kept in order).
    // With the update in backward it takes them from the step's last read of the shard instead
    // (KeptShardReads), which holds while the prefetch reads at most
    // offload_param.buffer_count - 2 modules ahead (a model larger than
    // stage3_prefetch_bucket_size); a deeper prefetch gives some of those reads up and their
    // updates read the shard again.
    if (split && !config.zoe.update_in_backward)
      r.nvme_traffic.read += std::max<std::int64_t>(B * t - std::max(params_in_host, B * states_in_host), 0);
  }

  r.traffic_elements = stage.shards_params ? 2 * psi + psi_t : 2 * psi_t;
  // elements * B * (Nd-1)/Nd without overflow for Ψ up to ~1e15.
  r.traffic_bytes_sent = static_cast<std::int64_t>(
      std::llround(static_cast<double>(r.traffic_elements) * static_cast<double>(B) * static_cast<double>(nd - 1) /
                   static_cast<double>(nd)));
  return r;
}

std::int64_t Cluster::usable_gpu_bytes() const {
  return static_cast<std::int64_t>(static_cast<double>(gpu_bytes) * (1.0 - gpu_headroom));
}

std::int64_t Cluster::usable_host_bytes() const {
  return static_cast<std::int64_t>(static_cast<double>(host_bytes_per_node) * (1.0 - host_headroom));
}

Config::AutoValues auto_values(const AutoInputs& in) {
  if (in.precision != "bf16" && in.precision != "fp16" && in.precision != "fp32")
    ZOE_THROW_CONFIG("--precision", "must be bf16, fp16 or fp32, got '", in.precision, "'");
  Config::AutoValues a;
  a.world_size = in.world_size;
  a.micro_batch_size_per_gpu = in.micro_batch;
  a.gradient_accumulation_steps = in.gradient_accumulation;
  a.fp16 = in.precision == "fp16";
  a.bf16 = in.precision == "bf16";
  a.hidden_size = in.hidden_size;
  // Not read by the memory estimate: fixed stand-ins.
  a.max_grad_norm = 0.0;
  a.lr = 1e-3;
  a.betas = std::array<double, 2>{0.9, 0.999};
  a.eps = 1e-8;
  a.weight_decay = 0.0;
  a.warmup_steps = 1000;
  a.total_steps = 10000;
  a.gather_16bit_weights_on_model_save = false;  // accelerate's default
  return a;
}

Config mixed_precision_knobs() {
  Config c;
  c.bf16.enabled = true;
  return c;
}

namespace {
struct Choice {
  int stage;
  OffloadDevice optimizer, param;
};

std::string label_of(const Choice& c) {
  if (!StagePolicy(c.stage).shards_optimizer) return "stage 0 (plain DP)";
  std::string l = "stage " + std::to_string(c.stage);
  if (c.optimizer != OffloadDevice::none) l += std::string(", optimizer ") + device_name(c.optimizer);
  if (c.param != OffloadDevice::none) l += std::string(", params ") + device_name(c.param);
  return l;
}

PlanRow make_row(const ModelShape& model, const Cluster& cl, Config knobs, const Choice& c, bool binary) {
  auto gib = [binary](std::int64_t bytes) { return format_bytes(bytes, binary); };
  auto& z = knobs.zero_optimization;
  z.stage = c.stage;
  z.offload_optimizer.device = c.optimizer;
  z.offload_optimizer.ratio = 1.0;
  z.offload_param.device = c.param;
  // The rows compare layouts; a layout without offload could not take the update-timing keys
  // (zoe.update_in_backward, zoe.delayed_update), and the estimate does not model them: at
  // stage 3 with every sub-group offloaded (their use) they hold no device byte; at stage 2
  // the update in backward allocates each group's new shard at its backward, not at step().
  knobs.zoe.update_in_backward = knobs.zoe.delayed_update = false;
  // The byte-saving keys stay where the row's layout can take them (validate() refuses them
  // elsewhere): bf16 states need the CPU optimizer, split masters a parameter tier, bf16 compute
  // and states on NVMe, a host budget an NVMe tier to spare.
  if (c.optimizer == OffloadDevice::none) knobs.zoe.optimizer_state_dtype = OptimizerStateDType::fp32;
  if (c.stage != 3 || c.param == OffloadDevice::none || c.optimizer != OffloadDevice::nvme ||
      knobs.compute_dtype() != DType::bf16)
    knobs.zoe.split_master_weights = false;
  if (c.optimizer != OffloadDevice::nvme && !(c.stage == 3 && c.param == OffloadDevice::nvme))
    knobs.zoe.host_memory_budget = 0;
  PlanRow row;
  row.rank = estimate_rank(model, cl.world_size, knobs);
  row.label = label_of(c);
  const auto& r = row.rank;
  const std::int64_t per_node = cl.ranks_per_node();
  row.device_bytes = r.model_states.device + r.buffers.device;
  row.host_bytes_per_node = per_node * (r.model_states.host + r.buffers.host);
  row.nvme_bytes_per_node = per_node * r.model_states.nvme;
  row.fits_device = row.device_bytes <= cl.usable_gpu_bytes();
  row.fits_host = row.host_bytes_per_node <= cl.usable_host_bytes();
  row.fits_nvme = row.nvme_bytes_per_node <= cl.nvme_bytes_per_node;
  std::string s;
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : "; ") + part; };
  if (!row.fits_device)
    add("needs " + gib(row.device_bytes) + " per GPU, " + gib(cl.usable_gpu_bytes()) + " usable");
  if (!row.fits_host)
    add("needs " + gib(row.host_bytes_per_node) + " host memory per node, " + gib(cl.usable_host_bytes()) + " usable");
  if (!row.fits_nvme)
    add("needs " + gib(row.nvme_bytes_per_node) + " NVMe per node, " + gib(cl.nvme_bytes_per_node) + " free");
  row.shortfall = s;
  return row;
}

std::string fit_summary(const PlanRow& row, const Cluster& cl, bool binary) {
  auto gib = [binary](std::int64_t bytes) { return format_bytes(bytes, binary); };
  std::string s = gib(row.device_bytes) + " of " + gib(cl.usable_gpu_bytes()) + " usable per GPU";
  if (row.host_bytes_per_node > 0) s += ", " + gib(row.host_bytes_per_node) + " host memory per node";
  if (row.nvme_bytes_per_node > 0) s += ", " + gib(row.nvme_bytes_per_node) + " NVMe per node";
  return s;
}
}  // namespace

Plan plan(const ModelShape& model, const Cluster& cluster, const Config& knobs, bool binary_units) {
  if (cluster.world_size < 1) ZOE_THROW_CONFIG("world_size", "must be >= 1, got ", cluster.world_size);
  if (cluster.gpus_per_node < 1) ZOE_THROW_CONFIG("gpus_per_node", "must be >= 1, got ", cluster.gpus_per_node);
  if (cluster.gpu_bytes < 0) ZOE_THROW_CONFIG("gpu_bytes", "must be >= 0, got ", cluster.gpu_bytes);
  if (cluster.host_bytes_per_node < 0)
    ZOE_THROW_CONFIG("host_bytes_per_node", "must be >= 0, got ", cluster.host_bytes_per_node);
  if (cluster.nvme_bytes_per_node < 0)
    ZOE_THROW_CONFIG("nvme_bytes_per_node", "must be >= 0, got ", cluster.nvme_bytes_per_node);
  if (!(cluster.gpu_headroom >= 0.0 && cluster.gpu_headroom < 1.0))
    ZOE_THROW_CONFIG("gpu_headroom", "must be in [0, 1), got ", cluster.gpu_headroom);
  if (!(cluster.host_headroom >= 0.0 && cluster.host_headroom < 1.0))
    ZOE_THROW_CONFIG("host_headroom", "must be in [0, 1), got ", cluster.host_headroom);
  knobs.validate();

  using D = OffloadDevice;
  const std::vector<Choice> choices = {
      {0, D::none, D::none}, {1, D::none, D::none}, {1, D::cpu, D::none},  {1, D::nvme, D::none},
      {2, D::none, D::none}, {2, D::cpu, D::none},  {2, D::nvme, D::none}, {3, D::none, D::none},
      {3, D::cpu, D::none},  {3, D::cpu, D::cpu},   {3, D::nvme, D::none}, {3, D::nvme, D::cpu},
      {3, D::nvme, D::nvme}};
  // The rule, as indices into `choices`.
  const std::vector<std::size_t> order = {1, 4, 7, 8, 9, 10, 11, 12};

  Plan p;
  p.model = model;
  p.cluster = cluster;
  for (const auto& c : choices) p.rows.push_back(make_row(model, cluster, knobs, c, binary_units));

  for (std::size_t k = 0; k < order.size(); ++k) {
    const PlanRow& row = p.rows[order[k]];
    if (!row.fits()) continue;
    p.recommended = order[k];
    std::string why = row.label + ": fits (" + fit_summary(row, cluster, binary_units) + ")";
    if (k == 0) {
      why += "; the whole model state fits on one GPU and stage 1 sends no more than plain DP (2 Psi per step)";
    } else {
      const PlanRow& prev = p.rows[order[k - 1]];
      why += "; " + prev.label + " does not (" + prev.shortfall + ")";
      if (StagePolicy(row.rank.stage).shards_params && !StagePolicy(prev.rank.stage).shards_params) why += "; stage 3 sends 1.5x the traffic (3 Psi per step)";
    }
    p.why = why;
    return p;
  }
  const PlanRow& last = p.rows[order.back()];
  p.why = "nothing fits: even " + last.label + " " + last.shortfall;
  return p;
}

Config with_host_memory_budget_resolved(Config config, std::int64_t node_available, std::int64_t node_total,
                                        int ranks_per_node) {
  if (config.zoe.host_memory_budget == ZoeConfig::kHostMemoryBudgetAuto)
    config.zoe.host_memory_budget =
        spare_host_memory_per_rank(HostMemoryReading{node_total, node_available, std::nullopt}, ranks_per_node);
  return config;
}

}  // namespace zoe::estimate
