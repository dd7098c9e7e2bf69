#include "examples/gpt/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "examples/gpt/error.hpp"

namespace gpt {

void GptConfig::validate() const {
  GPT_CHECK(vocab_size > 0 && vocab_size <= 65536, "vocab_size ", vocab_size,
            " is not in [1, 65536]");
  GPT_CHECK(context > 0, "context ", context, " must be positive");
  GPT_CHECK(n_layer > 0, "n_layer ", n_layer, " must be positive");
  GPT_CHECK(n_head > 0, "n_head ", n_head, " must be positive");
  GPT_CHECK(n_embd > 0 && n_embd % n_head == 0, "n_embd ", n_embd,
            " must be a positive multiple of n_head ", n_head);
}

std::int64_t ParamSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t ModelSpec::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

bool decays(const std::string& name) {
  const bool bias = name.ends_with(".bias");
  const bool layer_norm = name.starts_with("ln_") || name.find(".ln_") != std::string::npos;
  return !bias && !layer_norm;
}

ModelSpec make_model_spec(const GptConfig& cfg) {
  cfg.validate();
  const std::int64_t C = cfg.n_embd;
  const double std_w = 0.02;
  const double std_proj = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  ModelSpec s;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, Init init, double sd = 0) {
    s.params.push_back({std::move(name), std::move(shape), init, sd});
    return static_cast<int>(s.params.size() - 1);
  };
  const int wte = add("wte.weight", {cfg.vocab_size, C}, Init::normal, std_w);
  const int wpe = add("wpe.weight", {cfg.context, C}, Init::normal, std_w);
  s.modules.push_back({"embeddings", {wte, wpe}});
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    ModuleSpec m{"h." + std::to_string(l), {}};
    m.params.push_back(add(h + "ln_1.weight", {C}, Init::ones));
    m.params.push_back(add(h + "ln_1.bias", {C}, Init::zeros));
    m.params.push_back(add(h + "attn.c_attn.weight", {C, 3 * C}, Init::normal, std_w));
    m.params.push_back(add(h + "attn.c_attn.bias", {3 * C}, Init::zeros));
    m.params.push_back(add(h + "attn.c_proj.weight", {C, C}, Init::normal, std_proj));
    m.params.push_back(add(h + "attn.c_proj.bias", {C}, Init::zeros));
    m.params.push_back(add(h + "ln_2.weight", {C}, Init::ones));
    m.params.push_back(add(h + "ln_2.bias", {C}, Init::zeros));
    m.params.push_back(add(h + "mlp.c_fc.weight", {C, 4 * C}, Init::normal, std_w));
    m.params.push_back(add(h + "mlp.c_fc.bias", {4 * C}, Init::zeros));
    m.params.push_back(add(h + "mlp.c_proj.weight", {4 * C, C}, Init::normal, std_proj));
    m.params.push_back(add(h + "mlp.c_proj.bias", {C}, Init::zeros));
    s.modules.push_back(std::move(m));
  }
  const int lnf_w = add("ln_f.weight", {C}, Init::ones);
  const int lnf_b = add("ln_f.bias", {C}, Init::zeros);
  s.modules.push_back({"head", {lnf_w, lnf_b, wte}, /*forward_in_backward=*/true});
  return s;
}

namespace {
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// FNV-1a of the name, mixed with the seed.
std::uint64_t stream_seed(const std::string& name, std::uint64_t seed) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  std::uint64_t s = h ^ (seed * 0x9E3779B97F4A7C15ull);
  return splitmix64(s);
}
}  // namespace

void fill_initial_value(const ParamSpec& p, std::uint64_t seed, std::int64_t offset, std::span<float> out) {
  const auto n = static_cast<std::int64_t>(out.size());
  GPT_CHECK(offset >= 0 && offset + n <= p.numel(), "initial value of '", p.name, "': elements [", offset, ", ",
            offset + n, ") are outside its ", p.numel());
  if (p.init != Init::normal) {
    std::fill(out.begin(), out.end(), p.init == Init::ones ? 1.0f : 0.0f);
    return;
  }
  // Pair j (elements 2j, 2j+1) takes draws 2j and 2j+1 of the stream: splitmix64's state after
  // k draws is state0 + k * golden, so the pair starts from state0 + 2j * golden.
  const std::uint64_t state0 = stream_seed(p.name, seed);
  const std::int64_t first = offset / 2, last = (offset + n + 1) / 2;  // pairs [first, last)
#pragma omp parallel for schedule(static) if (last - first > 65536)
  for (std::int64_t j = first; j < last; ++j) {
    std::uint64_t state = state0 + static_cast<std::uint64_t>(2 * j) * 0x9E3779B97F4A7C15ull;
    auto uniform = [&] {  // (0, 1], 53 bits
      return (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
    };
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 2.0 * M_PI * uniform();
    const std::int64_t e0 = 2 * j - offset, e1 = e0 + 1;
    if (e0 >= 0 && e0 < n) out[e0] = static_cast<float>(p.stddev * r * std::cos(a));
    if (e1 >= 0 && e1 < n) out[e1] = static_cast<float>(p.stddev * r * std::sin(a));
  }
}

std::vector<float> initial_value(const ParamSpec& p, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(p.numel()));
  fill_initial_value(p, seed, 0, v);
  return v;
}

}  // namespace gpt
