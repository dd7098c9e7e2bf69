// GPT-2 weights in Hugging Face's safetensors layout: what `zoe-gpt --init-from FILE` accepts
// and `--export FILE` writes. The model's parameter names are HF GPT-2's (model_spec.hpp:
// wte.weight, wpe.weight, h.N.ln_1.weight, h.N.attn.c_attn.weight [C, 3C] in HF's Conv1D
// [in, out] layout, ..., ln_f.bias), and lm_head is tied to wte, so a file holds wte once, as
// HF's GPT-2 checkpoints do.
// Thread-safety: an InitFile is immutable; its initializers may run on several rank threads.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "examples/gpt/model_spec.hpp"
#include "zoe/engine.hpp"
#include "zoe/safetensors.hpp"

namespace gpt {

/// A safetensors file checked against a model, ready to initialise its parameters.
class InitFile {
 public:
  /// Opens `path` (zoe::SafetensorsFile::open: strict header validation) and checks it against
  /// `spec`: every parameter's tensor present (HF GPT-2 names, all optionally prefixed
  /// "transformer." as GPT2LMHeadModel saves them) with the parameter's shape and dtype F32,
  /// BF16 or F16. Also accepted: HF's attention-mask buffers h.N.attn.bias and
  /// h.N.attn.masked_bias (not parameters; HF's loader ignores them too), and lm_head.weight
  /// when it equals wte bit for bit (the tie, stored twice; compared in 64 Ki-element chunks).
  /// Throws zoe::Error naming the file and the tensor for a missing tensor, a tensor the model
  /// has no parameter for, a shape that differs (with the model flags to change), an
  /// lm_head.weight that is not wte, or a dtype zoe cannot import; the file's own errors as
  /// SafetensorsFile::open throws them.
  InitFile(const std::string& path, const ModelSpec& spec);

  /// The initializer of the model parameter `name` (a ParamSpec name) with `shape`.
  zoe::ParamInitializer initializer(const std::string& name, const std::vector<std::int64_t>& shape) const;
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<const zoe::SafetensorsFile> file_;
  std::string prefix_;  // "" or "transformer."
};

/// The "__metadata__" zoe-gpt writes: {"format": "pt"} (what HF's loaders require) and the
/// model's shape (n_layer, n_head, n_embd, n_positions, vocab_size, as HF's GPT2Config names them).
std::map<std::string, std::string> export_metadata(const GptConfig& cfg);

}  // namespace gpt
