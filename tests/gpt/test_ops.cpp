// Every op's backward against central finite differences in double precision (small shapes),
// plus forward values against direct formulas, for each compute backend that runs in double on
// the host: CpuOps (the CPU trainer's Eigen ops) and KernelOps (the CUDA kernels' math).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/gpt/cpu_ops.hpp"
#include "examples/gpt/kernel_ops.hpp"
#include "tests/gpt/fd_check.hpp"

namespace gpt {
namespace {

using test::dot;
using test::expect_gradient;
using test::random_vector;
using Vec = std::vector<double>;

template <class Backend>
class Ops : public ::testing::Test {};
using Backends = ::testing::Types<CpuOps<double>, KernelOps<double>>;
class BackendNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, CpuOps<double>> ? "Cpu" : "Kernel";
  }
};
TYPED_TEST_SUITE(Ops, Backends, BackendNames);

TYPED_TEST(Ops, EmbeddingGradient) {
  TypeParam ops;
  std::mt19937_64 rng(1);
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tok{0, 3, 3, 4, 1, 3};
  Vec wte = random_vector(V * C, rng), wpe = random_vector(T * C, rng), g = random_vector(B * T * C, rng);
  Vec out(B * T * C);
  auto f = [&] {
    ops.embedding_forward(tok.data(), B, T, C, wte.data(), wpe.data(), out.data());
    return dot(g, out);
  };
  f();
  EXPECT_DOUBLE_EQ(out[(1 * T + 2) * C + 1], wte[3 * C + 1] + wpe[2 * C + 1]);
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  ops.embedding_backward(tok.data(), B, T, C, g.data(), dwte.data(), dwpe.data());
  expect_gradient("dwte", wte, dwte, f);
  expect_gradient("dwpe", wpe, dwpe, f);
}

TYPED_TEST(Ops, LayerNormForwardAndGradient) {
  TypeParam ops;
  std::mt19937_64 rng(2);
  const int N = 3, C = 8;
  Vec x = random_vector(N * C, rng), w = random_vector(C, rng), b = random_vector(C, rng);
  Vec g = random_vector(N * C, rng), out(N * C), mean(N), rstd(N);
  auto f = [&] {
    ops.layernorm_forward(x.data(), w.data(), b.data(), N, C, out.data(), mean.data(),
                                   rstd.data());
    return dot(g, out);
  };
  f();
  // Row 1 by the definition: (x - mu) / sqrt(var + eps) * w + b.
  double mu = 0, var = 0;
  for (int c = 0; c < C; ++c) mu += x[C + c] / C;
  for (int c = 0; c < C; ++c) var += (x[C + c] - mu) * (x[C + c] - mu) / C;
  EXPECT_NEAR(out[C + 5], (x[C + 5] - mu) / std::sqrt(var + 1e-5) * w[5] + b[5], 1e-12);
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  ops.layernorm_backward(g.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C,
                                  dx.data(), dw.data(), db.data());
  expect_gradient("dx", x, dx, f);
  expect_gradient("dw", w, dw, f);
  expect_gradient("db", b, db, f);
}

TYPED_TEST(Ops, LinearForwardAndGradient) {
  TypeParam ops;
  std::mt19937_64 rng(3);
  const int N = 4, in = 3, out_dim = 5;
  Vec x = random_vector(N * in, rng), W = random_vector(in * out_dim, rng);
  Vec b = random_vector(out_dim, rng), g = random_vector(N * out_dim, rng), y(N * out_dim);
  auto f = [&] {
    ops.linear_forward(x.data(), W.data(), b.data(), N, in, out_dim, y.data());
    return dot(g, y);
  };
  f();
  double ref = b[4];
  for (int k = 0; k < in; ++k) ref += x[2 * in + k] * W[k * out_dim + 4];
  EXPECT_NEAR(y[2 * out_dim + 4], ref, 1e-12);
  Vec dx(N * in, 0.0), dW(in * out_dim, 0.0), db(out_dim, 0.0);
  ops.linear_backward(g.data(), x.data(), W.data(), N, in, out_dim, dx.data(), dW.data(),
                               db.data());
  expect_gradient("dx", x, dx, f);
  expect_gradient("dW", W, dW, f);
  expect_gradient("db", b, db, f);
}

TYPED_TEST(Ops, GeluForwardAndGradient) {
  TypeParam ops;
  std::mt19937_64 rng(4);
  Vec x = random_vector(20, rng, 2.0), g = random_vector(20, rng), y(20);
  auto f = [&] {
    ops.gelu_forward(x.data(), 20, y.data());
    return dot(g, y);
  };
  f();
  const double v = x[7];
  EXPECT_NEAR(y[7], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))),
              1e-15);
  Vec dx(20, 0.0);
  ops.gelu_backward(g.data(), x.data(), 20, dx.data());
  expect_gradient("dx", x, dx, f);
}

TYPED_TEST(Ops, AttentionIsCausalAndItsGradientMatches) {
  TypeParam ops;
  std::mt19937_64 rng(5);
  const int B = 2, T = 5, C = 6, H = 2;
  Vec qkv = random_vector(B * T * 3 * C, rng), g = random_vector(B * T * C, rng);
  Vec out(B * T * C), att(B * H * T * T);
  auto f = [&] {
    ops.attention_forward(qkv.data(), B, T, C, H, out.data(), att.data());
    return dot(g, out);
  };
  f();
  // Row 0 attends only to position 0: its output is v_0 of the head.
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[b * T * C + c], qkv[b * T * 3 * C + 2 * C + c], 1e-12);
  // Probabilities: rows sum to 1, zero above the diagonal.
  for (int r = 0; r < B * H * T; ++r) {
    double s = 0;
    for (int c = 0; c < T; ++c) s += att[r * T + c];
    EXPECT_NEAR(s, 1.0, 1e-12);
    EXPECT_EQ(att[r * T + T - 1] == 0.0, r % T != T - 1);
  }
  // Changing a later token does not change earlier outputs.
  const Vec before = out;
  qkv[(0 * T + 4) * 3 * C + 2 * C + 1] += 1.0;
  f();
  for (int i = 0; i < 4 * C; ++i) EXPECT_EQ(out[i], before[i]);
  Vec dqkv(qkv.size(), 0.0);
  f();
  ops.attention_backward(g.data(), qkv.data(), att.data(), B, T, C, H, dqkv.data());
  expect_gradient("dqkv", qkv, dqkv, f);
}

TYPED_TEST(Ops, LmHeadCrossEntropyGradientAndChunking) {
  TypeParam ops;
  std::mt19937_64 rng(6);
  const int N = 7, C = 4, V = 11;
  Vec x = random_vector(N * C, rng), wte = random_vector(V * C, rng);
  const std::vector<std::int32_t> y{0, 10, 3, 3, 7, 1, 5};
  ops.configure_head(3, HeadPrecision::fp32);
  auto f = [&] { return ops.head_loss(x.data(), wte.data(), y.data(), N, C, V); };
  // Reference loss by the definition.
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    std::vector<double> l(V);
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      l[v] = 0;
      for (int c = 0; c < C; ++c) l[v] += x[n * C + c] * wte[v * C + c];
      mx = std::max(mx, l[v]);
    }
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
    ref += (std::log(s) + mx - l[y[n]]) / N;
  }
  EXPECT_NEAR(f(), ref, 1e-12);
  for (int chunk : {1, 3, 7, 100}) {
    Vec dx(N * C, 0.0), dwte(V * C, 0.0);
    ops.configure_head(chunk, HeadPrecision::fp32);
    const double loss =
        ops.head_loss_and_grad(x.data(), wte.data(), y.data(), N, C, V, dx.data(), dwte.data());
    EXPECT_NEAR(loss, ref, 1e-12) << "chunk " << chunk;
    expect_gradient("dx chunk " + std::to_string(chunk), x, dx, f);
    expect_gradient("dwte chunk " + std::to_string(chunk), wte, dwte, f);
  }
}

TEST(OpsFloat, AttentionMatchesDouble) {
  // The float instantiation the trainer uses agrees with double to float precision.
  std::mt19937_64 rng(7);
  const int B = 1, T = 16, C = 8, H = 2;
  Vec qkv = random_vector(B * T * 3 * C, rng);
  std::vector<float> qkvf(qkv.begin(), qkv.end()), outf(B * T * C), attf(B * H * T * T);
  Vec out(B * T * C), att(B * H * T * T);
  ops::attention_forward<double>(qkv.data(), B, T, C, H, out.data(), att.data());
  ops::attention_forward<float>(qkvf.data(), B, T, C, H, outf.data(), attf.data());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(outf[i], out[i], 1e-5);
}

// The bias gradient's column sums are the same bits wherever the buffers lie: the trainer's fp32
// working copies (module_copies.hpp) are std::vectors whose address modulo 64 bytes depends on
// the heap, so a sum whose order followed the destination's alignment (Eigen's vectorised
// colwise().sum() peels unaligned columns into a linear scalar sum, the rest into a tree of
// packets) made two identical fp16 runs differ (issue 19: one bias element after a few steps).
// Every placement of db and dy (0-15 floats past a 64-byte boundary) must give the rows-in-order
// sum of kernel_math.hpp's bias_grad_column (KernelOps', CudaOps') bit for bit; dx and dW too.
TEST(OpsFloat, LinearBackwardBitsDoNotDependOnWhereTheBuffersLie) {
  std::mt19937_64 rng(19);
  std::normal_distribution<float> normal;
  const int N = 32, in = 16;
  for (const int out : {16, 48, 64, 100}) {
    std::vector<float> x(N * in), W(in * out), dy(N * out), db0(out);
    for (float& v : x) v = normal(rng);
    for (float& v : W) v = normal(rng);
    for (float& v : dy) v = 100 * normal(rng);  // sums with cancellation: the order shows
    for (float& v : db0) v = normal(rng);
    std::vector<float> ref_db = db0;
    for (int c = 0; c < out; ++c) kernels::bias_grad_column<float>(c, dy.data(), N, out, ref_db.data());
    std::vector<float> ref_dx, ref_dW;
    // One buffer per array, each with room to start anywhere in a 64-byte line.
    std::vector<float> bdy(dy.size() + 32), bdb(out + 32), bdx(N * in + 32), bdW(in * out + 32);
    auto at = [](std::vector<float>& b, int offset) {
      const auto address = reinterpret_cast<std::uintptr_t>(b.data());
      return b.data() + (64 - address % 64) % 64 / sizeof(float) + offset;
    };
    for (int offset = 0; offset < 16; ++offset) {
      float* pdy = at(bdy, (offset * 5) % 16);
      float* pdb = at(bdb, offset);
      float* pdx = at(bdx, (offset * 3) % 16);
      float* pdW = at(bdW, (offset * 7) % 16);
      std::copy(dy.begin(), dy.end(), pdy);
      std::copy(db0.begin(), db0.end(), pdb);
      std::fill(pdx, pdx + N * in, 0.5f);
      std::fill(pdW, pdW + in * out, 0.25f);
      ops::linear_backward<float>(pdy, x.data(), W.data(), N, in, out, pdx, pdW, pdb);
      const std::string where = "out " + std::to_string(out) + ", db " + std::to_string(offset) + " floats past a 64-byte line";
      for (int c = 0; c < out; ++c) ASSERT_EQ(pdb[c], ref_db[c]) << where << ", column " << c;
      if (offset == 0) {
        ref_dx.assign(pdx, pdx + N * in);
        ref_dW.assign(pdW, pdW + in * out);
      }
      ASSERT_TRUE(std::equal(ref_dx.begin(), ref_dx.end(), pdx)) << where;
      ASSERT_TRUE(std::equal(ref_dW.begin(), ref_dW.end(), pdW)) << where;
    }
  }
}

}  // namespace
}  // namespace gpt
