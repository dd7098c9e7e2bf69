// What a trainer does with zoe, written against the installed public headers only: a two-module
// model (hidden: tanh(x W1 + b1), head: h W2 + b2, MSE loss) trained for 20 steps with ZeRO
// stage 3 and the optimizer states on NVMe, over 2 ranks as threads (make_local_ranks). The
// same source is built twice: against the build tree (ctest consumer_build_tree) and by the
// consumer project against the installed package (consumer_installed); the two results must be
// the same bytes. fp32 compute, so the trainer's math needs no 16-bit conversions.
#pragma once

#include <zoe/engine.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace consumer {

constexpr int kIn = 8, kHidden = 32, kOut = 4, kSteps = 20, kWorld = 2, kGlobalBatch = 16;

struct Result {
  std::vector<double> losses;             // mean loss of the global batch, per step
  std::vector<std::vector<float>> params; // final fp32 masters: W1, b1, W2, b2
};

/// Deterministic value in [-1, 1) for (stream, i): a splitmix64 hash (the same on every rank
/// and for every chunking, as a ParamInitializer must be).
inline float hashed(std::uint64_t stream, std::uint64_t i) {
  std::uint64_t z = (stream << 40) ^ i;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-23f - 1.0f;
}

/// Sample k: x uniform in [-1, 1)^kIn, target y_j = sin(a_j . x) for fixed random a_j.
inline void sample(std::int64_t k, float* x, float* y) {
  for (int i = 0; i < kIn; ++i) x[i] = hashed(100, static_cast<std::uint64_t>(k * kIn + i));
  for (int j = 0; j < kOut; ++j) {
    float s = 0;
    for (int i = 0; i < kIn; ++i) s += hashed(200, static_cast<std::uint64_t>(j * kIn + i)) * x[i];
    y[j] = std::sin(s);
  }
}

inline float* f32(const zoe::TensorView& t) {
  if (t.dtype != zoe::DType::f32) throw std::runtime_error("consumer: expected fp32 tensors");
  return t.as<float>();
}

/// out[n x cols] = act(in[n x rows] W[rows x cols] + b)
inline void dense(const float* in, const float* w, const float* b, float* out, int n, int rows, int cols,
                  bool tanh_act) {
  for (int s = 0; s < n; ++s)
    for (int c = 0; c < cols; ++c) {
      float z = b[c];
      for (int r = 0; r < rows; ++r) z += in[s * rows + r] * w[r * cols + c];
      out[s * cols + c] = tanh_act ? std::tanh(z) : z;
    }
}

/// Adds the gradients of out = in W + b given dz = dL/d(out pre-activation) to gw, gb, and
/// (if din) writes dL/d(in).
inline void dense_backward(const float* in, const float* w, const float* dz, float* gw, float* gb, float* din,
                           int n, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float g = 0;
      for (int s = 0; s < n; ++s) g += in[s * rows + r] * dz[s * cols + c];
      gw[r * cols + c] += g;
    }
  for (int c = 0; c < cols; ++c) {
    float g = 0;
    for (int s = 0; s < n; ++s) g += dz[s * cols + c];
    gb[c] += g;
  }
  if (!din) return;
  for (int s = 0; s < n; ++s)
    for (int r = 0; r < rows; ++r) {
      float v = 0;
      for (int c = 0; c < cols; ++c) v += dz[s * cols + c] * w[r * cols + c];
      din[s * rows + r] = v;
    }
}

/// Trains the model; `nvme_dir` holds the optimizer states' files (created, left empty).
inline Result train(const std::string& nvme_dir) {
  zoe::Config config;
  config.train_micro_batch_size_per_gpu = kGlobalBatch / kWorld;
  config.train_batch_size = kGlobalBatch;  // checked by the Engine: 8 x 1 x 2
  config.zero_optimization.stage = 3;
  config.zero_optimization.sub_group_size = 64;  // several sub-groups: the NVMe pipeline runs
  config.zero_optimization.stage3_param_persistence_threshold = 0;  // gather and free each use
  config.zero_optimization.stage3_max_reuse_distance = 0;
  config.zero_optimization.offload_optimizer.device = zoe::OffloadDevice::nvme;
  config.zero_optimization.offload_optimizer.nvme_path = nvme_dir;
  config.zero_optimization.offload_optimizer.buffer_count = 3;
  config.optimizer.lr = 1e-2;
  config.optimizer.weight_decay = 0.01;

  Result result;
  std::vector<std::vector<double>> rank_losses(kWorld);
  auto ranks = zoe::make_local_ranks(kWorld, 60.0);
  zoe::run_ranks(ranks, [&](zoe::RankContext& ctx) {
    zoe::Engine engine(config, ctx);
    auto init = [](std::uint64_t stream, float scale) {
      return [stream, scale](std::int64_t offset, std::span<float> out) {
        for (std::size_t i = 0; i < out.size(); ++i)
          out[i] = hashed(stream, static_cast<std::uint64_t>(offset) + i) * scale;
      };
    };
    const zoe::ParamId w1 = engine.add_parameter("hidden.weight", {kIn, kHidden}, init(1, 0.35f));
    const zoe::ParamId b1 = engine.add_parameter("hidden.bias", {kHidden}, init(2, 0.1f));
    const zoe::ParamId w2 = engine.add_parameter("head.weight", {kHidden, kOut}, init(3, 0.18f));
    const zoe::ParamId b2 = engine.add_parameter("head.bias", {kOut}, init(4, 0.1f));
    const zoe::ModuleId hidden = engine.add_module("hidden", {w1, b1});
    const zoe::ModuleId head = engine.add_module("head", {w2, b2});

    const int n = kGlobalBatch / kWorld;  // this rank's micro-batch
    std::vector<float> x(n * kIn), y(n * kOut), h(n * kHidden), out(n * kOut), dout(n * kOut), dh(n * kHidden);
    for (int step = 0; step < kSteps; ++step) {
      for (int s = 0; s < n; ++s)
        sample(static_cast<std::int64_t>(step) * kGlobalBatch + ctx.rank * n + s, &x[s * kIn], &y[s * kOut]);
      {
        zoe::ForwardScope f(engine, hidden);
        dense(x.data(), f32(f.tensors().params[0]), f32(f.tensors().params[1]), h.data(), n, kIn, kHidden, true);
      }
      {
        zoe::ForwardScope f(engine, head);
        dense(h.data(), f32(f.tensors().params[0]), f32(f.tensors().params[1]), out.data(), n, kHidden, kOut,
              false);
      }
      double loss = 0;
      for (int i = 0; i < n * kOut; ++i) {
        const float d = out[i] - y[i];
        loss += 0.5 * d * d;
        dout[i] = d / static_cast<float>(n * kOut);
      }
      rank_losses[ctx.rank].push_back(loss / (n * kOut));
      {
        zoe::BackwardScope b(engine, head);
        const auto& t = b.tensors();
        dense_backward(h.data(), f32(t.params[0]), dout.data(), f32(t.grads[0]), f32(t.grads[1]), dh.data(), n,
                       kHidden, kOut);
      }
      for (int i = 0; i < n * kHidden; ++i) dh[i] *= 1.0f - h[i] * h[i];  // through tanh
      {
        zoe::BackwardScope b(engine, hidden);
        const auto& t = b.tensors();
        dense_backward(x.data(), f32(t.params[0]), dh.data(), f32(t.grads[0]), f32(t.grads[1]), nullptr, n, kIn,
                       kHidden);
      }
      engine.step();
    }
    engine.synchronize();
    std::vector<std::vector<float>> finals;
    for (zoe::ParamId p : {w1, b1, w2, b2}) finals.push_back(engine.gather_parameter(p));  // a collective
    if (ctx.rank == 0) result.params = std::move(finals);
  });
  for (int s = 0; s < kSteps; ++s) {
    double sum = 0;
    for (int r = 0; r < kWorld; ++r) sum += rank_losses[r][s];  // rank order: deterministic
    result.losses.push_back(sum / kWorld);
  }
  return result;
}

}  // namespace consumer
