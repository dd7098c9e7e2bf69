#include "examples/gpt/options.hpp"

#include <CLI/CLI.hpp>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "examples/gpt/cli_checks.hpp"
#include "examples/gpt/error.hpp"

namespace gpt {
namespace {
constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Ranks as threads of one process: each has its compute, side-stream and I/O threads, so past
// this the process runs out of threads (100000 failed as "Resource temporarily unavailable").
constexpr std::int64_t kMaxThreadRanks = 1024;

zoe::OffloadDevice offload_device(const std::string& s) {
  if (s == "none") return zoe::OffloadDevice::none;
  if (s == "cpu") return zoe::OffloadDevice::cpu;
  return zoe::OffloadDevice::nvme;  // CLI11 checked the value
}

std::string default_data_dir() {
  if (const char* env = std::getenv("ZOE_GPT_DATA")) return env;
  return "data/gpt";
}

}  // namespace

TrainOptions parse_options(int argc, char** argv) {
  TrainOptions o;
  CLI::App app{"Train a GPT-2 model on 18 public-domain books with zoe (ZeRO, offload)."};
  // Engine-side values, applied to zoe::Config below when given or when the --config file does
  // not set the key (zoe-gpt's defaults, not zoe::Config's).
  int batch = 8, micro_batches = 1, stage = 3;
  double weight_decay = 0.1, grad_clip = 1.0;
  std::string offload_opt = "nvme", offload_param = "none";
  std::string nvme_path = (std::filesystem::temp_directory_path() / "zoe_gpt_nvme").string();
  std::string config_path;
  const auto offload_check = CLI::IsMember({"none", "cpu", "nvme"});
  // A flag given twice takes its last value, so wrappers (scripts/run-main.sh) can pass their
  // defaults first and the user's arguments after them.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  app.add_option("--layers", o.model.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--heads", o.model.n_head, "attention heads")->capture_default_str();
  app.add_option("--width", o.model.n_embd, "embedding width C")->capture_default_str();
  app.add_option("--context", o.model.context, "sequence length T")->capture_default_str();
  auto* o_batch = app.add_option("--batch", batch, "sequences per micro-batch per rank")->capture_default_str();
  auto* o_micro = app.add_option("--micro-batches", micro_batches, "micro-batches per step (gradient accumulation)")->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->check(integer_in(1, kMaxInt))->capture_default_str();
  auto* o_lr = app.add_option("--lr", o.lr, "peak learning rate")->check(real_in(0.0, kInf))->capture_default_str();
  app.add_option("--min-lr-ratio", o.min_lr_ratio, "cosine floor as a fraction of --lr")->check(real_in(0.0, 1.0))->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear warmup steps")->check(integer_in(0, kMaxInt))->capture_default_str();
  auto* o_wd = app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  auto* o_clip = app.add_option("--grad-clip", grad_clip, "global gradient-norm clip (0 = off)")->capture_default_str();
  auto* o_stage = app.add_option("--zero-stage", stage, "ZeRO stage 0-3")->check(CLI::Range(0, 3))->capture_default_str();
  auto* o_offopt = app.add_option("--offload-optimizer", offload_opt, "optimizer states: none|cpu|nvme")->check(offload_check)->capture_default_str();
  auto* o_offpar = app.add_option("--offload-param", offload_param, "parameters (stage 3): none|cpu|nvme")->check(offload_check)->capture_default_str();
  auto* o_nvme = app.add_option("--nvme-path", nvme_path, "directory of the NVMe tier's files")->capture_default_str();
  app.add_option("--world-size", o.world_size, "ranks (threads of this process)")->check(integer_in(1, kMaxThreadRanks))->capture_default_str();
  app.add_flag("--launcher", o.from_environment, "one rank per process from torchrun/mpirun/srun variables (on a GPU with a CUDA build: one GPU per process)");
  app.add_option("--threads-per-rank", o.threads_per_rank, "compute threads per rank (0 = cores / world size)")->check(integer_in(0, 1024))->capture_default_str();
  app.add_option("--config", config_path, "DeepSpeed-style JSON config; flags given override it, keys it leaves out keep zoe-gpt's defaults, \"auto\" takes the flags' values")->check(CLI::ExistingFile);
  app.add_option("--data-dir", o.data_dir, "data from scripts/fetch-data.sh (default $ZOE_GPT_DATA or data/gpt)");
  app.add_option("--cache-dir", o.cache_dir, "token cache (default <data-dir>/tokens)");
  app.add_option("--val-fraction", o.val_fraction, "last fraction of each book held out")->capture_default_str();
  app.add_option("--seed", o.seed, "initialization, data order and sampling")->check(integer_in(0))->capture_default_str();
  app.add_option("--metrics", o.metrics_file, "per-step metrics file (.csv, else JSON Lines)");
  app.add_option("--eval-interval", o.eval_interval, "steps between validation losses (0 = end only)")->check(integer_in(0, kMaxInt))->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "validation micro-batches per evaluation")->check(integer_in(1, kMaxInt))->capture_default_str();
  app.add_flag("--activation-checkpointing", o.activation_checkpointing, "recompute each block's forward in backward");
  app.add_option("--sample-length", o.sample_length, "tokens generated at the end")->check(integer_in(0, kMaxInt))->capture_default_str();
  app.add_option("--top-k", o.top_k, "sampling from the k most likely tokens (1 = greedy)")->check(integer_in(1, kMaxInt))->capture_default_str();
  app.add_option("--prompt", o.prompt, "text the sample continues");
  app.add_option("--log-every", o.log_every, "steps between progress lines when not on a terminal")->check(integer_in(1, kMaxInt))->capture_default_str();
  std::string head_precision = head_precision_name(o.head_precision);
  app.add_option("--head-precision", head_precision,
                 "lm_head matmuls in training: bf16 (bf16 operands, fp32 accumulation) or fp32; evaluation is fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))->capture_default_str();
  std::string precision = "fp32";
  auto* o_prec = app.add_option("--precision", precision,
                 "compute parameters and gradients: fp32, bf16 or fp16 (dynamic loss scaling), with fp32 master weights "
                 "and optimizer states; without the flag a --config file's fp16/bf16 \"enabled\" applies")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->capture_default_str();
  std::string host_ops = "cpu";
  app.add_option("--host-ops", host_ops,
                 "compute on a host rank: cpu (Eigen, oneDNN) or kernels (the CUDA backend's math on the host: slow, for checking it)")
      ->check(CLI::IsMember({"cpu", "kernels"}))->capture_default_str();
  app.add_option("--head-chunk", o.head_chunk, "rows per chunk of the fused lm_head + cross-entropy")->check(integer_in(1, kMaxInt))->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "save checkpoints (engine + trainer state) here");
  app.add_option("--checkpoint-interval", o.checkpoint_interval, "steps between checkpoints (0 = only at the end)")->check(integer_in(0, kMaxInt))->capture_default_str();
  app.add_flag("--resume", o.resume, "continue the run checkpointed in --checkpoint-dir");
  app.add_flag("--profile", o.profile, "print where each rank's step time goes (timers; steps after the first 3)");
  app.add_flag("--step-report", o.step_report,
               "per step: wall time, compute time, NVMe bytes read/written (/proc/self/io); at the end construction time, "
               "VmHWM, pinned staging (one process: ranks as threads share the counters)");
  app.add_option("--stop-after", o.stop_after, "stop after this step, checkpointed, to --resume later (0 = run all --steps)")->check(integer_in(0, kMaxInt))->capture_default_str();
  app.add_option("--init-from", o.init_from,
                 "start from the parameters in this safetensors file (HF GPT-2 names and layout, e.g. one --export wrote): fine-tuning")
      ->check(CLI::ExistingFile);
  app.add_option("--export", o.export_path,
                 "at the end, write the parameters to this safetensors file (HF GPT-2 names, Conv1D [in, out] layout, wte once)");
  std::string export_dtype = "fp32";
  app.add_option("--export-dtype", export_dtype, "dtype of --export: fp32 (the master weights) or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_flag("--eval-only", o.eval_only,
               "no training: the validation loss and the sample of the model from --resume, --init-from or the seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }

  o.head_precision = parse_head_precision(head_precision, "--head-precision");
  o.host_ops = host_ops == "kernels" ? TrainOptions::HostOps::kernels : TrainOptions::HostOps::cpu;
  if (o.data_dir.empty()) o.data_dir = default_data_dir();
  if (o.cache_dir.empty()) o.cache_dir = (std::filesystem::path(o.data_dir) / "tokens").string();
  GPT_CHECK(!o.resume || !o.checkpoint_dir.empty(), "--resume needs --checkpoint-dir DIR");
  o.export_dtype = export_dtype == "bf16" ? zoe::DType::bf16 : zoe::DType::f32;
  GPT_CHECK(o.init_from.empty() || !o.resume,
            "--init-from and --resume both give the starting parameters: --resume continues the checkpointed run, "
            "--init-from starts a new one from a file");
  GPT_CHECK(!o.eval_only || o.stop_after == 0, "--eval-only trains no step: --stop-after has nothing to stop");
  GPT_CHECK(o.stop_after == 0 || !o.checkpoint_dir.empty(),
            "--stop-after needs --checkpoint-dir DIR (where the run continues from)");
  o.model.vocab_size = 50257;
  o.model.validate();

  const bool from_file = !config_path.empty();
  zoe::Config& c = o.engine;
  if (from_file) {
    // "auto" keys take zoe-gpt's values (Hugging Face's meaning: the trainer's arguments).
    zoe::Config::AutoValues a;
    a.micro_batch_size_per_gpu = batch;
    a.gradient_accumulation_steps = micro_batches;
    if (!o.from_environment) a.world_size = o.world_size;
    a.max_grad_norm = grad_clip;
    a.lr = o.lr;
    a.betas = std::array<double, 2>{0.9, 0.95};
    a.eps = zoe::OptimizerConfig{}.eps;
    a.weight_decay = weight_decay;
    a.fp16 = precision == "fp16";
    a.bf16 = precision == "bf16";
    a.warmup_steps = o.warmup;
    a.total_steps = o.steps;
    a.hidden_size = o.model.n_embd;
    a.gather_16bit_weights_on_model_save = !o.export_path.empty();  // consolidated only for --export
    c = zoe::Config::from_json_file(config_path, a);
  }
  // Which keys the file writes (it parsed above, so it is valid JSON): a key it leaves out keeps
  // zoe-gpt's own default, not zoe::Config's; a flag given overrides the file.
  nlohmann::json file;
  if (from_file) {
    std::ifstream in(config_path);
    file = nlohmann::json::parse(in);
  }
  auto in_file = [&](const char* pointer) { return from_file && file.contains(nlohmann::json::json_pointer(pointer)); };
  auto use_flag = [&](CLI::Option* opt, const char* pointer) { return opt->count() > 0 || !in_file(pointer); };
  if (use_flag(o_batch, "/train_micro_batch_size_per_gpu")) c.train_micro_batch_size_per_gpu = batch;
  if (use_flag(o_micro, "/gradient_accumulation_steps")) c.gradient_accumulation_steps = micro_batches;
  if (use_flag(o_lr, "/optimizer/params/lr")) c.optimizer.lr = o.lr;
  else o.lr = c.optimizer.lr;
  if (use_flag(o_wd, "/optimizer/params/weight_decay")) c.optimizer.weight_decay = weight_decay;
  if (use_flag(o_clip, "/gradient_clipping")) c.gradient_clipping = grad_clip;
  if (use_flag(o_stage, "/zero_optimization/stage")) c.zero_optimization.stage = stage;
  // zoe-gpt's default offload goes with its default stage: a file whose stage cannot offload
  // (optimizer states: stage 0; parameters: below 3) keeps DeepSpeed's none unless the flag
  // is given.
  const int st = c.zero_optimization.stage;
  if (use_flag(o_offopt, "/zero_optimization/offload_optimizer/device") && (o_offopt->count() > 0 || st >= 1))
    c.zero_optimization.offload_optimizer.device = offload_device(offload_opt);
  if (use_flag(o_offpar, "/zero_optimization/offload_param/device") && (o_offpar->count() > 0 || st == 3))
    c.zero_optimization.offload_param.device = offload_device(offload_param);
  if (use_flag(o_nvme, "/zero_optimization/offload_optimizer/nvme_path"))
    c.zero_optimization.offload_optimizer.nvme_path = nvme_path;
  if (use_flag(o_nvme, "/zero_optimization/offload_param/nvme_path")) c.zero_optimization.offload_param.nvme_path = nvme_path;
  // --precision, or the file's fp16/bf16 "enabled" when the flag is not given (zoe-gpt's default
  // fp32 when the file says neither); the file's loss-scaler keys apply either way.
  if (o_prec->count() > 0 || (!in_file("/fp16/enabled") && !in_file("/bf16/enabled"))) {
    c.fp16.enabled = precision == "fp16";
    c.bf16.enabled = precision == "bf16";
  }
  if (!in_file("/optimizer/type") && !in_file("/optimizer/params/adam_w_mode")) c.optimizer.type = zoe::OptimizerType::adamw;
  if (!in_file("/optimizer/params/betas")) c.optimizer.betas = {0.9, 0.95};  // GPT-3's betas
  c.validate();
  // Refused now, not after the training: the engine's export would refuse at the end.
  if (!o.export_path.empty() && c.zero_optimization.stage == 3 && !c.zero_optimization.gather_16bit_weights_on_model_save)
    GPT_THROW("--export ", o.export_path, ": the config's zero_optimization.stage3_gather_16bit_weights_on_model_save is "
              "false, which forbids consolidating the stage-3 model into one file (as DeepSpeed's save_16bit_model); "
              "set it true or drop --export");
  return o;
}

}  // namespace gpt
