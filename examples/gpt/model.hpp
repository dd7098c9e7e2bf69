// GPT-2 forward and backward over the modules of model_spec.hpp, with parameters supplied
// module by module by a ParamProvider (zoe's Engine in the trainer, plain memory in tests), so the
// model holds no parameters itself, only its activations. The graph is written once over a
// compute backend, Ops (cpu_ops.hpp says what one provides): CpuOps on the CPU, CudaOps on a
// GPU, KernelOps (the CUDA kernels' math on the host) in tests; parameters, gradients and
// activations then live in that backend's memory.
//
// One micro-batch: forward() walks embeddings, blocks, head, asking the provider for each
// module's parameters in turn. forward_backward() walks embeddings and blocks forward, then the
// modules in reverse: the head's fused softmax cross-entropy computes the loss and its gradients
// at once, and every module adds its gradients into the provider's buffers. With
// activation checkpointing only each block's input is kept and the block's forward is recomputed
// inside its backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").
// Thread-safety: one GptModel per thread (it owns mutable activation buffers).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "examples/gpt/cpu_ops.hpp"
#include "examples/gpt/error.hpp"
#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/model_spec.hpp"

namespace gpt {

/// A module's parameters (full, in ModuleSpec::params order) and, during backward, its gradient
/// buffers (same order and sizes, zero-filled by the provider; the model adds into them).
template <class T>
struct ModuleView {
  std::vector<const T*> params;
  std::vector<T*> grads;
};

/// Supplies parameters module by module (indices into ModelSpec::modules). Calls come in the
/// order begin_forward(m) end_forward(m) ... and begin_backward(m) end_backward(m) ...
template <class T>
class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  virtual ModuleView<T> begin_forward(int module) = 0;
  virtual void end_forward(int module) = 0;
  virtual ModuleView<T> begin_backward(int module) = 0;
  virtual void end_backward(int module) = 0;
};

template <class T, class Ops = CpuOps<T>>
class GptModel {
  static_assert(std::is_same_v<T, typename Ops::Scalar>, "the model's scalar is its Ops' scalar");
  template <class U>
  using Array = typename Ops::template Array<U>;

 public:
  /// `ops`: the compute backend (a CudaOps carries its device and stream).
  GptModel(const GptConfig& cfg, bool checkpoint_activations, Ops ops = Ops())
      : cfg_(cfg), spec_(make_model_spec(cfg)), checkpoint_(checkpoint_activations),
        ops_(std::move(ops)) {
    ops_.configure_head(head_chunk_, head_precision_);
  }

  const GptConfig& config() const { return cfg_; }
  const ModelSpec& spec() const { return spec_; }
  /// The compute backend (e.g. for ModuleCopies' conversions on the same stream).
  Ops& ops() { return ops_; }

  /// Mean cross-entropy (nats) of a micro-batch: inputs and targets [B*T] token ids in host
  /// memory, 1 <= T <= context. Forward only (evaluation).
  double forward(ParamProvider<T>& pp, const std::int32_t* inputs, const std::int32_t* targets,
                 int B, int Tn) {
    run_trunk(pp, inputs, B, Tn);
    upload_targets(targets);
    const int head = head_module();
    const ModuleView<T> v = pp.begin_forward(head);
    final_layernorm(v);
    const double loss = ops_.head_loss(lnf_.data(), v.params[kHeadWte], targets_.data(), N_,
                                       cfg_.n_embd, cfg_.vocab_size);
    pp.end_forward(head);
    return loss;
  }

  /// Training on a micro-batch (same arguments as forward): the forward of the embeddings and
  /// blocks, then the head's forward and backward together inside its backward scope (the fused
  /// softmax cross-entropy adds d loss / d wte straight into the provider's gradient buffer, and
  /// the head needs no forward gather), then the blocks' and embeddings' backward. Adds
  /// d(mean loss)/d(param) into the provider's gradient buffers; returns the mean loss (nats).
  /// Provider calls: begin/end_forward of modules 0..L, then begin/end_backward of L+1..0.
  double forward_backward(ParamProvider<T>& pp, const std::int32_t* inputs,
                          const std::int32_t* targets, int B, int Tn) {
    run_trunk(pp, inputs, B, Tn);
    upload_targets(targets);
    const int C = cfg_.n_embd, L = cfg_.n_layer;
    const std::size_t NC = static_cast<std::size_t>(N_) * C;
    double loss = 0;
    ops_.zero(dx_, NC);
    {
      const int head = head_module();
      const ModuleView<T> v = pp.begin_backward(head);
      final_layernorm(v);
      ops_.zero(dlnf_, NC);
      loss = ops_.head_loss_and_grad(lnf_.data(), v.params[kHeadWte], targets_.data(), N_, C,
                                     cfg_.vocab_size, dlnf_.data(), v.grads[kHeadWte]);
      ops_.layernorm_backward(dlnf_.data(), x_[L].data(), v.params[kLnfW], lnf_mean_.data(),
                              lnf_rstd_.data(), N_, C, dx_.data(), v.grads[kLnfW],
                              v.grads[kLnfB]);
      pp.end_backward(head);
    }
    for (int l = L - 1; l >= 0; --l) {
      const ModuleView<T> v = pp.begin_backward(1 + l);
      LayerActs& a = checkpoint_ ? scratch_ : acts_[l];
      if (checkpoint_) block_forward(v.params, x_[l].data(), a, x_recompute_);
      dx_prev_.resize(NC);
      block_backward(v, x_[l].data(), a, dx_.data(), dx_prev_.data());
      std::swap(dx_, dx_prev_);
      pp.end_backward(1 + l);
    }
    const ModuleView<T> v = pp.begin_backward(0);
    ops_.embedding_backward(inputs_.data(), B_, T_, C, dx_.data(), v.grads[kEmbWte],
                            v.grads[kEmbWpe]);
    pp.end_backward(0);
    return loss;
  }

  /// Logits of the last position of each sequence, [B, V] row-major in host memory (sampling).
  void last_logits(ParamProvider<T>& pp, const std::int32_t* inputs, int B, int Tn,
                   std::vector<T>& out) {
    run_trunk(pp, inputs, B, Tn);
    const int head = head_module();
    const ModuleView<T> v = pp.begin_forward(head);
    final_layernorm(v);
    const int C = cfg_.n_embd, V = cfg_.vocab_size;
    last_.resize(static_cast<std::size_t>(B) * C);
    for (int b = 0; b < B; ++b)
      ops_.copy(lnf_.data() + (static_cast<std::int64_t>(b) * Tn + Tn - 1) * C, C,
                last_.data() + static_cast<std::int64_t>(b) * C);
    logits_.resize(static_cast<std::size_t>(B) * V);
    ops_.head_logits(last_.data(), v.params[kHeadWte], B, C, V, logits_.data());
    out.resize(static_cast<std::size_t>(B) * V);
    ops_.download(logits_.data(), out.size(), out.data());
    pp.end_forward(head);
  }

  /// Rows per chunk of the fused lm_head + cross-entropy (memory chunk*V elements).
  void set_head_chunk(int rows) {
    head_chunk_ = rows;
    ops_.configure_head(head_chunk_, head_precision_);
  }
  /// The training head's matmul precision (lm_head.hpp; float models only, default fp32).
  /// Evaluation (forward) always multiplies in fp32.
  void set_head_precision(HeadPrecision p) {
    head_precision_ = p;
    ops_.configure_head(head_chunk_, head_precision_);
  }

 private:
  // What a block's backward needs from its forward. x_mid = x_in + attention branch.
  struct LayerActs {
    Array<T> ln1, ln1_mean, ln1_rstd, qkv, att, atty, x_mid, ln2, ln2_mean, ln2_rstd, fc, fc_gelu;
  };

  int head_module() const { return cfg_.n_layer + 1; }

  void run_trunk(ParamProvider<T>& pp, const std::int32_t* inputs, int B, int Tn) {
    GPT_CHECK(B > 0 && Tn > 0 && Tn <= cfg_.context, "batch ", B, " x sequence ", Tn,
              " not allowed: need B > 0 and 0 < T <= context ", cfg_.context);
    const int C = cfg_.n_embd, L = cfg_.n_layer;
    B_ = B;
    T_ = Tn;
    N_ = B * Tn;
    const std::size_t NC = static_cast<std::size_t>(N_) * C;
    for (int i = 0; i < N_; ++i)
      GPT_CHECK(inputs[i] >= 0 && inputs[i] < cfg_.vocab_size, "token id ", inputs[i],
                " at position ", i, " is outside the vocabulary of ", cfg_.vocab_size);
    ops_.upload(inputs, static_cast<std::size_t>(N_), inputs_);
    x_.resize(L + 1);
    for (auto& x : x_) x.resize(NC);
    if (!checkpoint_) acts_.resize(L);
    {
      const ModuleView<T> v = pp.begin_forward(0);
      ops_.embedding_forward(inputs_.data(), B, Tn, C, v.params[kEmbWte], v.params[kEmbWpe],
                             x_[0].data());
      pp.end_forward(0);
    }
    for (int l = 0; l < L; ++l) {
      const ModuleView<T> v = pp.begin_forward(1 + l);
      block_forward(v.params, x_[l].data(), checkpoint_ ? scratch_ : acts_[l], x_[l + 1]);
      pp.end_forward(1 + l);
    }
  }

  // The targets (host, [N_]) into the backend's memory, range-checked.
  void upload_targets(const std::int32_t* targets) {
    for (int i = 0; i < N_; ++i)
      GPT_CHECK(targets[i] >= 0 && targets[i] < cfg_.vocab_size, "target token id ", targets[i],
                " at position ", i, " is outside the vocabulary of ", cfg_.vocab_size);
    ops_.upload(targets, static_cast<std::size_t>(N_), targets_);
  }

  // ln_f of the last block's output, inside the head module's forward scope.
  void final_layernorm(const ModuleView<T>& v) {
    const int C = cfg_.n_embd;
    lnf_.resize(static_cast<std::size_t>(N_) * C);
    lnf_mean_.resize(N_);
    lnf_rstd_.resize(N_);
    ops_.layernorm_forward(x_[cfg_.n_layer].data(), v.params[kLnfW], v.params[kLnfB], N_, C,
                           lnf_.data(), lnf_mean_.data(), lnf_rstd_.data());
  }

  // x_out = x_in + attn(ln_1(x_in)); x_out += mlp(ln_2(x_out)), saving what backward needs.
  void block_forward(const std::vector<const T*>& p, const T* x_in, LayerActs& a,
                     Array<T>& x_out) {
    const int N = N_, C = cfg_.n_embd, H = cfg_.n_head;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    a.ln1.resize(NC);
    a.ln1_mean.resize(N);
    a.ln1_rstd.resize(N);
    a.qkv.resize(3 * NC);
    a.att.resize(static_cast<std::size_t>(B_) * H * T_ * T_);
    a.atty.resize(NC);
    a.x_mid.resize(NC);
    a.ln2.resize(NC);
    a.ln2_mean.resize(N);
    a.ln2_rstd.resize(N);
    a.fc.resize(4 * NC);
    a.fc_gelu.resize(4 * NC);
    x_out.resize(NC);
    ops_.layernorm_forward(x_in, p[kLn1W], p[kLn1B], N, C, a.ln1.data(), a.ln1_mean.data(),
                           a.ln1_rstd.data());
    ops_.linear_forward(a.ln1.data(), p[kAttnW], p[kAttnB], N, C, 3 * C, a.qkv.data());
    ops_.attention_forward(a.qkv.data(), B_, T_, C, H, a.atty.data(), a.att.data());
    ops_.linear_forward(a.atty.data(), p[kAttnProjW], p[kAttnProjB], N, C, C, a.x_mid.data());
    ops_.add(x_in, NC, a.x_mid.data());
    ops_.layernorm_forward(a.x_mid.data(), p[kLn2W], p[kLn2B], N, C, a.ln2.data(),
                           a.ln2_mean.data(), a.ln2_rstd.data());
    ops_.linear_forward(a.ln2.data(), p[kFcW], p[kFcB], N, C, 4 * C, a.fc.data());
    ops_.gelu_forward(a.fc.data(), 4 * static_cast<std::int64_t>(NC), a.fc_gelu.data());
    ops_.linear_forward(a.fc_gelu.data(), p[kMlpProjW], p[kMlpProjB], N, 4 * C, C, x_out.data());
    ops_.add(a.x_mid.data(), NC, x_out.data());
  }

  // dx_in = d(loss)/d(x_in) from dx_out; parameter gradients added into v.grads.
  void block_backward(const ModuleView<T>& v, const T* x_in, const LayerActs& a, const T* dx_out,
                      T* dx_in) {
    const auto& p = v.params;
    const auto& g = v.grads;
    const int N = N_, C = cfg_.n_embd, H = cfg_.n_head;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    ops_.zero(d4_, 4 * NC);
    ops_.zero(d4b_, 4 * NC);
    ops_.linear_backward(dx_out, a.fc_gelu.data(), p[kMlpProjW], N, 4 * C, C, d4_.data(),
                         g[kMlpProjW], g[kMlpProjB]);
    ops_.gelu_backward(d4_.data(), a.fc.data(), 4 * static_cast<std::int64_t>(NC), d4b_.data());
    ops_.zero(dC_, NC);
    ops_.linear_backward(d4b_.data(), a.ln2.data(), p[kFcW], N, C, 4 * C, dC_.data(), g[kFcW],
                         g[kFcB]);
    dmid_.resize(NC);
    ops_.copy(dx_out, NC, dmid_.data());  // residual
    ops_.layernorm_backward(dC_.data(), a.x_mid.data(), p[kLn2W], a.ln2_mean.data(),
                            a.ln2_rstd.data(), N, C, dmid_.data(), g[kLn2W], g[kLn2B]);
    ops_.zero(dC_, NC);
    ops_.linear_backward(dmid_.data(), a.atty.data(), p[kAttnProjW], N, C, C, dC_.data(),
                         g[kAttnProjW], g[kAttnProjB]);
    ops_.zero(d4_, 3 * NC);
    ops_.attention_backward(dC_.data(), a.qkv.data(), a.att.data(), B_, T_, C, H, d4_.data());
    ops_.zero(dC_, NC);
    ops_.linear_backward(d4_.data(), a.ln1.data(), p[kAttnW], N, C, 3 * C, dC_.data(), g[kAttnW],
                         g[kAttnB]);
    ops_.copy(dmid_.data(), NC, dx_in);  // residual
    ops_.layernorm_backward(dC_.data(), x_in, p[kLn1W], a.ln1_mean.data(), a.ln1_rstd.data(), N,
                            C, dx_in, g[kLn1W], g[kLn1B]);
  }

  GptConfig cfg_;
  ModelSpec spec_;
  bool checkpoint_;
  int head_chunk_ = 256;
  HeadPrecision head_precision_ = HeadPrecision::fp32;
  Ops ops_;
  int B_ = 0, T_ = 0, N_ = 0;
  Array<std::int32_t> inputs_, targets_;  // in the backend's memory
  std::vector<Array<T>> x_;        // x_[l]: input of block l; x_[L]: input of ln_f
  std::vector<LayerActs> acts_;    // per block (without checkpointing)
  LayerActs scratch_;              // the one block's activations (with checkpointing)
  Array<T> x_recompute_;           // recomputed block output (discarded)
  Array<T> lnf_, lnf_mean_, lnf_rstd_, last_, logits_;
  Array<T> dlnf_;                  // d loss / d ln_f output
  Array<T> dx_, dx_prev_, dmid_, dC_, d4_, d4b_;
};

}  // namespace gpt
