// The training run: one zoe::Engine per rank (ranks as threads, or one per process under a
// launcher), the GPT model's parameters registered with it, the training loop with evaluation,
// metrics, checkpoints and a text sample at the end. trainer.cpp is the only file of the
// trainer that uses zoe's Engine.
#pragma once

#include "examples/gpt/dataset.hpp"
#include "examples/gpt/options.hpp"
#include "examples/gpt/tokenizer.hpp"

namespace gpt {

/// What a run measured (rank 0's view; losses are means over ranks).
struct TrainSummary {
  double first_loss = 0, last_loss = 0, final_val_loss = 0;
  double tokens_per_s = 0, train_seconds = 0;
  std::vector<double> losses;  // per step
};

/// Trains as `opt` says on `data` (read-only, shared by the rank threads). Prints progress to
/// stderr and the summary to stdout when `verbose`. Throws zoe::Error (or the engine's errors)
/// from any rank.
TrainSummary train(const TrainOptions& opt, const TokenSplit& data, const Tokenizer& tokenizer,
                   bool verbose);

}  // namespace gpt
