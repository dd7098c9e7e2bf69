// zoe-torch-llama-bench: training tokens/s of examples/torch_llama's Llama-style model through
// zoe::TorchModel, each figure a ratio to plain libtorch (the same model, torch::optim::AdamW,
// same batches) measured in the same run:
//  - zoe stage 0, no offload (the adapter's bookkeeping: goal >= 0.9 of plain libtorch);
//  - zoe ZeRO-3 with the optimizer states on NVMe (stage 3 recomputes each part's forward in
//    its backward, and the optimizer step streams its states through the NVMe tier).
// One rank, random tokens (no data files needed), fp32 or bf16. Plain and zoe runs alternate
// (--rounds) and each case keeps its best round, so a burst of load on the shared machine does
// not decide the ratio.
// --json: one JSON object per line {bench, case, value, unit, bound, ratio, cpu, cpus, load}.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "bench/machine.hpp"
#include "examples/torch_llama/zoe_forward.hpp"
#include "zoe/engine.hpp"
#include "zoe/torch.hpp"

namespace {

struct Options {
  llama::LlamaConfig model;
  int batch = 8, context = 128, steps = 5, rounds = 2, threads = 0;
  std::string dtype = "fp32";
  std::string nvme_path = "/tmp/zoe_torch_llama_bench";
  bool json = false;
};

using Clock = std::chrono::steady_clock;

torch::Tensor batch_ids(const Options& o, int step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return torch::randint(o.model.vocab, {o.batch, o.context + 1}, gen, torch::kLong);
}

llama::LlamaForCausalLM make_model(const Options& o) {
  torch::manual_seed(1);
  llama::LlamaForCausalLM m(o.model);
  if (o.dtype == "bf16") m->to(torch::kBFloat16);
  return m;
}

// Seconds per step of plain libtorch (one warm-up step not counted).
double plain_seconds(const Options& o) {
  llama::LlamaForCausalLM m = make_model(o);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  double secs = 0;
  for (int s = 0; s <= o.steps; ++s) {
    torch::Tensor ids = batch_ids(o, s);
    auto t0 = Clock::now();
    opt.zero_grad();
    llama::lm_loss(m->forward(ids.narrow(1, 0, o.context)), ids.narrow(1, 1, o.context)).backward();
    opt.step();
    if (s > 0) secs += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return secs / o.steps;
}

double zoe_seconds(const Options& o, int stage, bool nvme) {
  zoe::Config c;
  c.zero_optimization.stage = stage;
  c.bf16.enabled = o.dtype == "bf16";
  c.optimizer.lr = 1e-3;
  c.optimizer.weight_decay = 0.1;
  if (nvme) {
    std::filesystem::create_directories(o.nvme_path);
    c.zero_optimization.offload_optimizer.device = zoe::OffloadDevice::nvme;
    c.zero_optimization.offload_optimizer.nvme_path = o.nvme_path;
  }
  double secs = 0;
  zoe::run_ranks(zoe::make_local_ranks(1), [&](zoe::RankContext& ctx) {
    torch::set_num_threads(o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
    zoe::Engine engine(c, ctx);
    torch::manual_seed(1);
    llama::LlamaForCausalLM m(o.model);
    zoe::TorchModel model(engine, m.ptr(), llama::zoe_parts(*m, false));
    for (int s = 0; s <= o.steps; ++s) {
      torch::Tensor ids = batch_ids(o, s);
      auto t0 = Clock::now();
      llama::lm_loss(llama::zoe_forward(model, *m, ids.narrow(1, 0, o.context)), ids.narrow(1, 1, o.context)).backward();
      engine.step();
      engine.synchronize();
      if (s > 0) secs += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  });
  return secs / o.steps;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.model.layers = 4;
  o.model.dim = 256;
  o.model.heads = 8;
  o.model.kv_heads = 2;
  o.model.hidden = 704;
  o.model.vocab = 8192;
  CLI::App app{"Tokens/s of a libtorch Llama through zoe against plain libtorch, in the same run."};
  app.add_option("--layers", o.model.layers)->capture_default_str();
  app.add_option("--dim", o.model.dim)->capture_default_str();
  app.add_option("--heads", o.model.heads)->capture_default_str();
  app.add_option("--kv-heads", o.model.kv_heads)->capture_default_str();
  app.add_option("--hidden", o.model.hidden)->capture_default_str();
  app.add_option("--vocab", o.model.vocab)->capture_default_str();
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--context", o.context)->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per round")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--rounds", o.rounds, "rounds of (plain, zoe stage 0, zoe stage 3)")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--threads", o.threads, "torch intra-op threads (0: torch's default)");
  app.add_option("--nvme-path", o.nvme_path)->capture_default_str();
  app.add_flag("--json", o.json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
  double plain = 1e300, zoe0 = 1e300, zoe3 = 1e300;
  for (int r = 0; r < o.rounds; ++r) {
    plain = std::min(plain, plain_seconds(o));
    zoe0 = std::min(zoe0, zoe_seconds(o, 0, false));
    zoe3 = std::min(zoe3, zoe_seconds(o, 3, true));
  }
  const double tokens = double(o.batch) * o.context;
  auto line = [&](const std::string& name, double secs, const std::string& explain) {
    double value = tokens / secs, bound = tokens / plain;
    if (o.json) {
      nlohmann::json j{{"bench", "torch_llama"}, {"case", name}, {"value", value}, {"unit", "tokens/s"},
                       {"bound", bound}, {"ratio", value / bound}, {"dtype", o.dtype},
                       {"layers", o.model.layers}, {"dim", o.model.dim}, {"batch", o.batch}, {"context", o.context},
                       {"threads", torch::get_num_threads()}, {"explain", explain},
                       {"cpu", zoe::bench::cpu_model()}, {"cpus", zoe::bench::online_cpus()},
                       {"load", zoe::bench::load_average()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-28s %10.0f tokens/s, plain libtorch %10.0f, ratio %.3f\n", name.c_str(), value, bound, value / bound);
    }
  };
  line("zoe stage 0", zoe0, "bound: plain libtorch + torch::optim::AdamW, same model and batches, same run");
  line("zoe stage 3 nvme states", zoe3, "bound: plain libtorch; stage 3 recomputes forwards, states on NVMe");
  return 0;
}
