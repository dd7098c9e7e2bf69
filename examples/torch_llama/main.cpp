// zoe-torch-llama: trains the Llama-style decoder of model.hpp, written in libtorch C++, through
// zoe (ZeRO-3 by default, optimizer states on NVMe, ranks as threads) on the books of
// examples/gpt with the GPT-2 tokenizer. --export writes safetensors with Hugging Face's Llama
// names; --init-from reads such a file back (fine-tuning). docs/torch.md.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "examples/gpt/dataset.hpp"
#include "examples/torch_llama/zoe_forward.hpp"
#include "zoe/engine.hpp"
#include "zoe/safetensors.hpp"
#include "zoe/torch.hpp"

namespace {

struct Options {
  llama::LlamaConfig model;
  std::string data_dir, cache_dir;
  int ranks = 2;
  int stage = 3;
  std::string offload = "nvme";  // optimizer states: none, cpu, nvme
  std::string nvme_path = "/tmp/zoe_torch_llama";
  std::string dtype = "bf16";
  int steps = 200;
  int batch = 8;  // sequences per rank and step
  int context = 64;
  double lr = 3e-3;
  double weight_decay = 0.1;
  int eval_batches = 8;
  int threads = 0;  // torch intra-op threads per rank; 0: cores / ranks
  bool checkpoint = false;
  std::uint64_t seed = 1;
  std::string export_path, init_from;
};

torch::Tensor to_tensor(const std::vector<std::int32_t>& v, int batch, int context) {
  return torch::from_blob(const_cast<std::int32_t*>(v.data()), {batch, context}, torch::kInt).to(torch::kLong);
}

// Copies every parameter of `m` from the safetensors file (Hugging Face names), before wrapping.
void init_from(llama::LlamaForCausalLMImpl& m, const std::string& path) {
  auto file = zoe::SafetensorsFile::open(path);
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    const zoe::SafetensorsTensor* t = file->find(p.key());
    if (!t) throw zoe::Error("--init-from " + path + ": no tensor '" + p.key() + "'", __FILE__, __LINE__);
    if (t->shape != p.value().sizes().vec())
      throw zoe::Error("--init-from " + path + ": tensor '" + p.key() + "' has another shape than the model's",
                       __FILE__, __LINE__);
    torch::Tensor v = torch::empty(p.value().sizes(), torch::kFloat);
    file->read_f32(p.key(), 0, std::span<float>(v.data_ptr<float>(), v.numel()));
    p.value().copy_(v);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  CLI::App app{"Train a Llama-style libtorch model on the books of examples/gpt through zoe."};
  app.add_option("--data-dir", o.data_dir, "data from scripts/fetch-data.sh (default $ZOE_GPT_DATA or data/gpt)");
  app.add_option("--cache-dir", o.cache_dir, "token cache (default <data-dir>/tokens)");
  app.add_option("--ranks", o.ranks, "ranks as threads")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--offload-optimizer", o.offload, "optimizer states: none, cpu, nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->capture_default_str();
  app.add_option("--nvme-path", o.nvme_path, "directory of the NVMe tier's files")->capture_default_str();
  app.add_option("--dtype", o.dtype, "compute dtype")->check(CLI::IsMember({"bf16", "fp32"}))->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(0, 1 << 30))->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per rank and step")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--context", o.context, "tokens per sequence")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--layers", o.model.layers, "decoder layers")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dim", o.model.dim, "model width")->check(CLI::Range(8, 1 << 16))->capture_default_str();
  app.add_option("--heads", o.model.heads, "attention heads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--kv-heads", o.model.kv_heads, "key/value heads (grouped-query attention)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--hidden", o.model.hidden, "SwiGLU width")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "validation batches at the end")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--threads", o.threads, "torch intra-op threads per rank (0: cores / ranks)")->check(CLI::Range(0, 1024));
  app.add_flag("--checkpoint", o.checkpoint, "recompute each decoder layer in its backward");
  app.add_option("--seed", o.seed, "seed of the initial values and the batches")->capture_default_str();
  app.add_option("--export", o.export_path, "write the trained model here (safetensors, Hugging Face Llama names, fp32)");
  app.add_option("--init-from", o.init_from, "start from this safetensors file (Hugging Face Llama names)");
  CLI11_PARSE(app, argc, argv);
  if (o.model.dim % o.model.heads || o.model.heads % o.model.kv_heads || o.model.head_dim() % 2)
    throw zoe::Error("--dim must be a multiple of --heads (with an even head size) and --heads of --kv-heads",
                     __FILE__, __LINE__);
  if (o.data_dir.empty()) o.data_dir = std::getenv("ZOE_GPT_DATA") ? std::getenv("ZOE_GPT_DATA") : "data/gpt";
  if (o.cache_dir.empty()) o.cache_dir = (std::filesystem::path(o.data_dir) / "tokens").string();
  // OpenMP's thread count is per calling thread: each rank sets it (default: the cores shared out).
  const int threads = o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()) / o.ranks);

  gpt::TokenSplit data = gpt::load_or_build_tokens(o.data_dir, o.cache_dir, 0.05, 2);
  const double entropy = gpt::unigram_entropy(data.train);
  std::printf("data: %zu train tokens, %zu val tokens; unigram entropy %.3f nats\n", data.train.size(),
              data.val.size(), entropy);

  zoe::Config c;
  c.zero_optimization.stage = o.stage;
  c.bf16.enabled = o.dtype == "bf16";
  c.optimizer.lr = o.lr;
  c.optimizer.weight_decay = o.weight_decay;
  c.optimizer.betas = {0.9, 0.95};
  c.gradient_clipping = 1.0;
  c.zero_optimization.gather_16bit_weights_on_model_save = true;
  c.zero_optimization.offload_optimizer.device =
      o.offload == "nvme" ? zoe::OffloadDevice::nvme : o.offload == "cpu" ? zoe::OffloadDevice::cpu : zoe::OffloadDevice::none;
  c.zero_optimization.offload_optimizer.nvme_path = o.nvme_path;
  std::filesystem::create_directories(o.nvme_path);

  // The models are built here, one after the other: torch's generator is process-wide.
  std::vector<llama::LlamaForCausalLM> models;
  for (int r = 0; r < o.ranks; ++r) {
    torch::manual_seed(o.seed);
    models.emplace_back(o.model);
    if (!o.init_from.empty()) init_from(*models.back(), o.init_from);
  }
  std::printf("model: %lld parameters, %lld layers, dim %lld, %lld heads (%lld kv), %s, ZeRO-%d, optimizer states on %s, %d ranks\n",
              static_cast<long long>([&] { std::int64_t n = 0; for (auto& p : models[0]->parameters()) n += p.numel(); return n; }()),
              static_cast<long long>(o.model.layers), static_cast<long long>(o.model.dim), static_cast<long long>(o.model.heads),
              static_cast<long long>(o.model.kv_heads), o.dtype.c_str(), o.stage, o.offload.c_str(), o.ranks);
  std::mutex print;
  zoe::run_ranks(zoe::make_local_ranks(o.ranks), [&](zoe::RankContext& ctx) {
    torch::set_num_threads(threads);
    zoe::Engine engine(c, ctx);
    llama::LlamaForCausalLMImpl& m = *models[ctx.rank];
    zoe::TorchModel model(engine, models[ctx.rank].ptr(), llama::zoe_parts(m, o.checkpoint));
    std::mt19937_64 rng(o.seed * 1000 + ctx.rank);
    auto start = std::chrono::steady_clock::now();
    for (int s = 1; s <= o.steps; ++s) {
      gpt::Batch b = gpt::sample_batch(data.train, o.batch, o.context, rng);
      torch::Tensor loss = llama::lm_loss(llama::zoe_forward(model, m, to_tensor(b.inputs, o.batch, o.context)),
                                          to_tensor(b.targets, o.batch, o.context));
      (loss * engine.loss_scale()).backward();
      zoe::StepResult r = engine.step();
      double mean = engine.all_reduce(loss.item<double>(), zoe::ScalarReduce::mean, "loss");
      if (ctx.rank == 0 && (s % 10 == 0 || s == 1 || s == o.steps)) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::lock_guard<std::mutex> lock(print);
        std::printf("step %d: loss %.4f, grad norm %.3f, %.0f tokens/s\n", s, mean, r.grad_norm,
                    double(s) * o.batch * o.context * o.ranks / secs);
        std::fflush(stdout);
      }
    }
    double val = 0;
    {
      torch::NoGradGuard no_grad;
      for (int i = 0; i < o.eval_batches; ++i) {
        gpt::Batch b = gpt::sequential_batch(data.val, o.batch, o.context, i * o.ranks + ctx.rank);
        val += llama::lm_loss(llama::zoe_forward(model, m, to_tensor(b.inputs, o.batch, o.context)),
                              to_tensor(b.targets, o.batch, o.context)).item<double>();
      }
    }
    val = engine.all_reduce(o.eval_batches ? val / o.eval_batches : 0.0, zoe::ScalarReduce::mean, "val_loss");
    if (ctx.rank == 0 && o.eval_batches)
      std::printf("validation loss %.4f nats (unigram entropy %.3f: %s)\n", val, entropy,
                  val < entropy ? "below, the model uses context" : "not below yet");
    if (!o.export_path.empty()) {
      engine.export_safetensors(o.export_path, zoe::DType::f32, {{"format", "pt"}});
      if (ctx.rank == 0) std::printf("exported %s\n", o.export_path.c_str());
    }
  });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "zoe-torch-llama: %s\n", e.what());
  return 1;
}
