// The oneDNN lm_head (examples/gpt/lm_head.hpp) against the Eigen reference in double:
// fp32 to float accuracy; bf16 against the reference on bf16-rounded operands, within a bound
// derived from rounding G to bf16 (unit roundoff 2^-8 relative, 8 significant bits, per element).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/ops.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {

struct Problem {
  int N = 37, C = 24, V = 1003;
  std::vector<float> x, wte;
  std::vector<std::int32_t> y;
  explicit Problem(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    x.resize(static_cast<std::size_t>(N) * C);
    wte.resize(static_cast<std::size_t>(V) * C);
    for (float& v : x) v = d(rng);
    for (float& v : wte) v = 0.3f * d(rng);
    for (int n = 0; n < N; ++n) y.push_back(static_cast<std::int32_t>((n * 7919 + 13) % V));
  }
};

std::vector<double> widen(const std::vector<float>& v, bool round_bf16) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = round_bf16 ? bf16_bits_to_float(to_bf16_bits(v[i])) : v[i];
  return out;
}

struct Reference {
  double loss;
  std::vector<double> dx, dwte;
};

Reference reference(const Problem& p, bool round_bf16) {
  const std::vector<double> x = widen(p.x, round_bf16), w = widen(p.wte, round_bf16);
  Reference r{0, std::vector<double>(p.x.size(), 0.0), std::vector<double>(p.wte.size(), 0.0)};
  std::vector<double> scratch;
  r.loss = ops::lm_head_cross_entropy<double>(x.data(), w.data(), p.y.data(), p.N, p.C, p.V, r.dx.data(),
                                              r.dwte.data(), scratch, 5);
  return r;
}

// Sum over the contraction of |G| |operand|: how far rounding G by a relative `eps` can move
// each gradient element.
void rounding_bounds(const Problem& p, std::vector<double>& bx, std::vector<double>& bw) {
  const std::vector<double> x = widen(p.x, true), w = widen(p.wte, true);
  bx.assign(x.size(), 0.0);
  bw.assign(w.size(), 0.0);
  for (int n = 0; n < p.N; ++n) {
    std::vector<double> l(p.V);
    double mx = -1e300, s = 0;
    for (int v = 0; v < p.V; ++v) {
      l[v] = 0;
      for (int c = 0; c < p.C; ++c) l[v] += x[n * p.C + c] * w[v * p.C + c];
      mx = std::max(mx, l[v]);
    }
    for (int v = 0; v < p.V; ++v) s += std::exp(l[v] - mx);
    for (int v = 0; v < p.V; ++v) {
      const double g = std::abs(std::exp(l[v] - mx) / s - (v == p.y[n] ? 1.0 : 0.0)) / p.N;
      for (int c = 0; c < p.C; ++c) {
        bx[n * p.C + c] += g * std::abs(w[v * p.C + c]);
        bw[v * p.C + c] += g * std::abs(x[n * p.C + c]);
      }
    }
  }
}

TEST(LmHead, Fp32MatchesTheDoubleReferenceAndAddsIntoItsOutputs) {
  const Problem p(1);
  const Reference ref = reference(p, false);
  for (int chunk : {1, 16, 1000}) {
    LmHead head(HeadPrecision::fp32, chunk);
    std::vector<float> dx(p.x.size(), 1.0f), dw(p.wte.size(), -1.0f);  // added into
    const double loss = head.loss_and_grad(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V, dx.data(), dw.data());
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << "chunk " << chunk;
    EXPECT_NEAR(head.loss(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V), ref.loss, 1e-5 * ref.loss);
    double worst_x = 0, worst_w = 0;
    for (std::size_t i = 0; i < dx.size(); ++i) worst_x = std::max(worst_x, std::abs(dx[i] - 1.0 - ref.dx[i]));
    for (std::size_t i = 0; i < dw.size(); ++i) worst_w = std::max(worst_w, std::abs(dw[i] + 1.0 - ref.dwte[i]));
    EXPECT_LT(worst_x, 2e-6) << "chunk " << chunk;
    EXPECT_LT(worst_w, 2e-6) << "chunk " << chunk;
  }
}

TEST(LmHead, Bf16IsTheReferenceOnRoundedOperandsWithinGsRounding) {
  const Problem p(2);
  const Reference ref = reference(p, true), exact = reference(p, false);
  std::vector<double> bx, bw;
  rounding_bounds(p, bx, bw);
  LmHead head(HeadPrecision::bf16, 16);
  std::vector<float> dx(p.x.size(), 0.0f), dw(p.wte.size(), 0.0f);
  const double loss = head.loss_and_grad(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V, dx.data(), dw.data());
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
  // bf16's unit roundoff on each G element (8 significant bits), plus fp32 accumulation.
  const double eps = std::ldexp(1.0, -8);
  int beyond_fp32_x = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) {
    ASSERT_LE(std::abs(dx[i] - ref.dx[i]), eps * bx[i] + 1e-6) << "dx[" << i << "]";
    beyond_fp32_x += std::abs(dx[i] - exact.dx[i]) > 1e-5;
  }
  for (std::size_t i = 0; i < dw.size(); ++i)
    ASSERT_LE(std::abs(dw[i] - ref.dwte[i]), eps * bw[i] + 1e-6) << "dwte[" << i << "]";
  // The operands really were rounded: the bf16 gradients are not the fp32 ones.
  EXPECT_GT(beyond_fp32_x, 0);
  // Evaluation multiplies in fp32 whatever the training precision.
  LmHead fp32(HeadPrecision::fp32, 16);
  EXPECT_EQ(head.loss(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V),
            fp32.loss(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V));
}

TEST(LmHead, RepeatsBitwise) {
  const Problem p(3);
  for (HeadPrecision prec : {HeadPrecision::fp32, HeadPrecision::bf16}) {
    std::vector<float> a(p.x.size(), 0.0f), aw(p.wte.size(), 0.0f), b = a, bw = aw;
    LmHead h1(prec, 8), h2(prec, 8);
    const double l1 = h1.loss_and_grad(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V, a.data(), aw.data());
    const double l2 = h2.loss_and_grad(p.x.data(), p.wte.data(), p.y.data(), p.N, p.C, p.V, b.data(), bw.data());
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(a, b);
    EXPECT_EQ(aw, bw);
  }
}

TEST(LmHead, BadPrecisionAndChunkNameTheirFields) {
  EXPECT_EQ(parse_head_precision("bf16", "--head-precision"), HeadPrecision::bf16);
  try {
    parse_head_precision("fp16", "--head-precision");
    FAIL() << "no error";
  } catch (const zoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--head-precision: 'fp16'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LmHead(HeadPrecision::fp32, 0), zoe::Error);
}

}  // namespace
}  // namespace gpt
