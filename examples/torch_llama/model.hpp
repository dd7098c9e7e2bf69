// A Llama-style decoder in libtorch C++ (Touvron et al. 2023, "LLaMA"; the layout of Hugging
// Face's LlamaForCausalLM): RMSNorm (Zhang & Sennrich 2019), rotary position embeddings
// (Su et al. 2021, HF's rotate_half convention), a SwiGLU MLP (Shazeer 2020) and grouped-query
// attention (Ainslie et al. 2023). Submodule names are Hugging Face's, so named_parameters()
// gives "model.layers.N.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight", ...
// and zoe's export writes a file transformers' LlamaForCausalLM loads.
// Activations: [batch, seq, dim] in the parameters' dtype; norms and softmax in fp32.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>

namespace llama {

struct LlamaConfig {
  std::int64_t vocab = 50257;   // GPT-2's tokenizer
  std::int64_t dim = 128;
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;    // grouped-query attention: heads share kv_heads key/value heads
  std::int64_t hidden = 352;    // SwiGLU width
  double rope_theta = 10000.0;
  double eps = 1e-5;
  std::int64_t head_dim() const { return dim / heads; }
};

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(std::int64_t dim, double eps) : eps(eps) { weight = register_parameter("weight", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor xf = x.to(torch::kFloat);
    xf = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
    return xf.to(x.scalar_type()) * weight;
  }
  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

/// cos and sin of the rotary angles, [seq, head_dim] fp32 (HF: cat(freqs, freqs)).
inline std::pair<torch::Tensor, torch::Tensor> rotary_tables(std::int64_t seq, std::int64_t head_dim, double theta) {
  torch::Tensor inv = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kFloat) / double(head_dim));
  torch::Tensor freqs = torch::outer(torch::arange(seq, torch::kFloat), inv);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

inline torch::Tensor rotate_half(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const LlamaConfig& c) : c(c) {
    auto lin = [](std::int64_t in, std::int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
    q_proj = register_module("q_proj", lin(c.dim, c.heads * c.head_dim()));
    k_proj = register_module("k_proj", lin(c.dim, c.kv_heads * c.head_dim()));
    v_proj = register_module("v_proj", lin(c.dim, c.kv_heads * c.head_dim()));
    o_proj = register_module("o_proj", lin(c.heads * c.head_dim(), c.dim));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
    const std::int64_t B = x.size(0), T = x.size(1), hd = c.head_dim();
    torch::Tensor q = q_proj(x).view({B, T, c.heads, hd}).transpose(1, 2);
    torch::Tensor k = k_proj(x).view({B, T, c.kv_heads, hd}).transpose(1, 2);
    torch::Tensor v = v_proj(x).view({B, T, c.kv_heads, hd}).transpose(1, 2);
    torch::Tensor cs = cos.to(x.scalar_type()), sn = sin.to(x.scalar_type());
    q = q * cs + rotate_half(q) * sn;
    k = k * cs + rotate_half(k) * sn;
    k = k.repeat_interleave(c.heads / c.kv_heads, 1);
    v = v.repeat_interleave(c.heads / c.kv_heads, 1);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)).to(torch::kFloat) / std::sqrt(double(hd));
    torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
    att = att.masked_fill(mask, -std::numeric_limits<float>::infinity()).softmax(-1).to(x.scalar_type());
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, c.heads * hd});
    return o_proj(y);
  }
  LlamaConfig c;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const LlamaConfig& c) {
    auto lin = [](std::int64_t in, std::int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
    gate_proj = register_module("gate_proj", lin(c.dim, c.hidden));
    up_proj = register_module("up_proj", lin(c.dim, c.hidden));
    down_proj = register_module("down_proj", lin(c.hidden, c.dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const LlamaConfig& c) {
    self_attn = register_module("self_attn", Attention(c));
    mlp = register_module("mlp", Mlp(c));
    input_layernorm = register_module("input_layernorm", RMSNorm(c.dim, c.eps));
    post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.dim, c.eps));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
    x = x + self_attn(input_layernorm(x), cos, sin);
    return x + mlp(post_attention_layernorm(x));
  }
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& c) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.dim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.layers; ++i) layers->push_back(DecoderLayer(c));
    norm = register_module("norm", RMSNorm(c.dim, c.eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

/// Hugging Face's LlamaForCausalLM: "model" (embed_tokens, layers, norm) and "lm_head".
/// Initialisation as HF's _init_weights: normal(0, 0.02) for linear and embedding weights.
struct LlamaForCausalLMImpl : torch::nn::Module {
  explicit LlamaForCausalLMImpl(const LlamaConfig& c) : config(c) {
    model = register_module("model", LlamaModel(c));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab).bias(false)));
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters())
      if (p.value().dim() == 2) p.value().normal_(0.0, 0.02);
  }
  /// Plain libtorch forward (no zoe): logits [B, T, vocab] from token ids [B, T] (int64).
  torch::Tensor forward(const torch::Tensor& ids) {
    auto [cos, sin] = rotary_tables(ids.size(1), config.head_dim(), config.rope_theta);
    torch::Tensor h = model->embed_tokens(ids);
    for (const auto& layer : *model->layers) h = layer->as<DecoderLayer>()->forward(h, cos, sin);
    return lm_head(model->norm(h));
  }
  LlamaConfig config;
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(LlamaForCausalLM);

/// Mean next-token cross entropy (nats) of logits [B, T, V] against targets [B, T], in fp32.
inline torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

}  // namespace llama
