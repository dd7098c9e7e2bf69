// The Llama model's forward through zoe::TorchModel: one zoe module per decoder layer, the token
// embedding, the final norm and the lm_head (the unit of ZeRO-3's all-gather and of offload).
#pragma once

#include <string>
#include <vector>

#include "examples/torch_llama/model.hpp"
#include "zoe/torch.hpp"

namespace llama {

/// The parts of LlamaForCausalLM as zoe modules, in forward order; `checkpoint`: recompute each
/// decoder layer in its backward (activation checkpointing).
inline std::vector<zoe::TorchPart> zoe_parts(const LlamaForCausalLMImpl& m, bool checkpoint) {
  std::vector<zoe::TorchPart> parts{{"model.embed_tokens"}};
  for (const auto& name : zoe::TorchModel::children_of(m, "model.layers")) parts.push_back({name, checkpoint});
  parts.push_back({"model.norm"});
  parts.push_back({"lm_head"});
  return parts;
}

/// Logits [B, T, vocab] from token ids [B, T] (int64), every part run by `zoe`.
inline torch::Tensor zoe_forward(zoe::TorchModel& zoe, LlamaForCausalLMImpl& m, const torch::Tensor& ids) {
  auto [cos, sin] = rotary_tables(ids.size(1), m.config.head_dim(), m.config.rope_theta);
  torch::Tensor h = zoe.run(zoe.part("model.embed_tokens"), [&](const torch::Tensor& x) { return m.model->embed_tokens(x); }, ids);
  for (std::size_t i = 0; i < m.model->layers->size(); ++i) {
    auto layer = m.model->layers[i]->as<DecoderLayerImpl>();
    h = zoe.run(zoe.part("model.layers." + std::to_string(i)),
                [layer](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{layer->forward(in[0], in[1], in[2])}; },
                {h, cos, sin})[0];
  }
  h = zoe.run(zoe.part("model.norm"), [&](const torch::Tensor& x) { return m.model->norm(x); }, h);
  return zoe.run(zoe.part("lm_head"), [&](const torch::Tensor& x) { return m.lm_head(x); }, h);
}

}  // namespace llama
