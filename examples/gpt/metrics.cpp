#include "examples/gpt/metrics.hpp"

#include <nlohmann/json.hpp>

#include "examples/gpt/error.hpp"

namespace gpt {

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::trunc);
  GPT_CHECK(out_, "cannot create the metrics file '", path, "'");
  enabled_ = true;
  csv_ = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  if (csv_) out_ << "step,loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s\n";
}

void MetricsWriter::write(const StepMetrics& m) {
  if (!enabled_) return;
  if (csv_) {
    out_ << m.step << ',' << m.loss << ',';
    if (m.val_loss) out_ << *m.val_loss;
    out_ << ',' << m.lr << ',' << m.grad_norm << ',' << m.tokens_per_s << ',' << m.elapsed_s
         << '\n';
  } else {
    nlohmann::json j{{"step", m.step},           {"loss", m.loss},
                     {"val_loss", nullptr},      {"lr", m.lr},
                     {"grad_norm", m.grad_norm}, {"tokens_per_s", m.tokens_per_s},
                     {"elapsed_s", m.elapsed_s}};
    if (m.val_loss) j["val_loss"] = *m.val_loss;
    out_ << j.dump() << '\n';
  }
  out_.flush();
}

}  // namespace gpt
