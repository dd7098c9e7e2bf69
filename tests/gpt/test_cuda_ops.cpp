// CudaOps (the GPU backend) against KernelOps<float>, its host twin: the same kernel_math.hpp
// functions and the same row-major GEMMs, so every op and a whole GptModel forward/backward
// must agree to fp32 rounding (the kernels' math itself is covered on the CPU by
// test_kernel_ops.cpp: finite differences and agreement with the Eigen ops).
// Without a usable GPU only the first tests run (cuda_usable answers, CudaOps and device arrays
// refuse with CUDA's error text); the comparisons skip, printing why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "examples/gpt/cuda_ops.hpp"
#include "examples/gpt/kernel_ops.hpp"
#include "examples/gpt/model.hpp"
#include "tests/gpt/plain_provider.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {

using RefOps = KernelOps<float>;
using ::testing::HasSubstr;

// Odd sizes: C not a multiple of 32 (warp lanes), V not a multiple of the 32 lanes either,
// d = C/H = 4, N = B*T = 10 rows.
constexpr int kB = 2, kT = 5, kC = 12, kH = 3, kV = 37, kN = kB * kT;
constexpr double kTol = 1e-5;      // fp32, relative to the largest reference magnitude
constexpr double kBf16Tol = 1e-2;  // bf16 operands (8-bit mantissa), fp32 accumulation

// ---------------------------------------------------------------------------------------------
// Without a GPU (and on a machine that has one): the answers that need no device work.

TEST(CudaOpsWithoutGpu, UsableAnswersAndConstructionCarriesCudasErrorText) {
  std::string why;
  const bool usable = cuda_usable(&why);
  std::cout << "cuda_usable: " << (usable ? "yes" : "no, " + why) << "\n";
  EXPECT_EQ(cuda_usable(nullptr), usable);  // the reason is optional, the answer the same
  if (!usable) {
    ASSERT_FALSE(why.empty());
    try {
      CudaOps ops(0, nullptr);
      FAIL() << "CudaOps constructed although cuda_usable said: " << why;
    } catch (const zoe::CudaError& e) {
      EXPECT_NE(e.code(), 0);
      EXPECT_THAT(e.message(), HasSubstr("cudaSetDevice(0)"));
      EXPECT_THAT(e.message(), HasSubstr(why));  // the same CUDA error, with its text
    }
  } else {
    EXPECT_TRUE(why.empty());
    EXPECT_NO_THROW(CudaOps(0, nullptr));
    // No machine has 2^20 GPUs: the runtime's invalid-device error, named.
    try {
      CudaOps ops(1 << 20, nullptr);
      FAIL() << "CudaOps constructed on device 2^20";
    } catch (const zoe::CudaError& e) {
      EXPECT_THAT(e.message(), HasSubstr("cudaSetDevice(1048576)"));
      EXPECT_THAT(e.message(), HasSubstr("cudaErrorInvalidDevice"));
    }
  }
}

TEST(CudaOpsWithoutGpu, AnEmptyArrayNeedsNoDevice) {
  cuda::Array<float> a;
  a.resize(0);  // no allocation
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(a.data(), nullptr);
  cuda::Array<float> b(std::move(a));
  EXPECT_EQ(b.size(), 0u);
  std::string why;
  if (!cuda_usable(&why)) {
    try {
      b.resize(10);
      FAIL() << "cudaMalloc succeeded without a usable device (" << why << ")";
    } catch (const zoe::CudaError& e) {
      EXPECT_THAT(e.message(), HasSubstr("cudaMalloc(40 bytes)"));
      EXPECT_THAT(e.message(), HasSubstr(why));
    }
    EXPECT_EQ(b.size(), 0u);  // unchanged after the failure
  }
}

// ---------------------------------------------------------------------------------------------
// With a GPU: CudaOps against KernelOps<float>.

// a - b elementwise.
std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Largest |got - want| over the largest |want|; fails (naming the worst element) above tol.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  ASSERT_GT(scale, 0.0) << what << ": an all-zero reference checks nothing";
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= worst)) {  // also catches NaN
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst / scale, tol) << what << "[" << at << "]: got " << got[at] << ", want "
                                << want[at] << " (largest reference magnitude " << scale << ")";
}

class CudaOpsVsKernelOpsOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_usable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
    gpu_.emplace(0, nullptr);
  }

  std::vector<float> random(std::size_t n, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  std::vector<std::int32_t> tokens(std::size_t n, int V) {
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(rng_() % V);
    return t;
  }
  cuda::Array<float> up(const std::vector<float>& v) {
    cuda::Array<float> a;
    gpu_->upload(v.data(), v.size(), a);
    return a;
  }
  cuda::Array<std::int32_t> up(const std::vector<std::int32_t>& v) {
    cuda::Array<std::int32_t> a;
    gpu_->upload(v.data(), v.size(), a);
    return a;
  }
  std::vector<float> down(const cuda::Array<float>& a) {
    std::vector<float> v(a.size());
    gpu_->download(a.data(), v.size(), v.data());
    return v;
  }

  // Runs the head both ways (chunk 4 < N rows) and compares loss, dx and dwte.
  void compare_head(HeadPrecision precision, double tol) {
    const auto x = random(kN * kC), wte = random(kV * kC, 0.5f);
    const auto y = tokens(kN, kV);
    auto dx = random(kN * kC), dwte = random(kV * kC);
    const auto dx0 = dx, dwte0 = dwte;  // what the gradients are added into
    auto gx = up(x), gw = up(wte), gdx = up(dx), gdw = up(dwte);
    auto gy = up(y);
    gpu_->configure_head(4, precision);
    ref_.configure_head(4, precision);
    const double eval_got = gpu_->head_loss(gx.data(), gw.data(), gy.data(), kN, kC, kV);
    const double eval_want = ref_.head_loss(x.data(), wte.data(), y.data(), kN, kC, kV);
    EXPECT_NEAR(eval_got, eval_want, kTol * eval_want) << "evaluation is fp32 at any precision";
    const double got = gpu_->head_loss_and_grad(gx.data(), gw.data(), gy.data(), kN, kC, kV,
                                                gdx.data(), gdw.data());
    const double want = ref_.head_loss_and_grad(x.data(), wte.data(), y.data(), kN, kC, kV,
                                                dx.data(), dwte.data());
    EXPECT_NEAR(got, want, tol * want);
    // The amounts added (about 1/N each), not the sums: the random start would dwarf them.
    expect_close("head dx", minus(down(gdx), dx0), minus(dx, dx0), tol);
    expect_close("head dwte", minus(down(gdw), dwte0), minus(dwte, dwte0), tol);
  }

  std::optional<CudaOps> gpu_;
  RefOps ref_;
  std::mt19937_64 rng_{7};
};

TEST_F(CudaOpsVsKernelOpsOnGpu, MemoryOps) {
  const auto v = random(1000);
  auto a = up(v);
  EXPECT_EQ(down(a), v);
  const float* before = a.data();
  a.resize(10);  // shrinking keeps the allocation
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(a.size(), 10u);
  cuda::Array<float> z;
  gpu_->zero(z, 77);
  EXPECT_EQ(down(z), std::vector<float>(77, 0.f));
  auto b = up(random(1000));
  a.resize(1000);
  gpu_->copy(b.data(), 1000, a.data());
  EXPECT_EQ(down(a), down(b));
  const auto x = random(1000), y = random(1000);
  auto gx = up(x), gy = up(y);
  auto want = y;
  ref_.add(x.data(), x.size(), want.data());
  gpu_->add(gx.data(), x.size(), gy.data());
  EXPECT_EQ(down(gy), want);  // one fp32 add per element: the same bits
}

TEST_F(CudaOpsVsKernelOpsOnGpu, Embedding) {
  const auto tok = tokens(kN, kV);
  const auto wte = random(kV * kC), wpe = random(kT * kC), dout = random(kN * kC);
  auto dwte = random(kV * kC), dwpe = random(kT * kC);
  std::vector<float> out(kN * kC);
  auto gtok = up(tok);
  auto gwte = up(wte), gwpe = up(wpe), gdout = up(dout), gdwte = up(dwte), gdwpe = up(dwpe);
  cuda::Array<float> gout;
  gout.resize(out.size());
  ref_.embedding_forward(tok.data(), kB, kT, kC, wte.data(), wpe.data(), out.data());
  gpu_->embedding_forward(gtok.data(), kB, kT, kC, gwte.data(), gwpe.data(), gout.data());
  expect_close("embedding out", down(gout), out, kTol);
  ref_.embedding_backward(tok.data(), kB, kT, kC, dout.data(), dwte.data(), dwpe.data());
  gpu_->embedding_backward(gtok.data(), kB, kT, kC, gdout.data(), gdwte.data(), gdwpe.data());
  expect_close("embedding dwte", down(gdwte), dwte, kTol);
  expect_close("embedding dwpe", down(gdwpe), dwpe, kTol);
}

TEST_F(CudaOpsVsKernelOpsOnGpu, LayerNorm) {
  const auto x = random(kN * kC, 2.f), w = random(kC), b = random(kC), dout = random(kN * kC);
  auto dx = random(kN * kC), dw = random(kC), db = random(kC);
  std::vector<float> out(kN * kC), mean(kN), rstd(kN);
  auto gx = up(x), gw = up(w), gb = up(b), gdout = up(dout), gdx = up(dx), gdw = up(dw),
       gdb = up(db);
  cuda::Array<float> gout, gmean, grstd;
  gout.resize(out.size());
  gmean.resize(kN);
  grstd.resize(kN);
  ref_.layernorm_forward(x.data(), w.data(), b.data(), kN, kC, out.data(), mean.data(),
                         rstd.data());
  gpu_->layernorm_forward(gx.data(), gw.data(), gb.data(), kN, kC, gout.data(), gmean.data(),
                          grstd.data());
  expect_close("layernorm out", down(gout), out, kTol);
  expect_close("layernorm mean", down(gmean), mean, kTol);
  expect_close("layernorm rstd", down(grstd), rstd, kTol);
  ref_.layernorm_backward(dout.data(), x.data(), w.data(), mean.data(), rstd.data(), kN, kC,
                          dx.data(), dw.data(), db.data());
  gpu_->layernorm_backward(gdout.data(), gx.data(), gw.data(), gmean.data(), grstd.data(), kN, kC,
                           gdx.data(), gdw.data(), gdb.data());
  expect_close("layernorm dx", down(gdx), dx, kTol);
  expect_close("layernorm dw", down(gdw), dw, kTol);
  expect_close("layernorm db", down(gdb), db, kTol);
}

TEST_F(CudaOpsVsKernelOpsOnGpu, Linear) {
  const int in = kC, out = 3 * kC;
  const auto x = random(kN * in), W = random(in * out, 0.5f), b = random(out),
             dy = random(kN * out);
  auto dx = random(kN * in), dW = random(in * out), db = random(out);
  std::vector<float> y(kN * out);
  auto gx = up(x), gW = up(W), gb = up(b), gdy = up(dy), gdx = up(dx), gdW = up(dW), gdb = up(db);
  cuda::Array<float> gy;
  gy.resize(y.size());
  ref_.linear_forward(x.data(), W.data(), b.data(), kN, in, out, y.data());
  gpu_->linear_forward(gx.data(), gW.data(), gb.data(), kN, in, out, gy.data());
  expect_close("linear y", down(gy), y, kTol);
  ref_.linear_backward(dy.data(), x.data(), W.data(), kN, in, out, dx.data(), dW.data(),
                       db.data());
  gpu_->linear_backward(gdy.data(), gx.data(), gW.data(), kN, in, out, gdx.data(), gdW.data(),
                        gdb.data());
  expect_close("linear dx", down(gdx), dx, kTol);
  expect_close("linear dW", down(gdW), dW, kTol);
  expect_close("linear db", down(gdb), db, kTol);
  // Without dx (the first layer): only dW and db, added again.
  ref_.linear_backward(dy.data(), x.data(), W.data(), kN, in, out, nullptr, dW.data(), db.data());
  gpu_->linear_backward(gdy.data(), gx.data(), gW.data(), kN, in, out, nullptr, gdW.data(),
                        gdb.data());
  expect_close("linear dW (no dx)", down(gdW), dW, kTol);
  expect_close("linear db (no dx)", down(gdb), db, kTol);
}

TEST_F(CudaOpsVsKernelOpsOnGpu, Gelu) {
  const std::int64_t n = 4 * kN * kC + 3;
  const auto x = random(n, 2.f), dy = random(n);
  auto dx = random(n);
  std::vector<float> y(n);
  auto gx = up(x), gdy = up(dy), gdx = up(dx);
  cuda::Array<float> gy;
  gy.resize(n);
  ref_.gelu_forward(x.data(), n, y.data());
  gpu_->gelu_forward(gx.data(), n, gy.data());
  expect_close("gelu y", down(gy), y, kTol);
  ref_.gelu_backward(dy.data(), x.data(), n, dx.data());
  gpu_->gelu_backward(gdy.data(), gx.data(), n, gdx.data());
  expect_close("gelu dx", down(gdx), dx, kTol);
}

TEST_F(CudaOpsVsKernelOpsOnGpu, Attention) {
  const auto qkv = random(kN * 3 * kC), dout = random(kN * kC);
  auto dqkv = random(kN * 3 * kC);
  std::vector<float> out(kN * kC), att(kB * kH * kT * kT);
  auto gqkv = up(qkv), gdout = up(dout), gdqkv = up(dqkv);
  // Poisoned outputs: forward must overwrite all of them (the masked half of att included).
  auto gout = up(std::vector<float>(out.size(), NAN));
  auto gatt = up(std::vector<float>(att.size(), NAN));
  ref_.attention_forward(qkv.data(), kB, kT, kC, kH, out.data(), att.data());
  gpu_->attention_forward(gqkv.data(), kB, kT, kC, kH, gout.data(), gatt.data());
  expect_close("attention out", down(gout), out, kTol);
  expect_close("attention P", down(gatt), att, kTol);
  // The backward from the reference's P, so it is checked on its own.
  auto gatt_ref = up(att);
  ref_.attention_backward(dout.data(), qkv.data(), att.data(), kB, kT, kC, kH, dqkv.data());
  gpu_->attention_backward(gdout.data(), gqkv.data(), gatt_ref.data(), kB, kT, kC, kH,
                           gdqkv.data());
  expect_close("attention dqkv", down(gdqkv), dqkv, kTol);
}

TEST_F(CudaOpsVsKernelOpsOnGpu, HeadInFp32) { compare_head(HeadPrecision::fp32, kTol); }

TEST_F(CudaOpsVsKernelOpsOnGpu, HeadInBf16) { compare_head(HeadPrecision::bf16, kBf16Tol); }

TEST_F(CudaOpsVsKernelOpsOnGpu, HeadLogits) {
  const auto x = random(kN * kC), wte = random(kV * kC);
  std::vector<float> out(kN * kV);
  auto gx = up(x), gw = up(wte);
  cuda::Array<float> gout;
  gout.resize(out.size());
  ref_.head_logits(x.data(), wte.data(), kN, kC, kV, out.data());
  gpu_->head_logits(gx.data(), gw.data(), kN, kC, kV, gout.data());
  expect_close("head logits", down(gout), out, kTol);
}

// ---------------------------------------------------------------------------------------------
// The whole model: GptModel<float, CudaOps> against GptModel<float, KernelOps<float>>.

// Parameters in device memory: uploaded once; each module's gradients zeroed on the device at
// begin_backward and, at end_backward, downloaded and added into a per-parameter host total
// (as PlainProvider does, so the tied wte sums the embedding's and the head's parts).
class DeviceProvider : public ParamProvider<float> {
 public:
  DeviceProvider(const ModelSpec& spec, const std::vector<std::vector<float>>& values)
      : spec_(spec), ops_(0, nullptr) {  // the legacy default stream, as the model's ops
    for (const auto& v : values) {
      values_.emplace_back();
      ops_.upload(v.data(), v.size(), values_.back());
      grads.emplace_back(v.size(), 0.f);
    }
  }
  ModuleView<float> begin_forward(int m) override {
    ModuleView<float> v;
    for (int p : spec_.modules[m].params) v.params.push_back(values_[p].data());
    return v;
  }
  void end_forward(int) override {}
  ModuleView<float> begin_backward(int m) override {
    ModuleView<float> v = begin_forward(m);
    const auto& ps = spec_.modules[m].params;
    scratch_.resize(ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      ops_.zero(scratch_[i], values_[ps[i]].size());
      v.grads.push_back(scratch_[i].data());
    }
    return v;
  }
  void end_backward(int m) override {
    const auto& ps = spec_.modules[m].params;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> g(scratch_[i].size());
      ops_.download(scratch_[i].data(), g.size(), g.data());
      for (std::size_t j = 0; j < g.size(); ++j) grads[ps[i]][j] += g[j];
    }
  }

  std::vector<std::vector<float>> grads;

 private:
  const ModelSpec& spec_;
  CudaOps ops_;
  std::vector<cuda::Array<float>> values_, scratch_;
};

class CudaModelOnGpu : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_usable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

TEST_P(CudaModelOnGpu, ForwardBackwardMatchesKernelOps) {
  const bool checkpointing = GetParam();
  GptConfig cfg;
  cfg.vocab_size = kV;
  cfg.context = 8;
  cfg.n_layer = 2;
  cfg.n_head = kH;
  cfg.n_embd = kC;
  GptModel<float, RefOps> ref(cfg, checkpointing);
  GptModel<float, CudaOps> gpu(cfg, checkpointing, CudaOps(0, nullptr));
  ref.set_head_chunk(4);  // chunks of the head: 4 + 4 + 2 rows
  gpu.set_head_chunk(4);

  // Every parameter random (LayerNorm weights around 1, biases nonzero), so every path carries
  // signal; the same values on both sides.
  test::PlainProvider<float> host(ref.spec(), 3);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t p = 0; p < host.values.size(); ++p) {
    const Init init = ref.spec().params[p].init;
    for (float& v : host.values[p])
      v = init == Init::normal ? 0.5f * nd(rng) : (init == Init::ones ? 1.f : 0.f) + 0.1f * nd(rng);
  }
  DeviceProvider dev(gpu.spec(), host.values);
  std::vector<std::int32_t> in(kN), tg(kN);
  for (int i = 0; i < kN; ++i) {
    in[i] = static_cast<std::int32_t>(rng() % kV);
    tg[i] = static_cast<std::int32_t>(rng() % kV);
  }

  const double want = ref.forward_backward(host, in.data(), tg.data(), kB, kT);
  const double got = gpu.forward_backward(dev, in.data(), tg.data(), kB, kT);
  EXPECT_NEAR(got, want, 1e-5 * want);
  for (std::size_t p = 0; p < host.grads.size(); ++p)
    expect_close(ref.spec().params[p].name, dev.grads[p], host.grads[p], 1e-4);

  EXPECT_NEAR(gpu.forward(dev, in.data(), tg.data(), kB, kT),
              ref.forward(host, in.data(), tg.data(), kB, kT), 1e-5 * want);
  std::vector<float> logits_got, logits_want;
  gpu.last_logits(dev, in.data(), kB, kT, logits_got);
  ref.last_logits(host, in.data(), kB, kT, logits_want);
  expect_close("last logits", logits_got, logits_want, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, CudaModelOnGpu, ::testing::Values(false, true));

}  // namespace
}  // namespace gpt
