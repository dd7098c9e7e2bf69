// KernelOps, the host twin of the CUDA backend (the CUDA kernels' functions in loops), in the
// float the GPU computes in: the warp-per-row cross-entropy against its definition, and the
// whole model against the CPU backend (CpuOps: Eigen and the oneDNN head), fp32 and bf16 head.
// The finite-difference checks of KernelOps in double are in test_ops.cpp and test_model.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "examples/gpt/kernel_ops.hpp"
#include "examples/gpt/model.hpp"
#include "tests/gpt/plain_provider.hpp"

namespace gpt {
namespace {

// Largest |a - b| over a tensor, relative to the largest |b| in it (gradients of a tensor share
// one scale; elementwise relative error is meaningless where they cancel to ~0).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

TEST(KernelOps, WarpCrossEntropyEqualsTheDefinition) {
  // V = 5 leaves most of the 32 lanes without an element; V = 77 gives lanes 2 or 3 each.
  for (int V : {5, 77}) {
    SCOPED_TRACE("V " + std::to_string(V));
    std::mt19937_64 rng(V);
    std::normal_distribution<double> d(0.0, 3.0);
    const int N = 6, C = 1;  // x = 1, so the logits are wte's column: set them directly
    std::vector<float> x(N, 1.0f), wte(V);
    for (auto& w : wte) w = static_cast<float>(d(rng));
    std::vector<std::int32_t> y(N);
    for (int n = 0; n < N; ++n) y[n] = static_cast<std::int32_t>((n * 7 + 3) % V);
    double mx = -1e300, s = 0, ref = 0;
    for (float w : wte) mx = std::max(mx, double(w));
    for (float w : wte) s += std::exp(double(w) - mx);
    for (int n = 0; n < N; ++n) ref += (std::log(s) + mx - wte[y[n]]) / N;
    KernelOps<float> ops;
    ops.configure_head(4, HeadPrecision::fp32);
    EXPECT_NEAR(ops.head_loss(x.data(), wte.data(), y.data(), N, C, V), ref, 1e-5 * ref);
    // d loss / d x[n] = sum_v G[n, v] wte[v] = E_softmax[w] - w[y_n], over N rows.
    std::vector<float> dx(N, 0.0f), dwte(V, 0.0f);
    ops.head_loss_and_grad(x.data(), wte.data(), y.data(), N, C, V, dx.data(), dwte.data());
    double mean_w = 0;
    for (float w : wte) mean_w += std::exp(double(w) - mx) / s * w;
    for (int n = 0; n < N; ++n) EXPECT_NEAR(dx[n], (mean_w - wte[y[n]]) / N, 1e-6) << n;
  }
}

GptConfig small() {
  GptConfig c;
  c.vocab_size = 997;
  c.context = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

struct ModelRun {
  double loss = 0, eval_loss = 0;
  std::vector<std::vector<float>> grads;
};

template <class Ops>
ModelRun run_model(HeadPrecision head, bool checkpoint) {
  const GptConfig cfg = small();
  GptModel<float, Ops> model(cfg, checkpoint);
  model.set_head_chunk(20);  // 48 rows: chunks of 20, 20, 8
  model.set_head_precision(head);
  test::PlainProvider<float> pp(model.spec(), 5);
  std::mt19937_64 rng(9);
  const int B = 2, T = cfg.context;
  std::vector<std::int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
    tg[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
  }
  ModelRun r;
  r.loss = model.forward_backward(pp, in.data(), tg.data(), B, T);
  r.eval_loss = model.forward(pp, in.data(), tg.data(), B, T);
  r.grads = pp.grads;
  return r;
}

void expect_close(const ModelRun& kernel, const ModelRun& cpu, const ModelSpec& spec, double loss_tol,
                  double grad_tol) {
  EXPECT_NEAR(kernel.loss, cpu.loss, loss_tol * cpu.loss);
  EXPECT_NEAR(kernel.eval_loss, cpu.eval_loss, 1e-7 * cpu.eval_loss);
  for (std::size_t p = 0; p < cpu.grads.size(); ++p)
    EXPECT_LE(max_rel_diff(kernel.grads[p], cpu.grads[p]), grad_tol) << spec.params[p].name;
}

TEST(KernelOps, FloatModelMatchesTheCpuBackend) {
  const ModelSpec spec = make_model_spec(small());
  for (bool checkpoint : {false, true}) {
    SCOPED_TRACE(checkpoint ? "checkpointing" : "no checkpointing");
    const ModelRun kernel = run_model<KernelOps<float>>(HeadPrecision::fp32, checkpoint);
    const ModelRun cpu = run_model<CpuOps<float>>(HeadPrecision::fp32, checkpoint);
    // Both fp32; they differ only in summation orders (GEMM blocking, reductions): measured
    // 2e-9 on the loss and at most 6e-7 on a gradient.
    expect_close(kernel, cpu, spec, 1e-7, 5e-6);
    EXPECT_NE(kernel.grads, cpu.grads);  // really two implementations
  }
}

TEST(KernelOps, Bf16HeadMatchesTheOneDnnBf16Head) {
  const ModelSpec spec = make_model_spec(small());
  const ModelRun kernel = run_model<KernelOps<float>>(HeadPrecision::bf16, false);
  const ModelRun cpu = run_model<CpuOps<float>>(HeadPrecision::bf16, false);
  const ModelRun kernel_fp32 = run_model<KernelOps<float>>(HeadPrecision::fp32, false);
  // Both round x, wte and G to bf16 and accumulate in fp32 (measured: at most 9e-7 apart); G
  // could round to neighbouring bf16 values where the two fp32 softmaxes differ in the last bits.
  expect_close(kernel, cpu, spec, 1e-7, 2e-5);
  // ... and the bf16 head really differs from the fp32 one.
  EXPECT_GT(max_rel_diff(kernel.grads[0], kernel_fp32.grads[0]), 1e-4);
}

}  // namespace
}  // namespace gpt
