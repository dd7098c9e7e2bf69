// Metrics file: one row per optimizer step, CSV (path ends in .csv) or JSON Lines (otherwise).
// Columns: step, loss (mean train loss over ranks and micro-batches, nats), val_loss (nats, empty
// / null when not evaluated at this step), lr, grad_norm, tokens_per_s, elapsed_s.
// Thread-safety: not thread-safe (rank 0 writes).
#pragma once

#include <fstream>
#include <optional>
#include <string>

namespace gpt {

struct StepMetrics {
  int step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  std::optional<double> val_loss;
};

class MetricsWriter {
 public:
  /// Opens `path`; an empty path writes nothing. A fresh run (`resume_step` 0) truncates it; a
  /// resumed run keeps the rows of steps <= `resume_step` (rows after it, from a run that went on
  /// past its last checkpoint, are dropped) and appends. Throws zoe::Error naming the file if it
  /// cannot be read or created.
  explicit MetricsWriter(const std::string& path, int resume_step = 0);
  void write(const StepMetrics& m);

 private:
  std::ofstream out_;
  bool csv_ = false;
  bool enabled_ = false;
};

}  // namespace gpt
