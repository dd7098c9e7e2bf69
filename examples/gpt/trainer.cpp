#include "examples/gpt/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "examples/gpt/checkpoint.hpp"
#include "examples/gpt/data_layout.hpp"
#include "examples/gpt/error.hpp"
#include "examples/gpt/hf_weights.hpp"
#include "examples/gpt/kernel_ops.hpp"
#include "examples/gpt/metrics.hpp"
#include "examples/gpt/model.hpp"
#include "examples/gpt/module_copies.hpp"
#include "examples/gpt/proc_stats.hpp"
#include "examples/gpt/progress.hpp"
#include "examples/gpt/schedule.hpp"
#include "examples/gpt/step_profile.hpp"
#include "zoe/engine.hpp"
#if defined(ZOE_GPT_HAVE_CUDA)
#include "examples/gpt/cuda_ops.hpp"
#endif

namespace gpt {
namespace {
namespace fs = std::filesystem;

// The model's parameters owned by zoe: registered with the engine (one module per block, plus
// embeddings and head; wte in both), handed to the model module by module. Initial values: GPT-2's
// seeded init (computed per chunk the engine asks for, fill_initial_value), or a safetensors
// file's tensors (--init-from), each rank reading its own part.
// With an fp32 compute dtype the model reads and adds into the engine's buffers directly; with
// bf16 or fp16 it works on fp32 copies of the open module (module_copies.hpp), whose gradients go
// back rounded to the compute dtype, times the engine's fp16 loss scale (Engine::loss_scale).
class EngineProvider final : public ParamProvider<float> {
 public:
  EngineProvider(zoe::Engine& engine, const ModelSpec& spec, std::uint64_t seed, const InitFile* from)
      : engine_(engine) {
    for (const ParamSpec& p : spec.params) {
      if (from) {
        ids_.push_back(engine.add_parameter(p.name, p.shape, from->initializer(p.name, p.shape)));
        continue;
      }
      // Chunk by chunk as the engine streams the states to their tier: no full-model copy.
      ids_.push_back(engine.add_parameter(p.name, p.shape, [this, p, seed](std::int64_t offset, std::span<float> out) {
        const auto t0 = std::chrono::steady_clock::now();
        fill_initial_value(p, seed, offset, out);
        init_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }));
    }
    // GPT-2 practice (and nanoGPT's, Hugging Face's): no weight decay for biases and LayerNorm
    // gains; the matrices and the embeddings take optimizer.params.weight_decay.
    zoe::ParamOptions no_decay;
    no_decay.weight_decay = 0.0;
    engine.add_param_group({"no_decay", [](const std::string& name) { return !decays(name); }, no_decay});
    for (const ModuleSpec& m : spec.modules) {
      std::vector<zoe::ParamId> params;
      for (int i : m.params) params.push_back(ids_[i]);
      modules_.push_back(engine.add_module(
          m.name, params, m.forward_in_backward ? zoe::ForwardMode::in_backward : zoe::ForwardMode::separate));
    }
  }

  /// The 16-bit storage of the engine's compute dtype; nullopt for fp32.
  std::optional<kernels::Storage16> storage16() const {
    switch (engine_.config().compute_dtype()) {
      case zoe::DType::bf16: return kernels::Storage16::bf16;
      case zoe::DType::f16: return kernels::Storage16::fp16;
      case zoe::DType::f32: break;
    }
    return std::nullopt;
  }
  /// The fp32 working copies (needed, and only used, when storage16() is set); nullptr detaches.
  void set_copies(ModuleCopies* copies) { copies_ = copies; }

  // With a profile: each engine call's time, and the compute between a begin and its end.
  ModuleView<float> begin_forward(int m) override {
    const bool first = !construction;
    const ProcIo io0 = first ? ProcIo::now() : ProcIo{};
    const auto t0 = StepProfile::now();
    ModuleView<float> v = view(engine_.begin_forward(modules_[m]));
    opened_ = stamp(StepProfile::engine_begin_forward, t0);
    if (first)
      construction = Construction{opened_.wall - t0.wall, ProcIo::now().write_bytes - io0.write_bytes, init_seconds_};
    return v;
  }
  void end_forward(int m) override {
    const auto t0 = stamp(m == 0 ? StepProfile::embeddings_forward : StepProfile::blocks_forward, opened_);
    engine_.end_forward(modules_[m]);
    stamp(StepProfile::engine_end_forward, t0);
  }
  ModuleView<float> begin_backward(int m) override {
    const auto t0 = StepProfile::now();
    ModuleView<float> v = view(engine_.begin_backward(modules_[m]));
    opened_ = stamp(StepProfile::engine_begin_backward, t0);
    return v;
  }
  void end_backward(int m) override {
    const auto phase = m == 0 ? StepProfile::embeddings_backward
                       : m + 1 == static_cast<int>(modules_.size()) ? StepProfile::head
                                                                    : StepProfile::blocks_backward;
    if (copies_) copies_->close(open_grads_, static_cast<float>(engine_.loss_scale()));
    const auto t0 = stamp(phase, opened_);
    engine_.end_backward(modules_[m]);
    stamp(StepProfile::engine_end_backward, t0);
  }
  /// Where the provider's stamps go (inactive: nothing counted).
  StepProfile profile;
  /// The first begin_forward of this process: the engine's construction (finalize: the tiers
  /// opened, every initial value streamed to its home) unless a checkpoint was loaded before, plus
  /// module 0's gather. Seconds, and the bytes the process wrote meanwhile (/proc/self/io).
  struct Construction {
    double seconds = 0;
    std::int64_t written = 0;
    double init_seconds = 0;  // of which computing GPT-2's initial values (fill_initial_value)
  };
  std::optional<Construction> construction;
  /// The engine's handle of ModelSpec::params[i].
  zoe::ParamId param(int i) const { return ids_.at(i); }

 private:
  ModuleView<float> view(const zoe::ModuleTensors& t) {
    if (!storage16()) {
      ModuleView<float> v;
      for (const auto& p : t.params) v.params.push_back(p.as<float>());
      for (const auto& g : t.grads) v.grads.push_back(g.as<float>());
      return v;
    }
    GPT_CHECK(copies_ != nullptr, "the engine computes in ", zoe::dtype_name(engine_.config().compute_dtype()),
              " but the trainer set no fp32 working copies");
    auto buffers = [](const std::vector<zoe::TensorView>& ts) {
      std::vector<Buffer16> b;
      for (const auto& x : ts) b.push_back({x.as<std::uint16_t>(), static_cast<std::size_t>(x.numel())});
      return b;
    };
    open_grads_ = buffers(t.grads);
    return copies_->open(buffers(t.params), open_grads_);
  }

  // Adds now - from to phase p; returns now.
  StepProfile::Stamp stamp(StepProfile::Phase p, StepProfile::Stamp from) {
    const auto t = StepProfile::now();
    profile.add(p, from, t);
    return t;
  }

  zoe::Engine& engine_;
  ModuleCopies* copies_ = nullptr;
  std::vector<Buffer16> open_grads_;  // the open backward module's 16-bit gradients
  std::vector<zoe::ParamId> ids_;
  std::vector<zoe::ModuleId> modules_;
  StepProfile::Stamp opened_{};
  double init_seconds_ = 0;  // in the initializers (called on the rank's thread, in finalize)
};

// --profile leaves out this many first steps of a run (thread start, first-touch faults, the
// CPU Adam's store trials).
constexpr int kProfileWarmup = 3;

// Per-(seed, rank, step) data stream: a step's batches depend on nothing else.
std::uint64_t stream(std::uint64_t seed, int rank, int step) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(step) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

int sample_top_k(const std::vector<float>& logits, int k, std::mt19937_64& rng) {
  std::vector<int> idx(logits.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  k = std::min<int>(k, static_cast<int>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  if (k == 1) return idx[0];
  std::vector<double> w(k);
  for (int i = 0; i < k; ++i) w[i] = std::exp(static_cast<double>(logits[idx[i]] - logits[idx[0]]));
  return idx[std::discrete_distribution<int>(w.begin(), w.end())(rng)];
}

struct RunShared {
  const TrainOptions& opt;
  const TokenSplit& data;
  const Tokenizer& tok;
  bool verbose;
  bool gather_parameters;
  std::shared_ptr<const InitFile> init_file;  // --init-from, shared by the rank threads
  DataLayout layout;  // whose data streams define a step's batches (this run's, or the resumed run's)
  TrainSummary summary;  // filled by each process's first rank (with threads: rank 0)
  std::vector<StepProfile> profiles;  // --profile: one per local rank, printed after training
};

// What must not change when a run resumes: the model, the data layout (data_layout.hpp), the
// batches, the seed and the data (a step's batches are a function of these and the step number).
nlohmann::json run_identity(const TrainOptions& opt, const TokenSplit& data, const DataLayout& layout, int B) {
  return {{"vocab_size", opt.model.vocab_size}, {"layers", opt.model.n_layer},
          {"heads", opt.model.n_head},          {"width", opt.model.n_embd},
          {"context", opt.model.context},       {"world_size", layout.ranks},
          {"micro_batch", B},                   {"micro_batches", layout.micro_batches},
          {"seed", opt.seed},                   {"train_tokens", data.train.size()},
          {"val_tokens", data.val.size()}};
}

std::string gib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The training loop of one rank on `model` (a GptModel over the backend where the engine's
// tensors live).
template <class Model>
void train_rank(zoe::Engine& engine, Model& model, EngineProvider& pp, RunShared& sh,
                int local_rank) {
  const TrainOptions& opt = sh.opt;
  const int world = engine.world_size(), rank = engine.rank();
  const bool lead = rank == 0 && sh.verbose;
  const int B = engine.config().train_micro_batch_size_per_gpu;
  const int GA = engine.config().gradient_accumulation_steps;
  const int T = opt.model.context;

  TrainerState state;
  state.run = run_identity(opt, sh.data, sh.layout, B);
  state.last_val_loss = std::nan("");
  if (opt.resume) {
    engine.load_checkpoint(engine_checkpoint_dir(opt.checkpoint_dir));
    state = load_trainer_state(opt.checkpoint_dir, engine.global_step(), engine.lr(), state.run);
    if (lead) {
      std::printf("resumed from '%s' after step %d (%s)\n", opt.checkpoint_dir.c_str(), state.step,
                  opt.eval_only ? "evaluating only" : state.step >= opt.steps ? "nothing left to train" : "continuing");
      std::fflush(stdout);
    }
  }
  const int start = state.step;
  // --eval-only: no step; the loop below is skipped and the model is evaluated and sampled.
  const int stop = opt.eval_only ? start : opt.stop_after > 0 ? std::min(opt.stop_after, opt.steps) : opt.steps;
  const double elapsed_before = state.elapsed_s;

  auto evaluate = [&] {
    const int per_rank = std::max(1, (opt.eval_batches + world - 1) / world);
    double sum = 0;
    for (int i = 0; i < per_rank; ++i) {
      const Batch b = sequential_batch(sh.data.val, B, T, static_cast<std::int64_t>(i) * world + rank);
      sum += model.forward(pp, b.inputs.data(), b.targets.data(), B, T);
    }
    return engine.all_reduce(sum / per_rank, zoe::ScalarReduce::mean, "val loss");
  };

  ProgressBar bar(start, opt.steps, opt.log_every);
  // Saves the engine's states and the trainer's (checkpoint.hpp gives the order and why).
  auto checkpoint = [&] {
    state.engine_step = engine.global_step();
    state.engine_lr = engine.lr();
    state.elapsed_s = elapsed_before + bar.elapsed_s();
    if (rank == 0) save_trainer_state(opt.checkpoint_dir, state);
    engine.save_checkpoint(engine_checkpoint_dir(opt.checkpoint_dir));
    if (rank == 0) remove_other_trainer_states(opt.checkpoint_dir, state.step);
  };

  MetricsWriter metrics(rank == 0 ? opt.metrics_file : std::string(), start);
  // --step-report: one record per step, from its start to the next step's (the update of step k
  // runs on during step k+1's forward), the last to the end of its update (synchronize).
  struct StepRecord {
    double wall = 0, compute = 0, engine = 0;
    std::int64_t read = 0, written = 0;
  };
  std::vector<StepRecord> records;
  struct Mark {
    double wall = 0, compute = 0, engine = 0;
    ProcIo io;
  };
  auto mark = [&] {
    const StepProfile& p = pp.profile;
    Mark m{StepProfile::now().wall, p.seconds(StepProfile::other), 0, ProcIo::now()};
    for (int k = 0; k < StepProfile::other; ++k) {
      const auto ph = static_cast<StepProfile::Phase>(k);
      (ph >= StepProfile::engine_begin_forward ? m.engine : m.compute) += p.seconds(ph);
    }
    return m;
  };
  std::optional<Mark> open_mark;
  auto close_record = [&] {
    if (!opt.step_report || !open_mark) return;
    const Mark m = mark();
    records.push_back({m.wall - open_mark->wall, m.compute - open_mark->compute, m.engine - open_mark->engine,
                       m.io.read_bytes - open_mark->io.read_bytes, m.io.write_bytes - open_mark->io.write_bytes});
    open_mark.reset();
    if (lead) {
      const StepRecord& r = records.back();
      std::printf("step-report: step %zu: %.2f s; trainer compute %.2f s, in engine calls %.2f s; NVMe read %.3f GB, "
                  "written %.3f GB (/proc/self/io)\n",
                  records.size() + static_cast<std::size_t>(start), r.wall, r.compute, r.engine, r.read / 1e9,
                  r.written / 1e9);
      std::fflush(stdout);
    }
  };
  const double tokens_per_step = static_cast<double>(world) * GA * B * T;
  double tokens = 0;  // this process's run
  std::vector<double> loss_scales;  // this process's steps
  std::vector<int> skipped;
  for (int step = start; step < stop; ++step) {
    // A config's scheduler drives the lr (Engine::set_lr would be refused); else zoe-gpt's own.
    const bool scheduled = engine.config().scheduler.type != zoe::SchedulerType::none;
    const double lr =
        scheduled ? engine.lr() : learning_rate(step, opt.steps, opt.warmup, opt.lr, opt.lr * opt.min_lr_ratio);
    if (!scheduled) engine.set_lr(lr);
    // Micro-batch mb is micro-batch slot.micro_batch of data rank slot.rank: drawn from that
    // rank's stream after the ones before it (the same batches whatever the world size).
    std::optional<std::mt19937_64> rng;
    int rng_rank = -1, drawn = 0;
    double loss = 0;
    StepProfile& prof = pp.profile;
    prof.active = (opt.profile && step >= start + kProfileWarmup) || opt.step_report;
    close_record();
    if (opt.step_report) open_mark = mark();
    const auto step_begin = StepProfile::now();
    for (int mb = 0; mb < GA; ++mb) {
      const auto t0 = StepProfile::now();
      const DataSlot slot = data_slot(sh.layout, rank, GA, mb);
      if (slot.rank != rng_rank) {
        rng.emplace(stream(opt.seed, slot.rank, step));
        rng_rank = slot.rank;
        drawn = 0;
      }
      for (; drawn < slot.micro_batch; ++drawn) (void)sample_batch(sh.data.train, B, T, *rng);
      const Batch b = sample_batch(sh.data.train, B, T, *rng);
      ++drawn;
      prof.add(StepProfile::batch, t0, StepProfile::now());
      loss += model.forward_backward(pp, b.inputs.data(), b.targets.data(), B, T);
    }
    const auto step_call = StepProfile::now();
    const zoe::StepResult r = engine.step();
    const auto step_end = StepProfile::now();
    prof.add(StepProfile::engine_step, step_call, step_end);
    prof.add_step(step_begin, step_end);
    prof.active = false;
    if (step + 1 == stop && opt.step_report) {
      engine.synchronize();  // the last update's I/O belongs to this step
      close_record();
    }
    // The mean over every rank (all processes under a launcher), as the metrics file says.
    loss = engine.all_reduce(loss / GA, zoe::ScalarReduce::mean, "train loss");
    tokens += tokens_per_step;
    state.step = step + 1;
    state.tokens += tokens_per_step;
    state.losses.push_back(loss);
    loss_scales.push_back(r.loss_scale);
    if (r.skipped) skipped.push_back(step);
    if (step == 0) state.first_loss = loss;
    const bool last = step + 1 == stop;
    std::optional<double> val_now;
    if (last || (opt.eval_interval > 0 && (step + 1) % opt.eval_interval == 0)) {
      val_now = evaluate();
      state.last_val_loss = *val_now;
    }
    if (rank == 0) {
      metrics.write({step + 1, loss, lr, r.grad_norm, bar.tokens_per_s(tokens),
                     elapsed_before + bar.elapsed_s(), val_now});
      if (sh.verbose) {
        bar.update(step + 1, loss, lr, tokens);
        if (r.skipped)
          bar.message("step " + std::to_string(step + 1) + ": skipped (fp16 gradient overflow), loss scale " +
                      std::to_string(r.loss_scale));
        if (val_now && !last)
          bar.message("step " + std::to_string(step + 1) + ": val loss " + std::to_string(*val_now));
      }
    }
    if (!opt.checkpoint_dir.empty() &&
        (last || (opt.checkpoint_interval > 0 && (step + 1) % opt.checkpoint_interval == 0))) {
      checkpoint();
      if (lead && !last)
        bar.message("step " + std::to_string(step + 1) + ": checkpoint saved to " + opt.checkpoint_dir);
    }
  }
  if (stop <= start) state.last_val_loss = evaluate();  // resumed with nothing left to train
  if (lead && opt.step_report && !records.empty()) {
    // Steady state: the records between the first (which pays the construction and first
    // touches) and the last (which also waits for its own update): each holds one update and
    // one forward + backward.
    StepRecord mean;
    const std::size_t from = records.size() > 2 ? 1 : records.size() - 1;
    const std::size_t to = records.size() > 2 ? records.size() - 1 : records.size();
    for (std::size_t i = from; i < to; ++i) {
      mean.wall += records[i].wall;
      mean.compute += records[i].compute;
      mean.engine += records[i].engine;
      mean.read += records[i].read;
      mean.written += records[i].written;
    }
    const double n = static_cast<double>(to - from);
    std::printf("step-report: mean of steps %zu-%zu: %.2f s per step; trainer compute %.2f s; NVMe read %.3f GB, "
                "written %.3f GB per step\n",
                from + 1 + static_cast<std::size_t>(start), to + static_cast<std::size_t>(start),
                mean.wall / n, mean.compute / n, mean.read / n / 1e9, mean.written / n / 1e9);
  }
  if (opt.profile) sh.profiles[local_rank] = pp.profile;
  if (lead) bar.finish();
  if (lead && !opt.checkpoint_dir.empty() && stop > start)
    std::printf("checkpoint of step %d saved to '%s'%s\n", stop, opt.checkpoint_dir.c_str(),
                stop < opt.steps ? " (continue with --resume)" : "");
  // Every process's first rank: the losses are means over all ranks, the same on every process.
  if (local_rank == 0) {
    sh.summary.start_step = start;
    sh.summary.losses = state.losses;
    sh.summary.loss_scales = loss_scales;
    sh.summary.skipped_steps = skipped;
    sh.summary.first_loss = state.first_loss;
    sh.summary.last_loss = state.losses.empty() ? std::nan("") : state.losses.back();
    sh.summary.final_val_loss = state.last_val_loss;
    sh.summary.tokens_per_s = bar.tokens_per_s(tokens);
    sh.summary.train_seconds = bar.elapsed_s();
  }
  if (!opt.export_path.empty()) {  // a collective: every rank streams its part, rank 0 writes
    engine.export_safetensors(opt.export_path, opt.export_dtype, export_metadata(opt.model));
    if (lead) {
      std::printf("parameters of step %d exported to '%s' (safetensors, %s, Hugging Face GPT-2 names)\n", state.step,
                  opt.export_path.c_str(), zoe::dtype_name(opt.export_dtype).data());
      std::fflush(stdout);
    }
  }
  if (sh.gather_parameters) {  // a collective: every rank gathers every parameter
    const ModelSpec& spec = model.spec();
    for (std::size_t i = 0; i < spec.params.size(); ++i) {
      std::vector<float> value = engine.gather_parameter(pp.param(static_cast<int>(i)));
      if (rank == 0) sh.summary.parameters[spec.params[i].name] = std::move(value);
    }
  }
  engine.synchronize();
  if (rank == 0) sh.summary.memory = engine.memory_report();
  if (lead) {
    const zoe::MemoryReport m = engine.memory_report();
    std::printf("rank 0 model states: host %s, nvme %s, device %s; buffers: host %s\n",
                gib(m.host_model_states).c_str(), gib(m.nvme_model_states).c_str(),
                gib(m.device_model_states).c_str(), gib(m.host_buffers).c_str());
    if (opt.step_report) {
      if (pp.construction)
        std::printf("step-report: construction (first begin_forward) %.2f s, %.3f GB written (%.3f GB/s), of which "
                    "%.2f s computing the initial values; nvme model states %.3f GB\n",
                    pp.construction->seconds, pp.construction->written / 1e9,
                    pp.construction->written / 1e9 / pp.construction->seconds, pp.construction->init_seconds,
                    m.nvme_model_states / 1e9);
      std::printf("step-report: host memory: VmHWM %.3f GiB, VmRSS %.3f GiB; pinned staging %.3f GiB; host buffers "
                  "%.3f GiB, host model states %.3f GiB; device buffers %.3f GiB, device model states %.3f GiB, "
                  "device allocated peak %.3f GiB, reserved peak %.3f GiB (%s)\n",
                  proc_status_bytes("VmHWM") / 1073741824.0, proc_status_bytes("VmRSS") / 1073741824.0,
                  m.host_pinned_peak / 1073741824.0, m.host_buffers / 1073741824.0,
                  m.host_model_states / 1073741824.0, m.device_buffers / 1073741824.0,
                  m.device_model_states / 1073741824.0, m.device_peak / 1073741824.0,
                  m.device_reserved_peak / 1073741824.0,
                  engine.compute_place().kind == zoe::DeviceKind::host ? "the host device: in host memory"
                                                                       : "on the GPU");
      std::fflush(stdout);
    }
  }

  if (opt.sample_length > 0 && (stop == opt.steps || opt.eval_only)) {  // every rank generates (stage 3 gathers are collectives)
    std::vector<TokenId> text = sh.tok.encode(opt.prompt);
    if (text.empty()) text.push_back(sh.tok.end_of_text());
    const std::size_t prompt_len = text.size();
    std::mt19937_64 rng(opt.seed);
    std::vector<float> logits;
    for (int i = 0; i < opt.sample_length; ++i) {
      const std::size_t n = std::min<std::size_t>(text.size(), T);
      std::vector<std::int32_t> window(text.end() - n, text.end());
      model.last_logits(pp, window.data(), 1, static_cast<int>(n), logits);
      text.push_back(static_cast<TokenId>(sample_top_k(logits, opt.top_k, rng)));
    }
    if (lead) {
      const std::vector<TokenId> generated(text.begin() + prompt_len, text.end());
      std::printf("sample (top-k %d, seed %llu):\n%s%s\n", opt.top_k,
                  static_cast<unsigned long long>(opt.seed), opt.prompt.c_str(),
                  sh.tok.decode(generated).c_str());
    }
  }
}

// One rank: its engine, the model's parameters registered with it, and the model on the
// backend where the engine computes (Engine::compute_place): CpuOps on the host device,
// CudaOps (cuBLAS and kernels, on the engine's compute stream) on a GPU.
void run_rank(zoe::RankContext& ctx, RunShared& sh, int local_rank) {
  const TrainOptions& opt = sh.opt;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(opt.threads_per_rank > 0 ? opt.threads_per_rank
                                               : std::max(1, cores / std::max(1, ctx.world_size)));
  zoe::Engine engine(opt.engine, ctx);
  const ModelSpec spec = make_model_spec(opt.model);
  EngineProvider pp(engine, spec, opt.seed, sh.init_file.get());
  const zoe::ComputePlace place = engine.compute_place();
  auto train_on = [&](auto ops, const std::string& what) {
    if (ctx.rank == 0 && sh.verbose) {
      std::printf("compute: %s; %s parameters and gradients, fp32 master weights and states\n", what.c_str(),
                  zoe::dtype_name(engine.config().compute_dtype()).data());
      std::fflush(stdout);
    }
    GptModel<float, decltype(ops)> model(opt.model, opt.activation_checkpointing, std::move(ops));
    model.set_head_chunk(opt.head_chunk);
    model.set_head_precision(opt.head_precision);
    std::optional<OpsModuleCopies<decltype(ops)>> copies;
    if (const auto storage = pp.storage16()) {
      copies.emplace(model.ops(), *storage);
      pp.set_copies(&*copies);
    }
    train_rank(engine, model, pp, sh, local_rank);
    pp.set_copies(nullptr);
  };
  if (place.kind == zoe::DeviceKind::host) {
    if (opt.host_ops == TrainOptions::HostOps::kernels) {
      train_on(KernelOps<float>(), "host, the CUDA backend's kernels run on the CPU (--host-ops kernels)");
    } else {
      train_on(CpuOps<float>(), "host, CPU ops (Eigen; oneDNN head, " +
                                    head_precision_name(opt.head_precision) + " training matmuls)");
    }
    return;
  }
#if defined(ZOE_GPT_HAVE_CUDA)
  train_on(CudaOps(place.ordinal, place.stream),
           "cuda:" + std::to_string(place.ordinal) + ", cuBLAS and the CUDA backend's kernels (" +
               head_precision_name(opt.head_precision) + " head training matmuls)");
#else
  GPT_CHECK(false, "rank ", ctx.rank, " computes on a ", zoe::device_kind_name(place.kind),
            " device, but this zoe-gpt was built without its CUDA backend (needs nvcc and cuBLAS "
            "at build time); run without --launcher to train on the CPU");
#endif
}

}  // namespace

// The data layout of this run: its own ranks and micro-batches, or on --resume the checkpointed
// run's. A resume at another world size runs layout.total() / world micro-batches per rank
// instead (the global batch and the data order stay; one line says so); `opt`'s
// gradient_accumulation_steps (and train_batch_size if set) change to match.
DataLayout resumed_layout(TrainOptions& opt, int world, bool verbose) {
  zoe::Config& c = opt.engine;
  DataLayout layout{world, c.gradient_accumulation_steps};
  if (!opt.resume) return layout;
  const nlohmann::json run = saved_run_identity(opt.checkpoint_dir);
  const auto saved = [&](const char* key) {
    const auto it = run.find(key);
    GPT_CHECK(it != run.end() && it->is_number_integer() && it->get<std::int64_t>() >= 1 &&
                  it->get<std::int64_t>() <= 1 << 20,
              "checkpoint '", opt.checkpoint_dir, "': its trainer state's run has no valid '", key, "'");
    return static_cast<int>(it->get<std::int64_t>());
  };
  layout = {saved("world_size"), saved("micro_batches")};
  if (layout.ranks == world) return layout;  // the micro-batches are checked with the rest of the run
  c.gradient_accumulation_steps = micro_batches_at(layout, world);
  if (c.train_batch_size != 0)
    c.train_batch_size = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * world;
  if (verbose) {
    std::printf("%s\n", relayout_message(layout, world, c.train_micro_batch_size_per_gpu, opt.model.context).c_str());
    std::fflush(stdout);
  }
  return layout;
}

TrainSummary train(const TrainOptions& given, const TokenSplit& data, const Tokenizer& tokenizer,
                   bool verbose, bool gather_parameters) {
  TrainOptions opt = given;  // a resume at another world size changes the micro-batches per rank
  const bool launcher = opt.from_environment;
  const int local_ranks = launcher ? 1 : opt.world_size;  // rank threads in this process
  if (opt.resume)
    GPT_CHECK(fs::is_directory(engine_checkpoint_dir(opt.checkpoint_dir)) ||
                  fs::is_directory(engine_checkpoint_dir(opt.checkpoint_dir) + ".old"),
              "--resume: no checkpoint at '", opt.checkpoint_dir, "' (expected '",
              engine_checkpoint_dir(opt.checkpoint_dir), "' written by --checkpoint-dir)");
  // Checked once against the model before any engine exists: a wrong file fails here, naming the tensor.
  std::shared_ptr<const InitFile> init_file;
  if (!opt.init_from.empty()) init_file = std::make_shared<const InitFile>(opt.init_from, make_model_spec(opt.model));
  // One rank per process under a launcher; the losses shown are means over all ranks (Engine::all_reduce).
  std::optional<zoe::RankContext> launched;
  if (launcher) launched = zoe::rank_from_environment(opt.engine.zoe.comm_timeout_s);
  const int world = launcher ? launched->world_size : opt.world_size;
  const bool lead_verbose = verbose && (!launcher || launched->rank == 0);
  const DataLayout layout = resumed_layout(opt, world, lead_verbose);
  RunShared sh{opt,    data, tokenizer, verbose, gather_parameters, init_file, layout, {},
               std::vector<StepProfile>(local_ranks)};
  if (launcher) {
    sh.verbose = lead_verbose;
    run_rank(*launched, sh, 0);
  } else {
    auto ranks = zoe::make_local_ranks(opt.world_size, opt.engine.zoe.comm_timeout_s);
    zoe::run_ranks(ranks, [&](zoe::RankContext& ctx) { run_rank(ctx, sh, ctx.rank); });
  }
  if (opt.profile && sh.verbose)
    for (int r = 0; r < local_ranks; ++r) sh.profiles[r].print(r);
  return sh.summary;
}

}  // namespace gpt
