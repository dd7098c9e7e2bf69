#include "examples/gpt/metrics.hpp"

#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>

#include "examples/gpt/error.hpp"

namespace gpt {

namespace {
constexpr const char* kCsvHeader = "step,loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s";

// The step of a data row (CSV: the first field; JSON Lines: "step"), or -1 for anything else.
long row_step(const std::string& line, bool csv) {
  try {
    if (csv) return line.empty() || line == kCsvHeader ? -1 : std::stol(line.substr(0, line.find(',')));
    return nlohmann::json::parse(line).at("step").get<long>();
  } catch (const std::exception&) {
    return -1;
  }
}

// The header and the rows of steps <= resume_step of an existing metrics file.
std::string rows_through(const std::string& path, bool csv, int resume_step) {
  std::ifstream in(path);
  GPT_CHECK(in, "cannot read the metrics file '", path, "' of the resumed run");
  std::string kept, line;
  if (csv) kept = std::string(kCsvHeader) + "\n";
  while (std::getline(in, line)) {
    const long s = row_step(line, csv);
    if (s >= 1 && s <= resume_step) kept += line + "\n";
  }
  return kept;
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int resume_step) {
  if (path.empty()) return;
  csv_ = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  std::string kept = csv_ ? std::string(kCsvHeader) + "\n" : std::string();
  if (resume_step > 0 && std::filesystem::exists(path)) kept = rows_through(path, csv_, resume_step);
  {  // the kept rows replace the file atomically: a failure here loses no metrics
    std::ofstream tmp(path + ".tmp", std::ios::trunc);
    tmp << kept;
    GPT_CHECK(tmp.flush(), "cannot create the metrics file '", path, ".tmp'");
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  GPT_CHECK(!ec, "cannot replace the metrics file '", path, "': ", ec.message());
  out_.open(path, std::ios::app);
  GPT_CHECK(out_, "cannot open the metrics file '", path, "'");
  // Losses to 9 significant digits (the stream's default 6 hides the differences between runs
  // that scripts/gpu-check.sh and resumed runs compare).
  out_ << std::setprecision(9);
  enabled_ = true;
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
