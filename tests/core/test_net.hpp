// A small trainer for the engine tests: a chain of dense layers y = act(x W + b), one
// module per layer, with an optional head that reuses layer 0's W (tied weights), trained
// on a deterministic regression task with MSE. Forward and backward are written here by
// hand in fp32, reading bf16/fp16/fp32 parameters and adding gradients in the compute dtype.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/half.hpp"
#include "zoe/engine.hpp"

namespace zoe::test {

inline float load(const TensorView& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::f32: return t.as<float>()[i];
    case DType::bf16: return kernels::bf16_to_f32(t.as<std::uint16_t>()[i]);
    default: return kernels::f16_to_f32(t.as<std::uint16_t>()[i]);
  }
}
inline void add(const TensorView& t, std::int64_t i, float v) {
  switch (t.dtype) {
    case DType::f32: t.as<float>()[i] += v; break;
    case DType::bf16: t.as<std::uint16_t>()[i] = kernels::f32_to_bf16(load(t, i) + v); break;
    default: t.as<std::uint16_t>()[i] = kernels::f32_to_f16(load(t, i) + v); break;
  }
}

/// A cheap deterministic initial value for element i of parameter `param`: a splitmix64 hash
/// of (param, i) mapped to a uniform value in [-scale, scale) (24 random bits, exact in fp32).
inline float hashed_uniform(std::uint64_t param, std::int64_t i, float scale) {
  std::uint64_t z = (param << 40) ^ static_cast<std::uint64_t>(i);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (static_cast<float>(z >> 40) * 0x1p-24f * 2.0f - 1.0f) * scale;
}

struct NetSpec {
  std::vector<int> widths{8, 8, 8, 4};  // input, hidden..., output
  bool tied_head = false;               // extra head module reusing layer 0's W (needs square W)
  std::uint32_t seed = 1234;
  /// If set, element i of the p-th registered parameter (registration order: l0.weight,
  /// l0.bias, l1.weight, ..., head.bias) starts as value(p, i) instead of seeded draws.
  std::function<float(int param, std::int64_t i)> value;
  /// Register through a ParamInitializer computing value() for the requested elements only
  /// (needs `value`) instead of handing over a full array.
  bool by_initializer = false;
  /// Called (from the rank's thread) on every initializer call: rank, parameter, first
  /// element, element count.
  std::function<void(int rank, int param, std::int64_t offset, std::int64_t count)> on_init;
};

class TestNet {
 public:
  TestNet(Engine& e, const NetSpec& spec) : e_(e), spec_(spec) {
    std::mt19937 gen(spec.seed);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (std::size_t l = 0; l + 1 < spec.widths.size(); ++l) {
      int in = spec.widths[l], out = spec.widths[l + 1];
      std::vector<float> w(static_cast<std::size_t>(in) * out), b(out);
      for (float& v : w) v = nd(gen) / std::sqrt(static_cast<float>(in));
      for (float& v : b) v = nd(gen) * 0.1f;
      ParamId W = add_param("l" + std::to_string(l) + ".weight", {in, out}, std::move(w));
      ParamId B = add_param("l" + std::to_string(l) + ".bias", {out}, std::move(b));
      layers_.push_back({in, out, e.add_module("l" + std::to_string(l), {W, B})});
      params_.push_back(W);
      params_.push_back(B);
    }
    if (spec.tied_head) {
      int c = spec.widths.back();
      std::vector<float> b(c, 0.05f);
      ParamId B = add_param("head.bias", {c}, std::move(b));
      layers_.push_back({c, c, e.add_module("head", {params_[0], B})});
      params_.push_back(B);
    }
  }

  const std::vector<ParamId>& params() const { return params_; }
  /// Called right after each layer's begin_forward returns (tests of overlap).
  std::function<void(int layer)> on_forward;

  /// Deterministic sample k of a 256-sample data set: x in [-1,1]^in, y = sin(sum x * j).
  void sample(std::int64_t k, float* x, float* y) const {
    std::mt19937 gen(static_cast<std::uint32_t>((k % 256) * 7919 + 17));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float s = 0;
    for (int i = 0; i < spec_.widths.front(); ++i) s += (x[i] = u(gen));
    for (int j = 0; j < out_width(); ++j) y[j] = std::sin(s * (j + 1) * 0.5f);
  }
  int out_width() const { return layers_.back().out; }

  /// One micro-batch of samples [first, first + count): forward, loss, backward. Returns the
  /// mean loss. `loss_scale` multiplies the gradients (fp16). `poison` puts an inf into the
  /// gradient of layer 0's bias.
  double micro_batch(std::int64_t first, int count, double loss_scale = 1.0, bool poison = false) {
    const int L = static_cast<int>(layers_.size());
    std::vector<std::vector<float>> acts(L + 1);
    int in0 = spec_.widths.front(), outw = out_width();
    acts[0].resize(static_cast<std::size_t>(count) * in0);
    std::vector<float> y(static_cast<std::size_t>(count) * outw);
    for (int s = 0; s < count; ++s) sample(first + s, &acts[0][s * in0], &y[s * outw]);
    for (int l = 0; l < L; ++l) {
      ForwardScope scope(e_, layers_[l].module);
      if (on_forward) on_forward(l);
      forward(l, scope.tensors(), acts[l], acts[l + 1], count);
    }
    double loss = 0;
    std::vector<float> d(acts[L].size());
    for (std::size_t i = 0; i < d.size(); ++i) {
      float diff = acts[L][i] - y[i];
      loss += 0.5 * diff * diff;
      d[i] = static_cast<float>(diff / (count * outw) * loss_scale);
    }
    for (int l = L - 1; l >= 0; --l) {
      BackwardScope scope(e_, layers_[l].module);
      std::vector<float> dx;
      backward(l, scope.tensors(), acts[l], acts[l + 1], d, dx, count);
      if (poison && l == 0) add(scope.tensors().grads[1], 0, INFINITY);
      d.swap(dx);
    }
    return loss / (count * outw);
  }

 private:
  struct Layer {
    int in, out;
    ModuleId module;
  };
  bool is_last(int l) const { return l + 1 == static_cast<int>(layers_.size()); }

  // Registers the next parameter with `drawn` (the seeded draws) or as NetSpec asks.
  ParamId add_param(const std::string& name, std::vector<std::int64_t> shape, std::vector<float> drawn) {
    const int index = registered_++;
    if (!spec_.value) return e_.add_parameter(name, std::move(shape), drawn);
    if (!spec_.by_initializer) {
      for (std::size_t i = 0; i < drawn.size(); ++i) drawn[i] = spec_.value(index, static_cast<std::int64_t>(i));
      return e_.add_parameter(name, std::move(shape), drawn);
    }
    return e_.add_parameter(name, std::move(shape),
                            [value = spec_.value, on_init = spec_.on_init, index, rank = e_.rank()](
                                std::int64_t offset, std::span<float> out) {
                              if (on_init) on_init(rank, index, offset, static_cast<std::int64_t>(out.size()));
                              for (std::size_t i = 0; i < out.size(); ++i)
                                out[i] = value(index, offset + static_cast<std::int64_t>(i));
                            });
  }

  void forward(int l, const ModuleTensors& t, const std::vector<float>& x, std::vector<float>& y, int n) {
    const Layer& L = layers_[l];
    y.assign(static_cast<std::size_t>(n) * L.out, 0.0f);
    for (int s = 0; s < n; ++s)
      for (int o = 0; o < L.out; ++o) {
        float z = load(t.params[1], o);
        for (int i = 0; i < L.in; ++i) z += x[s * L.in + i] * load(t.params[0], i * L.out + o);
        y[s * L.out + o] = is_last(l) ? z : std::tanh(z);
      }
  }

  void backward(int l, const ModuleTensors& t, const std::vector<float>& x, const std::vector<float>& y,
                const std::vector<float>& dy, std::vector<float>& dx, int n) {
    const Layer& L = layers_[l];
    std::vector<float> dz(dy.size());
    for (std::size_t i = 0; i < dy.size(); ++i) dz[i] = is_last(l) ? dy[i] : dy[i] * (1 - y[i] * y[i]);
    dx.assign(static_cast<std::size_t>(n) * L.in, 0.0f);
    for (int i = 0; i < L.in; ++i)
      for (int o = 0; o < L.out; ++o) {
        float gw = 0;
        for (int s = 0; s < n; ++s) gw += x[s * L.in + i] * dz[s * L.out + o];
        add(t.grads[0], i * L.out + o, gw);
      }
    for (int o = 0; o < L.out; ++o) {
      float gb = 0;
      for (int s = 0; s < n; ++s) gb += dz[s * L.out + o];
      add(t.grads[1], o, gb);
    }
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < L.in; ++i) {
        float v = 0;
        for (int o = 0; o < L.out; ++o) v += dz[s * L.out + o] * load(t.params[0], i * L.out + o);
        dx[s * L.in + i] = v;
      }
  }

  Engine& e_;
  NetSpec spec_;
  std::vector<Layer> layers_;
  std::vector<ParamId> params_;
  int registered_ = 0;
};

/// Trains `steps` steps of `global_batch` samples on `world` ranks as threads; returns every
/// parameter's final fp32 master value (from rank 0) and fills `reports` if given.
struct RunResult {
  std::vector<std::vector<float>> params;
  std::vector<StepResult> steps;
  std::vector<MemoryReport> memory;    // per rank, after the last step
  std::vector<TrafficReport> traffic;  // per rank, last step
  std::vector<double> losses;          // rank 0's mean micro-batch loss per step
};

/// `adapt`, if given, may replace each rank's communicator (a wrapper) before the engines start.
inline RunResult train(const Config& config, const NetSpec& spec, int world, int steps, int global_batch,
                       int poison_step = -1, const std::function<void(RankContext&)>& adapt = {}) {
  RunResult result;
  result.memory.resize(world);
  result.traffic.resize(world);
  auto ranks = make_local_ranks(world, 60.0);
  if (adapt)
    for (RankContext& r : ranks) adapt(r);
  std::vector<std::vector<std::vector<float>>> finals(world);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine engine(config, ctx);
    TestNet net(engine, spec);
    const int gas = config.gradient_accumulation_steps;
    const int micro = global_batch / (world * gas);
    for (int s = 0; s < steps; ++s) {
      double loss = 0;
      for (int j = 0; j < gas; ++j) {
        std::int64_t first = static_cast<std::int64_t>(s) * global_batch + (j * world + ctx.rank) * micro;
        loss += net.micro_batch(first, micro, engine.loss_scale(), s == poison_step && ctx.rank == 0);
      }
      StepResult r = engine.step();
      if (ctx.rank == 0) {
        result.steps.push_back(r);
        result.losses.push_back(loss / gas);
      }
    }
    engine.synchronize();
    result.memory[ctx.rank] = engine.memory_report();
    result.traffic[ctx.rank] = engine.last_step_traffic();
    for (ParamId p : net.params()) finals[ctx.rank].push_back(engine.gather_parameter(p));
  });
  result.params = finals[0];
  return result;
}

/// True if both runs ended with bitwise equal parameters (every value, same shapes).
inline bool bitwise_equal(const RunResult& a, const RunResult& b) {
  if (a.params.size() != b.params.size()) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (a.params[i].size() != b.params[i].size() ||
        std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

/// Where two sets of parameters first differ, for a failure message: "param P element I:
/// A (0xBITS) vs B (0xBITS)", a size mismatch, or "none".
inline std::string describe_first_difference(const std::vector<std::vector<float>>& a,
                                             const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return std::to_string(a.size()) + " parameters vs " + std::to_string(b.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    if (a[p].size() != b[p].size())
      return "param " + std::to_string(p) + ": " + std::to_string(a[p].size()) + " elements vs " +
             std::to_string(b[p].size());
    for (std::size_t i = 0; i < a[p].size(); ++i) {
      std::uint32_t x, y;
      std::memcpy(&x, &a[p][i], sizeof x);
      std::memcpy(&y, &b[p][i], sizeof y);
      if (x == y) continue;
      char text[160];
      std::snprintf(text, sizeof text, "param %zu element %zu: %.9g (0x%08x) vs %.9g (0x%08x)", p, i,
                    static_cast<double>(a[p][i]), x, static_cast<double>(b[p][i]), y);
      return text;
    }
  }
  return "none";
}

/// A fresh, empty directory under the system temp dir named zoe-<tag>-<pid> (a test's files).
inline std::string temp_dir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("zoe-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace zoe::test
