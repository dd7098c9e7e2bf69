// The trainer's checkpoints: zoe's engine checkpoint (model and optimizer states) plus the
// trainer's own state (step, schedule, metrics so far), so that --resume continues the exact
// same run.
//
// Layout of a checkpoint directory DIR:
//   DIR/engine/            Engine::save_checkpoint's files (it swaps DIR/engine.tmp into place)
//   DIR/trainer-<S>.json   the trainer's state after step S (written atomically: temp + rename)
//
// Order of a save: trainer-<S>.json first, then the engine's files, then older trainer files are
// removed. A failure at any point leaves a readable engine checkpoint (the engine guarantees it)
// and the trainer file that belongs to it: on load, the trainer file is the one whose recorded
// engine step count and learning rate equal the loaded engine's, so a trainer file written just
// before a failed engine save is ignored.
//
// The data order needs no state: step S's batches are a pure function of (seed, data layout, S)
// (data_layout.hpp), whatever the world size the run resumes at.
// Thread-safety: free functions; the callers serialize writes (rank 0 writes, after barriers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpt {

/// What a run must keep for its continuation to be the same run.
struct TrainerState {
  int step = 0;                  // optimizer steps of the schedule done (1-based count)
  std::int64_t engine_step = 0;  // Engine::global_step() at the save (skipped steps not counted)
  double engine_lr = 0;          // Engine::lr() at the save (the lr of step `step`)
  double tokens = 0;             // training tokens processed over all ranks so far
  double elapsed_s = 0;          // training seconds so far, over all previous runs
  double first_loss = 0;         // train loss of step 1 (nats)
  double last_val_loss = 0;      // NaN when not evaluated yet
  std::vector<double> losses;    // train loss of every step so far (nats), `step` entries
  /// What must not change across a resume (model shape, data layout, batch, seed, data size);
  /// compared key by key on load. "world_size" and "micro_batches" are the data layout
  /// (data_layout.hpp: the first run's ranks and micro-batches per rank), which a run resumed at
  /// another world size keeps.
  nlohmann::json run;
};

/// DIR/engine: where the engine's files go.
std::string engine_checkpoint_dir(const std::string& dir);

/// Writes DIR/trainer-<state.step>.json atomically (temp file + rename), creating DIR.
/// Throws zoe::Error naming the file when it cannot be written.
void save_trainer_state(const std::string& dir, const TrainerState& state);

/// Removes DIR/trainer-*.json other than the one of `keep_step` (after a successful engine save).
void remove_other_trainer_states(const std::string& dir, int keep_step);

/// The run identity (TrainerState::run) of DIR's newest trainer state, read before any engine
/// exists (a resume at another world size needs the data layout first). Throws zoe::Error naming
/// DIR when it has no trainer file, naming the file when it cannot be parsed.
nlohmann::json saved_run_identity(const std::string& dir);

/// The newest trainer state in DIR whose engine_step and engine_lr equal the loaded engine's
/// (`engine_step`, `engine_lr`, bitwise), checked against `run` (every key must be equal).
/// Throws zoe::Error naming DIR when no trainer file matches, naming the file when one cannot be
/// parsed, and naming the key and both values when the run differs.
TrainerState load_trainer_state(const std::string& dir, std::int64_t engine_step, double engine_lr,
                                const nlohmann::json& run);

}  // namespace gpt
