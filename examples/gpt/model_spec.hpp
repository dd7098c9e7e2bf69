// The GPT-2 model's shape: its hyper-parameters, its parameters with Hugging Face GPT-2 names and
// layouts, how they are grouped into zoe modules, and their GPT-2 initialization.
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpt {

/// GPT-2 hyper-parameters (Radford et al. 2019, Table 2 names them n_layer, n_head, n_embd).
struct GptConfig {
  int vocab_size = 50257;
  int context = 128;  // n_positions: wpe rows, the longest sequence
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;  // C; must be a multiple of n_head
  /// Throws zoe::Error naming the field when a value is out of range.
  void validate() const;
};

/// How a parameter starts: N(0, std^2), all ones, or all zeros.
enum class Init { normal, ones, zeros };

/// One parameter: HF name (e.g. "h.0.attn.c_attn.weight"), row-major shape in elements.
struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  Init init = Init::zeros;
  double stddev = 0.0;  // for Init::normal
  std::int64_t numel() const;
};

/// One zoe module (unit of all-gather): indices into ModelSpec::params, in the order the model
/// code reads them (see the kBlock*/kHead*/kEmb* constants).
struct ModuleSpec {
  std::string name;
  std::vector<int> params;
  /// Its training forward runs inside its backward scope (the head: GptModel::forward_backward),
  /// so the engine must not expect a begin_forward before its begin_backward.
  bool forward_in_backward = false;
};

/// Modules in execution order: "embeddings" (wte, wpe), "h.0".."h.{L-1}" (12 params each),
/// "head" (ln_f.weight, ln_f.bias, wte: lm_head is tied to wte, the same parameter).
struct ModelSpec {
  std::vector<ParamSpec> params;
  std::vector<ModuleSpec> modules;
  /// Parameters counted once (wte once despite the tie).
  std::int64_t parameter_count() const;
};

// Positions of a module's tensors in ModuleSpec::params order.
enum EmbParam { kEmbWte = 0, kEmbWpe = 1 };
enum BlockParam {
  kLn1W = 0, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kBlockParamCount
};
enum HeadParam { kLnfW = 0, kLnfB = 1, kHeadWte = 2 };

/// Whether the parameter named `name` (make_model_spec's names) takes weight decay: GPT-2
/// practice (nanoGPT's "dim >= 2", Hugging Face's no_decay = bias, LayerNorm weight) decays the
/// matrices and the embeddings, not the biases (*.bias) and LayerNorm gains (ln_*.weight).
bool decays(const std::string& name);

/// The spec of `cfg` (validated). GPT-2 init: weights N(0, 0.02^2); the residual projections
/// attn.c_proj.weight and mlp.c_proj.weight N(0, (0.02/sqrt(2*n_layer))^2) (GPT-2 paper §2.3);
/// biases 0; LayerNorm weights 1, biases 0.
ModelSpec make_model_spec(const GptConfig& cfg);

/// The initial value of `p` (numel floats), a function of (seed, p.name) only: identical on
/// every rank and independent of registration order. Normal draws are Box-Muller over a
/// splitmix64 stream, so they do not depend on the standard library.
std::vector<float> initial_value(const ParamSpec& p, std::uint64_t seed);

/// Elements [offset, offset + out.size()) of initial_value(p, seed), bitwise, without the rest:
/// the normal draws come from a counter-based stream (splitmix64 adds a constant per draw), so
/// element i's pair i/2 is computed from its own counter. Host memory: none beyond `out`, so an
/// Engine's ParamInitializer can stream a model larger than RAM. Runs the pairs over the
/// calling thread's OpenMP team (results independent of the thread count).
/// Throws zoe::Error when offset < 0 or the range passes p.numel().
void fill_initial_value(const ParamSpec& p, std::uint64_t seed, std::int64_t offset, std::span<float> out);

}  // namespace gpt
