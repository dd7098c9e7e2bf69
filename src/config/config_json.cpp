// Config <-> DeepSpeed-style JSON. The reading order below is the schema: every key zoe
// knows is named here exactly once, with the type it must have and whether "auto" is allowed.
#include <cerrno>
#include <cmath>
#include <limits>
#include <sstream>

#include "src/common/check.hpp"
#include "src/common/regular_file.hpp"
#include "src/config/config_check.hpp"
#include "src/config/json_reader.hpp"
#include "src/config/strict_parse.hpp"
#include "zoe/config.hpp"

namespace zoe {
namespace {
using config_detail::Auto;
using config_detail::Json;
using config_detail::JsonReader;
using Section = JsonReader::Section;

constexpr std::string_view kNoMonitor = "zoe logs through spdlog (ZOE_LOG_LEVEL); remove the key";

void read_fp16(Section s, Fp16Config& c) {
  s.boolean("enabled", c.enabled, Auto::yes);
  s.number("loss_scale", c.loss_scale);
  s.integer("initial_scale_power", c.initial_scale_power);
  s.integer("loss_scale_window", c.loss_scale_window);
  s.integer("hysteresis", c.hysteresis);
  s.number("min_loss_scale", c.min_loss_scale);
  s.fixed("consecutive_hysteresis", false, "zoe's hysteresis counts all overflows since the last scale change");
  s.fixed("auto_cast", false, "the trainer computes in the dtype of the gathered parameters");
  s.unsupported("fp16_master_weights_and_grads", "master weights are always fp32");
}

void read_optimizer(Section s, OptimizerConfig& c) {
  // DeepSpeed: type "Adam" runs AdamW unless params.adam_w_mode is false.
  enum class Name { adam, adamw } name = c.type == OptimizerType::adam ? Name::adam : Name::adamw;
  const bool typed = s.has("type");
  s.choice("type", name, {{"Adam", Name::adam}, {"AdamW", Name::adamw}});
  Section p = s.section("params");
  p.number("lr", c.lr, Auto::yes);
  p.number_pair("betas", c.betas, Auto::yes);
  p.number("eps", c.eps, Auto::yes);
  p.number("weight_decay", c.weight_decay, Auto::yes);
  bool adam_w_mode = true;
  p.boolean("adam_w_mode", adam_w_mode);
  p.boolean("bias_correction", c.bias_correction);
  p.fixed("amsgrad", false, "AMSGrad is not supported by zoe");
  // DeepSpeed's choice of torch.optim.Adam / AdamW over its fused kernels: the same update,
  // which zoe's Adam / AdamW compute (docs/config.md), so either value is honoured.
  bool torch_adam = false;
  p.boolean("torch_adam", torch_adam);
  if (typed || p.has("adam_w_mode"))
    c.type = (name == Name::adamw || adam_w_mode) ? OptimizerType::adamw : OptimizerType::adam;
}

void read_scheduler(Section s, SchedulerConfig& c) {
  if (!s.has("type")) {
    if (s.has("params")) s.problem("type", "missing: give \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
    s.skip("params");
    return;
  }
  enum class Name { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, lr_range_test } name = Name::none;
  s.choice("type", name, {{"WarmupLR", Name::warmup_lr}, {"WarmupDecayLR", Name::warmup_decay_lr},
                          {"WarmupCosineLR", Name::warmup_cosine_lr}, {"OneCycle", Name::one_cycle},
                          {"LRRangeTest", Name::lr_range_test}});
  if (name == Name::one_cycle || name == Name::lr_range_test) {
    s.problem("type", std::string("DeepSpeed's ") + (name == Name::one_cycle ? "OneCycle" : "LRRangeTest") +
                          " is not implemented by zoe (WarmupLR, WarmupDecayLR and WarmupCosineLR are); set the lr "
                          "with Engine::set_lr instead");
  }
  c.type = name == Name::warmup_lr         ? SchedulerType::warmup_lr
           : name == Name::warmup_decay_lr  ? SchedulerType::warmup_decay_lr
           : name == Name::warmup_cosine_lr ? SchedulerType::warmup_cosine_lr
                                            : SchedulerType::none;
  if (c.type == SchedulerType::none) {
    s.skip("params");  // the type's problem is enough
    return;
  }
  // Each type takes its own DeepSpeed parameters only (another is an unknown key, as DeepSpeed's
  // constructor refuses an unexpected argument).
  Section p = s.section("params");
  const bool cosine = c.type == SchedulerType::warmup_cosine_lr;
  if (!cosine) {
    p.number("warmup_min_lr", c.warmup_min_lr, Auto::yes);
    double max_lr = std::numeric_limits<double>::quiet_NaN();  // stays NaN when absent or "auto"
    p.number("warmup_max_lr", max_lr, Auto::yes);
    if (!std::isnan(max_lr)) c.warmup_max_lr = max_lr;
  } else {
    p.number("warmup_min_ratio", c.warmup_min_ratio);
    p.number("cos_min_ratio", c.cos_min_ratio);
  }
  p.integer("warmup_num_steps", c.warmup_num_steps, Auto::yes);
  p.choice("warmup_type", c.warmup_type, {{"log", WarmupType::log}, {"linear", WarmupType::linear}});
  if (c.type != SchedulerType::warmup_lr) p.integer("total_num_steps", c.total_num_steps, Auto::yes);
  p.fixed("last_batch_iteration", -1,
          "zoe's schedule position is the engine's step count (restored by load_checkpoint)");
}

void read_offload(Section s, OffloadDevice& device, std::string& nvme_path, bool& pin_memory, int& buffer_count) {
  s.choice("device", device, {{"none", OffloadDevice::none}, {"cpu", OffloadDevice::cpu}, {"nvme", OffloadDevice::nvme}});
  s.string("nvme_path", nvme_path);
  s.boolean("pin_memory", pin_memory);
  s.integer("buffer_count", buffer_count);
}

void read_zero(Section s, ZeroConfig& c) {
  s.integer("stage", c.stage);
  s.boolean("overlap_comm", c.overlap_comm);
  s.boolean("contiguous_gradients", c.contiguous_gradients);
  s.integer("reduce_bucket_size", c.reduce_bucket_size, Auto::yes);
  s.integer("allgather_bucket_size", c.allgather_bucket_size);
  s.integer("sub_group_size", c.sub_group_size);
  s.integer("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size, Auto::yes);
  s.integer("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold, Auto::yes);
  s.integer("stage3_max_live_parameters", c.stage3_max_live_parameters);
  s.integer("stage3_max_reuse_distance", c.stage3_max_reuse_distance);

  Section oo = s.section("offload_optimizer");
  auto& o = c.offload_optimizer;
  read_offload(oo, o.device, o.nvme_path, o.pin_memory, o.buffer_count);
  oo.number("ratio", o.ratio);
  oo.unsupported("fast_init", "zoe always initialises NVMe optimizer files the same way");
  oo.unsupported("pipeline_read", "zoe always overlaps sub-group reads with the step");
  oo.unsupported("pipeline_write", "zoe always overlaps sub-group writes with the step");
  oo.unsupported("pipeline", "zoe always pipelines sub-group swaps");

  Section op = s.section("offload_param");
  auto& p = c.offload_param;
  read_offload(op, p.device, p.nvme_path, p.pin_memory, p.buffer_count);
  op.integer("buffer_size", p.buffer_size);
  op.integer("max_in_cpu", p.max_in_cpu);

  s.fixed("reduce_scatter", true, "zoe always reduces gradients with reduce-scatter at stages 1-3");
  s.fixed("allgather_partitions", true, "zoe always all-gathers updated partitions");
  // Deprecated in DeepSpeed, which still maps true to offload_optimizer {"device": "cpu"}.
  bool cpu_offload = false;
  s.boolean("cpu_offload", cpu_offload);
  if (cpu_offload && oo.has("device"))
    s.problem("cpu_offload", "deprecated in DeepSpeed, where true means offload_optimizer.device \"cpu\"; give only one "
                             "of them (DeepSpeed refuses both together)");
  else if (cpu_offload)
    o.device = OffloadDevice::cpu;
  s.unsupported("cpu_offload_params", "deprecated in DeepSpeed; use offload_param.device \"cpu\"");
  s.unsupported("cpu_offload_use_pin_memory", "deprecated in DeepSpeed; use offload_*.pin_memory");
  // One DeepSpeed field under three names (its pydantic alias and a deprecated spelling).
  int gather_names = 0;
  for (const char* key : {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save"}) {
    if (!s.has(key)) continue;
    bool value = c.gather_16bit_weights_on_model_save;
    s.boolean(key, value, Auto::yes);
    if (++gather_names > 1 && value != c.gather_16bit_weights_on_model_save)
      s.problem(key, "gives another value than an earlier spelling of the same DeepSpeed field "
                     "(gather_16bit_weights_on_model_save, alias stage3_gather_16bit_weights_on_model_save, "
                     "deprecated stage3_gather_fp16_weights_on_model_save); give one");
    c.gather_16bit_weights_on_model_save = value;
  }
  s.unsupported("load_from_fp32_weights", "zoe checkpoints always restore the fp32 master weights");
  s.unsupported("elastic_checkpoint", "checkpoints load at the world size that saved them");
  s.unsupported("round_robin_gradients",
                "zoe copies each rank's own gradient shard to the host after its reduce-scatter; there is no "
                "round-robin partitioning to choose");
  s.unsupported("ignore_unused_parameters", "every registered parameter takes part in every step");
  s.unsupported("legacy_stage1", "DeepSpeed's old stage-1 implementation; zoe has one stage 1");
  s.unsupported("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning is not supported by zoe");
  s.unsupported("zero_quantized_weights", "ZeRO++ quantization is not supported by zoe");
  s.unsupported("zero_quantized_gradients", "ZeRO++ quantization is not supported by zoe");
  s.unsupported("mics_shard_size", "MiCS is not supported by zoe");
  s.unsupported("mics_hierarchical_params_gather", "MiCS is not supported by zoe");
  s.unsupported("memory_efficient_linear", "zoe does not wrap the trainer's layers");
  s.unsupported("stage3_model_persistence_threshold",
                "zoe sets no cap on the total of persistent parameters: every stage-3 module smaller than "
                "stage3_param_persistence_threshold stays gathered, as with DeepSpeed's default (unlimited); "
                "remove the key, or lower stage3_param_persistence_threshold to keep fewer modules gathered");
}

void read_aio(Section s, AioConfig& c) {
  s.integer("block_size", c.block_size);
  s.integer("queue_depth", c.queue_depth);
  s.integer("intra_op_parallelism", c.intra_op_parallelism);
  s.boolean("single_submit", c.single_submit);
  s.boolean("overlap_events", c.overlap_events);
  s.unsupported("thread_count", "renamed intra_op_parallelism in DeepSpeed");
  s.unsupported("use_gds", "GPUDirect Storage is not supported by zoe");
}

void read_zoe(Section s, ZoeConfig& c) {
  s.number("comm_timeout_s", c.comm_timeout_s);
  s.integer("optimizer_threads", c.optimizer_threads);
  s.integer("small_module_threshold", c.small_module_threshold);
  s.boolean("require_direct_io", c.require_direct_io);
  s.integer("pinned_budget_bytes", c.pinned_budget_bytes);
  s.integer_or_word("host_memory_budget", c.host_memory_budget, "auto", ZoeConfig::kHostMemoryBudgetAuto);
  s.choice("optimizer_state_dtype", c.optimizer_state_dtype,
           {{"fp32", OptimizerStateDType::fp32}, {"bf16", OptimizerStateDType::bf16}});
  s.boolean("split_master_weights", c.split_master_weights);
  s.boolean("overlap_step", c.overlap_step);
  s.boolean("delayed_update", c.delayed_update);
  s.boolean("update_in_backward", c.update_in_backward);
  s.boolean("debug_poison", c.debug_poison);
}

void read_root(Section s, Config& c) {
  s.integer("train_batch_size", c.train_batch_size, Auto::yes);
  s.integer("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, Auto::yes);
  s.integer("gradient_accumulation_steps", c.gradient_accumulation_steps, Auto::yes);
  s.number("gradient_clipping", c.gradient_clipping, Auto::yes);
  read_fp16(s.section("fp16"), c.fp16);
  s.section("bf16").boolean("enabled", c.bf16.enabled, Auto::yes);
  read_optimizer(s.section("optimizer"), c.optimizer);
  read_scheduler(s.section("scheduler"), c.scheduler);
  read_zero(s.section("zero_optimization"), c.zero_optimization);
  read_aio(s.section("aio"), c.aio);
  read_zoe(s.section("zoe"), c.zoe);

  s.unsupported("bfloat16", "renamed bf16 in DeepSpeed; use \"bf16\": {\"enabled\": true}");
  s.unsupported("amp", "use fp16 or bf16");
  // Logging and timing: zoe's own log lines (Engine::step, Engine's constructor).
  s.integer("steps_per_print", c.steps_per_print);
  s.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  s.boolean("dump_state", c.dump_state);
  s.boolean("memory_breakdown", c.memory_breakdown);
  // DeepSpeed refuses ZeRO with an optimizer it has not tested unless this is true; zoe's only
  // optimizers are its Adam and AdamW, so either value means the same.
  bool allow_untested_optimizer = false;
  s.boolean("zero_allow_untested_optimizer", allow_untested_optimizer);
  // Features that do nothing when disabled are accepted so; enabled, they are refused.
  s.disabled_only("tensorboard", kNoMonitor);
  s.disabled_only("wandb", kNoMonitor);
  s.disabled_only("csv_monitor", kNoMonitor);
  s.disabled_only("comet", kNoMonitor);
  s.disabled_only("comms_logger", "use Engine::last_step_traffic()");
  s.disabled_only("flops_profiler", "zoe does not run the trainer's layers, so it cannot count their FLOPs");
  s.unsupported("activation_checkpointing", "activations belong to the trainer");
  s.unsupported("sparse_attention", "attention is the trainer's; zoe manages parameters, gradients and optimizer states");
  s.unsupported("sparse_gradients", "zoe reduces dense gradient buffers only");
  s.unsupported("pipeline", "pipeline parallelism is not supported by zoe");
  s.disabled_only("data_efficiency", "data loading belongs to the trainer");
  s.disabled_only("curriculum_learning", "data loading belongs to the trainer");
  s.unsupported("compression_training",
                "zoe does not quantize or prune the trainer's layers (DeepSpeed Compression wraps torch modules)");
  s.disabled_only("elasticity", "a run's world size is fixed (a checkpoint loads at any world size, but the batch is not rescaled elastically)");
  s.disabled_only("autotuning", "use zoe-estimate");
  s.disabled_only("torch_autocast", "the trainer computes in the dtype of the gathered parameters (fp16 / bf16)");
  s.unsupported("checkpoint", "use Engine::save_checkpoint / load_checkpoint");
  s.boolean("prescale_gradients", c.prescale_gradients);
  s.number("gradient_predivide_factor", c.gradient_predivide_factor);
  s.unsupported("communication_data_type", "gradients are reduced in the compute dtype");
  s.unsupported("data_types", "gradients are reduced in the compute dtype");
  s.unsupported("zero_force_ds_cpu_optimizer", "zoe always uses its own CPU Adam when offloading");
  // DeepSpeed reads it into its config and never uses it: no effect there, none here.
  bool disable_allgather = false;
  s.boolean("disable_allgather", disable_allgather);
  s.unsupported("optimizer_legacy_fusion", "DeepSpeed's switch for its old fused fp16 optimizer; zoe's optimizer has one path");
}
}  // namespace

namespace {
// `key` is `parent` or lies under it ("a.b" under "a"; "a[0]" under "a").
bool under(const std::string& key, const std::string& parent) {
  if (key.size() < parent.size() || key.compare(0, parent.size(), parent) != 0) return false;
  return key.size() == parent.size() || parent.empty() || key[parent.size()] == '.' || key[parent.size()] == '[';
}
}  // namespace

// The trainer's values for "auto", at the paths Hugging Face fills (transformers'
// HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize).
static void set_autos(JsonReader& r, const Config::AutoValues& a) {
  auto opt = [](const auto& o) { return o ? std::optional<Json>(Json(*o)) : std::nullopt; };
  std::optional<Json> batch;
  if (a.world_size && a.micro_batch_size_per_gpu && a.gradient_accumulation_steps)
    batch = Json(std::int64_t{*a.world_size} * *a.micro_batch_size_per_gpu * *a.gradient_accumulation_steps);
  r.set_auto("train_batch_size", "world_size, micro_batch_size_per_gpu and gradient_accumulation_steps", batch);
  r.set_auto("train_micro_batch_size_per_gpu", "micro_batch_size_per_gpu", opt(a.micro_batch_size_per_gpu));
  r.set_auto("gradient_accumulation_steps", "gradient_accumulation_steps", opt(a.gradient_accumulation_steps));
  r.set_auto("gradient_clipping", "max_grad_norm", opt(a.max_grad_norm));
  r.set_auto("fp16.enabled", "fp16", opt(a.fp16));
  r.set_auto("bf16.enabled", "bf16", opt(a.bf16));
  r.set_auto("optimizer.params.lr", "lr", opt(a.lr));
  r.set_auto("optimizer.params.betas", "betas",
             a.betas ? std::optional<Json>(Json::array({(*a.betas)[0], (*a.betas)[1]})) : std::nullopt);
  r.set_auto("optimizer.params.eps", "eps", opt(a.eps));
  r.set_auto("optimizer.params.weight_decay", "weight_decay", opt(a.weight_decay));
  r.set_auto("scheduler.params.warmup_min_lr", "(none: always 0)", Json(0));
  r.set_auto("scheduler.params.warmup_max_lr", "lr", opt(a.lr));
  r.set_auto("scheduler.params.warmup_num_steps", "warmup_steps", opt(a.warmup_steps));
  r.set_auto("scheduler.params.total_num_steps", "total_steps", opt(a.total_steps));
  std::optional<Json> h2, h09, h10;
  if (a.hidden_size) {
    const std::int64_t h = *a.hidden_size;
    h2 = Json(h * h);
    h09 = Json(static_cast<std::int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h)));
    h10 = Json(10 * h);
  }
  r.set_auto("zero_optimization.reduce_bucket_size", "hidden_size", h2);
  r.set_auto("zero_optimization.stage3_prefetch_bucket_size", "hidden_size", h09);
  r.set_auto("zero_optimization.stage3_param_persistence_threshold", "hidden_size", h10);
  // accelerate fills this one (from DeepSpeedPlugin.zero3_save_16bit_model); the same for the
  // field's other two spellings.
  for (const char* key : {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
                          "zero_optimization.gather_16bit_weights_on_model_save",
                          "zero_optimization.stage3_gather_fp16_weights_on_model_save"})
    r.set_auto(key, "gather_16bit_weights_on_model_save", opt(a.gather_16bit_weights_on_model_save));
}

Config Config::from_json(const std::string& json_text, const AutoValues& auto_values) {
  const Json doc = config_detail::parse_strict(json_text);  // first error only: the text can't be read past it
  Config c;
  JsonReader reader(doc);
  set_autos(reader, auto_values);
  read_root(reader.root(), c);
  reader.reject_unknown_keys();
  std::vector<ConfigError::Problem> problems = reader.problems();
  const std::size_t read_problems = problems.size();
  // A check that read a key which failed to read saw zoe's default, not the file's value:
  // reporting it would blame the file for a value it does not hold.
  auto failed_to_read = [&](const std::string& key) {
    for (std::size_t i = 0; i < read_problems; ++i)
      if (under(key, problems[i].key) || under(problems[i].key, key)) return true;
    return false;
  };
  for (auto& p : config_detail::check(c)) {
    bool skip = failed_to_read(p.key);
    for (const auto& r : p.reads) skip = skip || failed_to_read(r);
    if (!skip) problems.push_back({std::move(p.key), std::move(p.reason)});
  }
  if (!problems.empty()) throw ConfigError(std::move(problems), __FILE__, __LINE__);
  return c;
}

Config Config::from_json_file(const std::string& path, const AutoValues& auto_values) {
  // 64 MiB: far above any real config, and under it a hostile one still gets its clean error.
  constexpr std::uint64_t kMaxConfigFileBytes = std::uint64_t{64} << 20;
  const std::string text = read_regular_file(path, kMaxConfigFileBytes);
  try {
    return from_json(text, auto_values);
  } catch (const ConfigError& e) {
    // The file is named once, after the first problem.
    std::vector<ConfigError::Problem> problems = e.problems();
    problems.front().reason += " (in '" + path + "')";
    throw ConfigError(std::move(problems), e.file(), e.line());
  }
}

std::string Config::to_json() const {
  using OJson = nlohmann::ordered_json;
  auto device = [](OffloadDevice d) { return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none"; };
  const auto& z = zero_optimization;
  OJson j;
  if (train_batch_size != 0) j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  j["gradient_clipping"] = gradient_clipping;
  j["prescale_gradients"] = prescale_gradients;
  j["gradient_predivide_factor"] = gradient_predivide_factor;
  j["steps_per_print"] = steps_per_print;
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  j["dump_state"] = dump_state;
  j["memory_breakdown"] = memory_breakdown;
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", bf16.enabled}};
  OJson params = {{"lr", optimizer.lr},
                  {"betas", {optimizer.betas[0], optimizer.betas[1]}},
                  {"eps", optimizer.eps},
                  {"weight_decay", optimizer.weight_decay},
                  {"bias_correction", optimizer.bias_correction}};
  if (optimizer.type == OptimizerType::adam) params["adam_w_mode"] = false;
  j["optimizer"] = {{"type", optimizer.type == OptimizerType::adam ? "Adam" : "AdamW"}, {"params", params}};
  if (scheduler.type != SchedulerType::none) {
    const auto& sc = scheduler;
    OJson sp;
    const bool cosine = sc.type == SchedulerType::warmup_cosine_lr;
    if (!cosine) {
      sp["warmup_min_lr"] = sc.warmup_min_lr;
      if (sc.warmup_max_lr) sp["warmup_max_lr"] = *sc.warmup_max_lr;
    } else {
      sp["warmup_min_ratio"] = sc.warmup_min_ratio;
      sp["cos_min_ratio"] = sc.cos_min_ratio;
    }
    sp["warmup_num_steps"] = sc.warmup_num_steps;
    sp["warmup_type"] = sc.warmup_type == WarmupType::log ? "log" : "linear";
    if (sc.type != SchedulerType::warmup_lr) sp["total_num_steps"] = sc.total_num_steps;
    j["scheduler"] = {{"type", sc.type == SchedulerType::warmup_lr        ? "WarmupLR"
                               : sc.type == SchedulerType::warmup_decay_lr ? "WarmupDecayLR"
                                                                           : "WarmupCosineLR"},
                      {"params", sp}};
  }
  j["zero_optimization"] = {
      {"stage", z.stage},
      {"overlap_comm", z.overlap_comm},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"sub_group_size", z.sub_group_size},
      {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"stage3_max_live_parameters", z.stage3_max_live_parameters},
      {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
      {"stage3_gather_16bit_weights_on_model_save", z.gather_16bit_weights_on_model_save},
      {"offload_optimizer",
       {{"device", device(z.offload_optimizer.device)},
        {"nvme_path", z.offload_optimizer.nvme_path},
        {"pin_memory", z.offload_optimizer.pin_memory},
        {"buffer_count", z.offload_optimizer.buffer_count},
        {"ratio", z.offload_optimizer.ratio}}},
      {"offload_param",
       {{"device", device(z.offload_param.device)},
        {"nvme_path", z.offload_param.nvme_path},
        {"pin_memory", z.offload_param.pin_memory},
        {"buffer_count", z.offload_param.buffer_count},
        {"buffer_size", z.offload_param.buffer_size},
        {"max_in_cpu", z.offload_param.max_in_cpu}}}};
  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.intra_op_parallelism},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events}};
  j["zoe"] = {{"comm_timeout_s", zoe.comm_timeout_s},
              {"optimizer_threads", zoe.optimizer_threads},
              {"small_module_threshold", zoe.small_module_threshold},
              {"require_direct_io", zoe.require_direct_io},
              {"pinned_budget_bytes", zoe.pinned_budget_bytes},
              {"host_memory_budget", zoe.host_memory_budget == ZoeConfig::kHostMemoryBudgetAuto
                                         ? Json("auto") : Json(zoe.host_memory_budget)},
              {"optimizer_state_dtype", zoe.optimizer_state_dtype == OptimizerStateDType::bf16 ? "bf16" : "fp32"},
              {"split_master_weights", zoe.split_master_weights},
              {"overlap_step", zoe.overlap_step},
              {"delayed_update", zoe.delayed_update},
              {"update_in_backward", zoe.update_in_backward},
              {"debug_poison", zoe.debug_poison}};
  return j.dump(2);
}

}  // namespace zoe
