#include "examples/gpt/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "examples/gpt/error.hpp"
#include "examples/gpt/metrics.hpp"
#include "examples/gpt/model.hpp"
#include "examples/gpt/progress.hpp"
#include "examples/gpt/rank_means.hpp"
#include "examples/gpt/schedule.hpp"
#include "zoe/engine.hpp"

namespace gpt {
namespace {
namespace fs = std::filesystem;

// The model's parameters owned by zoe: registered with the engine (one module per block, plus
// embeddings and head; wte in both), handed to the model module by module.
class EngineProvider final : public ParamProvider<float> {
 public:
  EngineProvider(zoe::Engine& engine, const ModelSpec& spec, std::uint64_t seed)
      : engine_(engine) {
    GPT_CHECK(engine.config().compute_dtype() == zoe::DType::f32,
              "the CPU trainer computes in fp32: disable fp16 and bf16 in the config (got ",
              zoe::dtype_name(engine.config().compute_dtype()), ")");
    std::vector<zoe::ParamId> ids;
    for (const ParamSpec& p : spec.params) {
      const std::vector<float> init = initial_value(p, seed);
      ids.push_back(engine.add_parameter(p.name, p.shape, init));
    }
    for (const ModuleSpec& m : spec.modules) {
      std::vector<zoe::ParamId> params;
      for (int i : m.params) params.push_back(ids[i]);
      modules_.push_back(engine.add_module(m.name, params));
    }
  }

  ModuleView<float> begin_forward(int m) override { return view(engine_.begin_forward(modules_[m])); }
  void end_forward(int m) override { engine_.end_forward(modules_[m]); }
  ModuleView<float> begin_backward(int m) override {
    return view(engine_.begin_backward(modules_[m]));
  }
  void end_backward(int m) override { engine_.end_backward(modules_[m]); }

 private:
  static ModuleView<float> view(const zoe::ModuleTensors& t) {
    ModuleView<float> v;
    for (const auto& p : t.params) v.params.push_back(p.as<float>());
    for (const auto& g : t.grads) v.grads.push_back(g.as<float>());
    return v;
  }

  zoe::Engine& engine_;
  std::vector<zoe::ModuleId> modules_;
};

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
  RankMeans means;
  TrainSummary summary;
};

std::string gib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

void run_rank(zoe::RankContext& ctx, RunShared& sh, int local_rank) {
  const TrainOptions& opt = sh.opt;
  const int world = ctx.world_size, rank = ctx.rank;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(opt.threads_per_rank > 0 ? opt.threads_per_rank
                                               : std::max(1, cores / std::max(1, world)));
  const bool lead = rank == 0 && sh.verbose;

  zoe::Engine engine(opt.engine, ctx);
  GptModel<float> model(opt.model, opt.activation_checkpointing);
  model.set_head_chunk(opt.head_chunk);
  EngineProvider pp(engine, model.spec(), opt.seed);
  const int B = engine.config().train_micro_batch_size_per_gpu;
  const int GA = engine.config().gradient_accumulation_steps;
  const int T = opt.model.context;

  const int start = 0;

  auto evaluate = [&] {
    const int per_rank = std::max(1, (opt.eval_batches + world - 1) / world);
    double sum = 0;
    for (int i = 0; i < per_rank; ++i) {
      const Batch b = sequential_batch(sh.data.val, B, T, static_cast<std::int64_t>(i) * world + rank);
      sum += model.forward(pp, b.inputs.data(), b.targets.data(), B, T, false);
    }
    return sh.means.mean(local_rank, sum / per_rank);
  };

  ProgressBar bar(opt.steps, opt.log_every);
  MetricsWriter metrics(rank == 0 ? opt.metrics_file : std::string());
  const double tokens_per_step = static_cast<double>(world) * GA * B * T;
  double tokens = 0, val = std::nan("");
  for (int step = start; step < opt.steps; ++step) {
    const double lr =
        learning_rate(step, opt.steps, opt.warmup, opt.lr, opt.lr * opt.min_lr_ratio);
    engine.set_lr(lr);
    std::mt19937_64 rng(stream(opt.seed, rank, step));
    double loss = 0;
    for (int mb = 0; mb < GA; ++mb) {
      const Batch b = sample_batch(sh.data.train, B, T, rng);
      loss += model.forward(pp, b.inputs.data(), b.targets.data(), B, T, true);
      model.backward(pp);
    }
    const zoe::StepResult r = engine.step();
    loss = sh.means.mean(local_rank, loss / GA);
    tokens += tokens_per_step;
    const bool last = step + 1 == opt.steps;
    std::optional<double> val_now;
    if (last || (opt.eval_interval > 0 && (step + 1) % opt.eval_interval == 0)) {
      val = evaluate();
      val_now = val;
    }
    if (rank == 0) {
      if (step == start) sh.summary.first_loss = loss;
      sh.summary.last_loss = loss;
      sh.summary.losses.push_back(loss);
      metrics.write({step + 1, loss, lr, r.grad_norm, bar.tokens_per_s(tokens), bar.elapsed_s(), val_now});
      if (sh.verbose) {
        bar.update(step + 1, loss, lr, tokens);
        if (val_now && !last)
          bar.message("step " + std::to_string(step + 1) + ": val loss " + std::to_string(*val_now));
      }
    }
  }
  if (lead) bar.finish();
  if (rank == 0) {
    sh.summary.final_val_loss = val;
    sh.summary.tokens_per_s = bar.tokens_per_s(tokens);
    sh.summary.train_seconds = bar.elapsed_s();
  }
  engine.synchronize();
  if (lead) {
    const zoe::MemoryReport m = engine.memory_report();
    std::printf("rank 0 model states: host %s, nvme %s, device %s; buffers: host %s\n",
                gib(m.host_model_states).c_str(), gib(m.nvme_model_states).c_str(),
                gib(m.device_model_states).c_str(), gib(m.host_buffers).c_str());
  }

  if (opt.sample_length > 0) {  // every rank generates (stage 3 gathers are collectives)
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

}  // namespace

TrainSummary train(const TrainOptions& opt, const TokenSplit& data, const Tokenizer& tokenizer,
                   bool verbose) {
  const bool launcher = opt.from_environment;
  const int local_ranks = launcher ? 1 : opt.world_size;
  RunShared sh{opt, data, tokenizer, verbose, RankMeans(local_ranks, opt.engine.zoe.comm_timeout_s), {}};
  if (launcher) {
    // One rank per process: losses shown are this process's (rank 0's) own.
    zoe::RankContext ctx = zoe::rank_from_environment(opt.engine.zoe.comm_timeout_s);
    sh.verbose = verbose && ctx.rank == 0;
    run_rank(ctx, sh, 0);
  } else {
    auto ranks = zoe::make_local_ranks(opt.world_size, opt.engine.zoe.comm_timeout_s);
    zoe::run_ranks(ranks, [&](zoe::RankContext& ctx) {
      try {
        run_rank(ctx, sh, ctx.rank);
      } catch (...) {
        sh.means.abort();
        throw;
      }
    });
  }
  return sh.summary;
}

}  // namespace gpt
