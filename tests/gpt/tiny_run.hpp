// A tiny trainer run for the engine tests: learnable synthetic tokens (vocabulary 64) and a
// 2-layer, width-16 GPT over 2 ranks (threads), one compute thread each, so a run takes a
// fraction of a second.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "examples/gpt/trainer.hpp"

namespace gpt::test {

/// A repeating pattern with noise: learnable, so the loss must fall.
inline TokenSplit synthetic_tokens() {
  TokenSplit d;
  std::mt19937_64 rng(9);
  for (int i = 0; i < 4000; ++i)
    d.train.push_back(static_cast<TokenId>(rng() % 7 == 0 ? rng() % 64 : (i * 5) % 64));
  for (int i = 0; i < 600; ++i) d.val.push_back(static_cast<TokenId>((i * 5) % 64));
  return d;
}

/// `steps` steps (warmup 1, cosine), 2 ranks, 2 micro-batches of 2 x 16 tokens per rank.
inline TrainOptions tiny(int stage, zoe::OffloadDevice offload, const std::string& nvme, int steps = 6) {
  TrainOptions o;
  o.model.vocab_size = 64;
  o.model.context = 16;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.model.n_embd = 16;
  o.steps = steps;
  o.lr = 1e-2;
  o.warmup = 1;
  o.world_size = 2;
  o.threads_per_rank = 1;
  o.eval_interval = 0;
  o.eval_batches = 2;
  o.sample_length = 0;
  o.seed = 7;
  o.engine.train_micro_batch_size_per_gpu = 2;
  o.engine.gradient_accumulation_steps = 2;
  o.engine.gradient_clipping = 1.0;
  o.engine.zero_optimization.stage = stage;
  o.engine.zero_optimization.offload_optimizer.device = offload;
  o.engine.zero_optimization.offload_optimizer.nvme_path = nvme;
  return o;
}

/// A fresh directory under the temp dir, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("zoe_gpt_" + tag + "_" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace gpt::test
