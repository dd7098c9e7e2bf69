// A one-line progress bar on stderr: step, loss, tokens/s and ETA; redrawn in place on a
// terminal, printed every `every` steps otherwise (logs, CI).
// Thread-safety: not thread-safe (rank 0 draws).
#pragma once

#include <chrono>
#include <string>

namespace gpt {

class ProgressBar {
 public:
  /// A run from step `first_step` (0, or the step a resumed run continues after) to `total_steps`.
  ProgressBar(int first_step, int total_steps, int every);
  /// Step `step` (1-based) done; `tokens` processed since the start of this run.
  void update(int step, double loss, double lr, double tokens);
  /// Ends the line.
  void finish();
  double elapsed_s() const;
  /// Tokens per second since the start of this run.
  double tokens_per_s(double tokens) const;
  /// Prints a message on its own line, keeping the bar.
  void message(const std::string& text);

 private:
  int first_, total_, every_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace gpt
