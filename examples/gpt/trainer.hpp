// The training run: one zoe::Engine per rank (ranks as threads, or one per process under a
// launcher), the GPT model's parameters registered with it, the training loop with evaluation,
// metrics, checkpoints and a text sample at the end. trainer.cpp is the only file of the
// trainer that uses zoe's Engine.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "examples/gpt/dataset.hpp"
#include "examples/gpt/options.hpp"
#include "examples/gpt/tokenizer.hpp"
#include "zoe/engine.hpp"

namespace gpt {

/// What a run measured (rank 0's view; losses are means over ranks).
struct TrainSummary {
  int start_step = 0;          // steps done before this process (a resumed run), else 0
  double first_loss = 0, last_loss = 0, final_val_loss = 0;  // nats; of the whole run
  double tokens_per_s = 0, train_seconds = 0;                // this process's part
  std::vector<double> losses;  // train loss per step of the whole run, resumed parts included
  /// Per step of this process: the fp16 loss scale the step used (StepResult::loss_scale; 1
  /// unless fp16), and the (0-based) steps the engine skipped for an inf/NaN gradient.
  std::vector<double> loss_scales;
  std::vector<int> skipped_steps;
  /// Rank 0's Engine::memory_report() after the last step (bytes; device_peak: its allocated
  /// peak over the whole run).
  zoe::MemoryReport memory;
  /// Final fp32 master values by HF name (numel floats each), when train() was asked for them.
  std::map<std::string, std::vector<float>> parameters;
};

/// Trains as `opt` says on `data` (read-only, shared by the rank threads): from step 0, or with
/// opt.resume from the checkpoint in opt.checkpoint_dir, up to opt.steps (or opt.stop_after),
/// checkpointing every opt.checkpoint_interval steps and at the end when opt.checkpoint_dir is
/// set. Prints progress to stderr and the summary to stdout when `verbose`. With
/// `gather_parameters`, also returns every parameter's final value (Engine::gather_parameter).
/// Resuming at another world size keeps the global batch and the data order (data_layout.hpp):
/// each rank runs the checkpointed run's ranks x micro-batches / world micro-batches per step
/// (opt.engine.gradient_accumulation_steps is replaced), and one line says so.
/// Throws zoe::Error naming the path when the checkpoint to resume is missing, corrupt or from
/// another run (model, batch, seed or data differ), naming the world sizes that work when this
/// one cannot split the checkpointed run's micro-batches evenly, and the engine's errors from any rank.
TrainSummary train(const TrainOptions& opt, const TokenSplit& data, const Tokenizer& tokenizer,
                   bool verbose, bool gather_parameters = false);

}  // namespace gpt
