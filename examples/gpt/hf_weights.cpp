#include "examples/gpt/hf_weights.hpp"

#include <algorithm>
#include <cstring>
#include <regex>
#include <set>
#include <vector>

#include "examples/gpt/error.hpp"

namespace gpt {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// HF GPT-2's causal-mask buffers: saved by older transformers versions, not parameters.
bool is_mask_buffer(const std::string& name) {
  static const std::regex mask(R"(h\.[0-9]+\.attn\.(bias|masked_bias))");
  return std::regex_match(name, mask);
}

// Whether tensors a and b of the file hold the same bits (both F32/BF16/F16, same numel),
// read in bounded chunks as fp32 (exact widening, so equal fp32 means equal values).
bool same_values(const zoe::SafetensorsFile& f, const zoe::SafetensorsTensor& a, const zoe::SafetensorsTensor& b) {
  if (a.shape != b.shape || a.dtype != b.dtype) return false;
  constexpr std::int64_t kChunk = 65536;
  std::vector<float> x(static_cast<std::size_t>(std::min(kChunk, a.numel))), y(x.size());
  for (std::int64_t at = 0; at < a.numel; at += kChunk) {
    const auto n = static_cast<std::size_t>(std::min(kChunk, a.numel - at));
    f.read_f32(a.name, at, std::span<float>(x.data(), n));
    f.read_f32(b.name, at, std::span<float>(y.data(), n));
    if (std::memcmp(x.data(), y.data(), n * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

InitFile::InitFile(const std::string& path, const ModelSpec& spec) : file_(zoe::SafetensorsFile::open(path)) {
  const zoe::SafetensorsFile& f = *file_;
  if (f.find("transformer.wte.weight")) prefix_ = "transformer.";
  std::set<std::string> wanted;
  for (const ParamSpec& p : spec.params) {
    const std::string name = prefix_ + p.name;
    wanted.insert(name);
    const zoe::SafetensorsTensor* t = f.find(name);
    GPT_CHECK(t, "--init-from '", path, "': no tensor '", name, "' (the model's ", p.name, " ", shape_text(p.shape),
              "); the file has ", f.tensors().size(), " tensors: is it a GPT-2 of ", (spec.params.size() - 4) / 12,
              " layers (--layers)?");
    GPT_CHECK(t->shape == p.shape, "--init-from '", path, "': tensor '", name, "' has shape ", shape_text(t->shape),
              ", the model's ", shape_text(p.shape),
              ": give the file's model shape with --layers, --heads, --width and --context (wpe rows)");
    GPT_CHECK(t->dtype == "F32" || t->dtype == "BF16" || t->dtype == "F16", "--init-from '", path, "': tensor '",
              name, "' is ", t->dtype, "; zoe imports F32, BF16 and F16");
  }
  for (const zoe::SafetensorsTensor& t : f.tensors()) {
    if (wanted.count(t.name)) continue;
    const std::string bare = t.name.rfind(prefix_, 0) == 0 ? t.name.substr(prefix_.size()) : t.name;
    if (is_mask_buffer(bare)) continue;
    if (t.name == "lm_head.weight" || bare == "lm_head.weight") {
      const zoe::SafetensorsTensor* wte = f.find(prefix_ + "wte.weight");
      GPT_CHECK(same_values(f, t, *wte), "--init-from '", path, "': tensor '", t.name,
                "' differs from wte.weight, but this model ties lm_head to wte (one parameter): loading it would "
                "drop one of them");
      continue;
    }
    GPT_THROW("--init-from '", path, "': tensor '", t.name, "' ", shape_text(t.shape),
              " is not a parameter of this model (HF GPT-2 names expected", prefix_.empty() ? "" : ", prefixed 'transformer.'",
              ")");
  }
}

zoe::ParamInitializer InitFile::initializer(const std::string& name, const std::vector<std::int64_t>& shape) const {
  return file_->initializer(prefix_ + name, shape);
}

std::map<std::string, std::string> export_metadata(const GptConfig& cfg) {
  return {{"format", "pt"},
          {"n_layer", std::to_string(cfg.n_layer)},
          {"n_head", std::to_string(cfg.n_head)},
          {"n_embd", std::to_string(cfg.n_embd)},
          {"n_positions", std::to_string(cfg.context)},
          {"vocab_size", std::to_string(cfg.vocab_size)}};
}

}  // namespace gpt
