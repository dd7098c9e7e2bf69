// CpuAdam::step with bf16 optimizer states (OptimizerStateDType::bf16) against the independent
// reference (adam_reference.hpp: its own bf16 rounding, fp32 math, weight updated from the fp32
// moments before they are rounded): every ISA path this CPU runs, 1 and 2 threads, sizes with
// tails that are no multiple of any SIMD width, weight decay on and off, Adam and AdamW, fp32 /
// bf16 / fp16 gradients, no / bf16 / fp16 weight copy, several steps, every store kind, the
// measured store pick, NaN / inf / denormal / overflow values, and the dtype names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/common/aligned_buffer.hpp"
#include "tests/optim/adam_reference.hpp"
#include "tests/optim/test_support.hpp"
#include "zoe/error.hpp"

namespace zoe::optim::test {
namespace {

constexpr OptimizerStateDType kBf16 = OptimizerStateDType::bf16;

// fp32 master and bf16 moments in 64-byte aligned buffers, shifted by `offset` elements (an
// offset makes every array unaligned, so non-temporal stores are ruled out).
struct Bf16State {
  explicit Bf16State(std::size_t n_, std::size_t offset = 0)
      : n(n_),
        pb((n_ + offset + 1) * 4, 64), mb((n_ + offset + 1) * 2, 64), vb((n_ + offset + 1) * 2, 64),
        p(pb.as<float>().data() + offset), m(mb.as<std::uint16_t>().data() + offset),
        v(vb.as<std::uint16_t>().data() + offset) {}
  void load(const std::vector<float>& p0, const std::vector<std::uint16_t>& m0, const std::vector<std::uint16_t>& v0) {
    std::copy(p0.begin(), p0.end(), p);
    std::copy(m0.begin(), m0.end(), m);
    std::copy(v0.begin(), v0.end(), v);
  }
  std::size_t n;
  AlignedBuffer pb, mb, vb;
  float* p;
  std::uint16_t *m, *v;
};

std::vector<std::uint16_t> ref_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = ref_float_to_bf16(x[i]);
  return r;
}

// A start state and per-step gradients: fp32 values, and the gradient as stored in grad_dtype
// (with the floats it holds exactly, which the reference is given).
struct Bf16Case {
  std::vector<float> p;
  std::vector<std::uint16_t> m, v;
  std::vector<std::vector<float>> grads_exact;
  std::vector<std::vector<float>> grads_f32;
  std::vector<std::vector<std::uint16_t>> grads_half;
  DType grad_dtype = DType::f32;
  const void* grad(int s) const {
    return grad_dtype == DType::f32 ? static_cast<const void*>(grads_f32[s].data()) : grads_half[s].data();
  }
};

Bf16Case make_case(std::size_t n, int steps, DType grad_dtype, unsigned seed) {
  Bf16Case c;
  c.grad_dtype = grad_dtype;
  c.p = uniform(n, -2.0f, 2.0f, seed);
  c.m = ref_bf16(uniform(n, -0.1f, 0.1f, seed + 1));
  c.v = ref_bf16(uniform(n, 0.0f, 0.01f, seed + 2));
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g = uniform(n, -1.0f, 1.0f, seed + 10 + s), exact = g;
    c.grads_half.push_back(grad_dtype == DType::f32 ? std::vector<std::uint16_t>{} : to_half(g, grad_dtype, &exact));
    c.grads_f32.push_back(g);
    c.grads_exact.push_back(exact);
  }
  return c;
}

// The expected copy of the weights in out_dtype.
std::uint16_t ref_out(float p, DType out_dtype) {
  return out_dtype == DType::bf16 ? ref_float_to_bf16(p) : kernels::f32_to_f16(p);
}

// Index of the first differing element, or -1.
long first_difference(const std::uint16_t* got, const std::vector<std::uint16_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return static_cast<long>(i);
  return -1;
}

void expect_state(const Bf16State& st, const std::vector<float>& rp, const std::vector<std::uint16_t>& rm,
                  const std::vector<std::uint16_t>& rv, const std::string& ctx) {
  const long ip = first_bit_difference(st.p, rp.data(), rp.size());
  EXPECT_EQ(ip, -1) << "param differs (" << ctx << ") at " << ip << ": got " << (ip >= 0 ? st.p[ip] : 0.0f) << " want "
                    << (ip >= 0 ? rp[ip] : 0.0f);
  const long im = first_difference(st.m, rm);
  EXPECT_EQ(im, -1) << "exp_avg bf16 bits differ (" << ctx << ") at " << im << ": got "
                    << (im >= 0 ? st.m[im] : 0) << " want " << (im >= 0 ? rm[im] : 0);
  const long iv = first_difference(st.v, rv);
  EXPECT_EQ(iv, -1) << "exp_avg_sq bf16 bits differ (" << ctx << ") at " << iv << ": got "
                    << (iv >= 0 ? st.v[iv] : 0) << " want " << (iv >= 0 ? rv[iv] : 0);
}

void expect_out(const std::uint16_t* out, const std::vector<float>& rp, DType out_dtype, const std::string& ctx) {
  std::size_t wrong = 0;
  long first = -1;
  for (std::size_t i = 0; i < rp.size(); ++i)
    if (out[i] != ref_out(rp[i], out_dtype)) {
      if (first < 0) first = static_cast<long>(i);
      ++wrong;
    }
  EXPECT_EQ(wrong, 0u) << "half output differs (" << ctx << "), first at " << first;
}

std::string out_name(bool has_out, DType out_dtype) {
  return has_out ? std::string(dtype_name(out_dtype)) : "none";
}

// Runs `steps` steps of one case on every ISA and 1 and 2 threads and compares every step's
// state and copy bitwise with the reference.
void check_case(std::size_t n, const RefHyper& rh, DType grad_dtype, bool has_out, DType out_dtype, int steps,
                unsigned seed) {
  const Bf16Case c = make_case(n, steps, grad_dtype, seed);
  std::vector<std::vector<float>> rps;
  std::vector<std::vector<std::uint16_t>> rms, rvs;
  {
    auto rp = c.p;
    auto rm = c.m, rv = c.v;
    for (int s = 0; s < steps; ++s) {
      ref_adam_step_bf16_states(rh, 10 + s, 0.5f, rp, rm, rv, c.grads_exact[s]);
      rps.push_back(rp), rms.push_back(rm), rvs.push_back(rv);
    }
  }
  for (Isa isa : runnable_isas()) {
    for (int threads : {1, 2}) {
      CpuAdam adam(threads, isa);
      Bf16State st(n);
      st.load(c.p, c.m, c.v);
      AlignedBuffer out((n + 1) * 2, 64);
      auto* o = out.as<std::uint16_t>().data();
      for (int s = 0; s < steps; ++s) {
        adam.step(to_hyper(rh), 10 + s, 0.5f, st.p, st.m, st.v, kBf16, c.grad(s), grad_dtype, n,
                  has_out ? o : nullptr, out_dtype);
        const std::string ctx = std::string(isa_name(isa)) + " threads=" + std::to_string(threads) +
                                (rh.decoupled ? " AdamW" : " Adam") + " wd=" + std::to_string(rh.weight_decay) +
                                " grad=" + std::string(dtype_name(grad_dtype)) + " out=" + out_name(has_out, out_dtype) +
                                " n=" + std::to_string(n) + " step " + std::to_string(s + 1);
        expect_state(st, rps[s], rms[s], rvs[s], ctx);
        if (has_out) expect_out(o, rps[s], out_dtype, ctx);
        if (::testing::Test::HasFailure()) return;  // one report per broken case, not thousands
      }
    }
  }
}

TEST(CpuAdamBf16States, EveryIsaAndThreadCountMatchesReferenceBitwise) {
  // Tails of every SIMD width (8, 16, the 16-element unrolled AVX2 loop) and several chunks.
  const std::size_t sizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 1025, 3 * CpuAdam::kChunk + 5};
  for (std::size_t n : sizes)
    for (double wd : {0.0, 0.01})
      for (bool decoupled : {true, false})
        for (DType gt : {DType::f32, DType::bf16, DType::f16})
          for (int out : {0, 1, 2}) {
            RefHyper rh;
            rh.weight_decay = wd;
            rh.decoupled = decoupled;
            check_case(n, rh, gt, out != 0, out == 2 ? DType::f16 : DType::bf16, 3, 7 + static_cast<unsigned>(n));
            if (HasFailure()) return;
          }
}

TEST(CpuAdamBf16States, LargeArraysEveryGradientAndOutputMatchReference) {
  // 65 chunks: both threads of a 2-thread arena take chunks.
  const std::size_t n = (std::size_t{1} << 20) + 3;
  for (DType gt : {DType::f32, DType::bf16, DType::f16})
    for (int out : {0, 1, 2}) {
      check_case(n, RefHyper{}, gt, out != 0, out == 2 ? DType::f16 : DType::bf16, 2, 41);
      if (HasFailure()) return;
    }
}

TEST(CpuAdamBf16States, EveryStoreKindAndUnalignedArraysMatchReference) {
  const std::size_t n = (std::size_t{1} << 18) + 3;
  const Bf16Case c = make_case(n, 1, DType::bf16, 13);
  RefHyper rh;
  auto rp = c.p;
  auto rm = c.m, rv = c.v;
  ref_adam_step_bf16_states(rh, 2, 0.5f, rp, rm, rv, c.grads_exact[0]);
  for (StorePolicy policy : {StorePolicy::ordinary, StorePolicy::nontemporal, StorePolicy::nontemporal_half}) {
    for (std::size_t offset : {0, 3}) {
      for (bool has_out : {false, true}) {
        for (Isa isa : runnable_isas()) {
          CpuAdam adam(2, isa);
          adam.set_store_policy(policy);
          Bf16State st(n, offset);
          st.load(c.p, c.m, c.v);
          AlignedBuffer out((n + offset) * 2, 64);
          auto* o = out.as<std::uint16_t>().data() + offset;
          adam.step(to_hyper(rh), 2, 0.5f, st.p, st.m, st.v, kBf16, c.grad(0), DType::bf16, n, has_out ? o : nullptr);
          const std::string ctx = std::string(isa_name(isa)) + " stores " + std::string(store_policy_name(policy)) +
                                  " offset " + std::to_string(offset) + (has_out ? " with copy" : "");
          expect_state(st, rp, rm, rv, ctx);
          if (has_out) expect_out(o, rp, DType::bf16, ctx);
        }
      }
    }
  }
}

TEST(CpuAdamBf16States, MeasuredStoresAreTrialledApartFromFp32AndStayBitwiseEqual) {
  // StorePolicy::measure: bf16 states are their own size classes (another access pattern); the
  // warm-up call and kStoreTrialRounds rounds over 6 candidates (prefetch included) all give the
  // reference's bits.
  const std::size_t n = (std::size_t{1} << 16) + 5;
  const int calls = 1 + CpuAdam::kStoreTrialRounds * 6;
  const Bf16Case c = make_case(n, 4, DType::f32, 21);
  RefHyper rh;
  auto rp = c.p;
  auto rm = c.m, rv = c.v;
  CpuAdam adam(2);
  ASSERT_EQ(adam.store_policy(), StorePolicy::measure);
  Bf16State st(n);
  st.load(c.p, c.m, c.v);
  AlignedBuffer out(n * 2, 64);
  auto* o = out.as<std::uint16_t>().data();
  for (int k = 0; k < calls; ++k) {
    EXPECT_FALSE(adam.store_choice(n, DType::f32, true, kBf16).decided) << "call " << k;
    ref_adam_step_bf16_states(rh, 1 + k, 1.0f, rp, rm, rv, c.grads_exact[k % 4]);
    adam.step(to_hyper(rh), 1 + k, 1.0f, st.p, st.m, st.v, kBf16, c.grad(k % 4), DType::f32, n, o, DType::bf16);
    const std::string ctx = "measured stores, call " + std::to_string(k);
    expect_state(st, rp, rm, rv, ctx);
    expect_out(o, rp, DType::bf16, ctx);
    if (HasFailure()) return;
  }
  const CpuAdam::StoreChoice done = adam.store_choice(n, DType::f32, true, kBf16);
  EXPECT_TRUE(done.decided);
  for (int k = 0; k < 6; ++k) EXPECT_GT(done.gbps[k], 0.0) << "candidate " << k;
  // The fp32 states' classes of the same n saw none of these calls.
  EXPECT_FALSE(adam.store_choice(n, DType::f32, true).decided);
  EXPECT_EQ(adam.store_choice(n, DType::f32, true).gbps[0], 0.0);
  EXPECT_FALSE(adam.store_choice(n, DType::f32, false, kBf16).decided);
}

TEST(CpuAdamBf16States, NanInfDenormalAndOverflowMatchReference) {
  // NaN and inf gradients, NaN and denormal stored moments, denormal weights (their bf16 copy
  // too: vcvtneps2bf16 alone would flush it to zero), moments that underflow to bf16
  // denormals (vcvtneps2bf16 alone would flush those), and a finite fp32 moment that rounds past
  // bf16's largest finite value to inf (the weight update still saw the finite one). 69 elements: a vector part and a scalar tail.
  const std::size_t n = 69;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> p0 = uniform(n, -1.0f, 1.0f, 3), g(n);
  std::vector<float> m0f = uniform(n, -0.01f, 0.01f, 4), v0f = uniform(n, 0.0f, 1e-4f, 5);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::ldexp(1.0f + 0.01f * float(i), -124 - int(i % 8));  // tiny
  g[5] = nan;
  g[21] = inf;
  g[22] = -inf;
  g[30] = 5.83e20f;  // v = (0.001 * g) * g = 3.3989e38: finite in fp32, past bf16's largest: inf
  g[66] = -std::numeric_limits<float>::max();
  g[67] = nan;
  for (std::size_t i = 40; i < 48; ++i) m0f[i] = std::ldexp(float(i - 39) * 1.5f, -133), v0f[i] = 0.0f;  // denormal
  m0f[50] = nan;
  v0f[51] = nan;
  m0f[52] = -0.0f;
  // Denormal weights that stay denormal (zero gradient and exp_avg): in the vector part, in a
  // 32-element block's second half and in the scalar tail; the bf16 copy must keep them.
  for (std::size_t i : {8, 9, 13, 15, 33, 36, 48, 63, 64, 68}) {
    p0[i] = std::ldexp(float(i + 1) * (i % 2 ? -1.37f : 1.37f), -133);
    g[i] = 0.0f;
    m0f[i] = 0.0f;
  }
  auto m0 = ref_bf16(m0f), v0 = ref_bf16(v0f);
  m0[53] = 0xffc1;  // a negative NaN with a payload
  for (double wd : {0.0, 0.01}) {
    RefHyper rh;
    rh.weight_decay = wd;
    auto rp = p0;
    auto rm = m0, rv = v0;
    ref_adam_step_bf16_states(rh, 1, 1.0f, rp, rm, rv, g);
    ASSERT_TRUE(std::isnan(ref_bf16_to_float(rm[5])) && std::isnan(ref_bf16_to_float(rv[5])) && std::isnan(rp[5]));
    ASSERT_TRUE(std::isinf(ref_bf16_to_float(rm[21])) && std::isnan(rp[21]));
    ASSERT_EQ(rv[30], 0x7f80) << "the overflow case does not round to inf";
    ASSERT_TRUE(std::isfinite(rp[30]));
    ASSERT_TRUE(std::isnan(ref_bf16_to_float(rm[50])) && std::isnan(ref_bf16_to_float(rv[51])));
    ASSERT_EQ(rm[53], 0xffc1);
    std::size_t denormal_moments = 0;
    for (std::size_t i = 0; i < n; ++i) denormal_moments += (rm[i] & 0x7f80) == 0 && (rm[i] & 0x7f) != 0;
    ASSERT_GT(denormal_moments, 4u) << "the case has too few bf16 denormal moments";
    std::size_t denormal_weights = 0;
    for (std::size_t i = 0; i < n; ++i) denormal_weights += std::fpclassify(rp[i]) == FP_SUBNORMAL;
    ASSERT_EQ(denormal_weights, 10u);
    for (Isa isa : runnable_isas()) {
      for (DType ot : {DType::bf16, DType::f16}) {
        CpuAdam adam(1, isa);
        Bf16State st(n);
        st.load(p0, m0, v0);
        std::vector<std::uint16_t> out(n);
        adam.step(to_hyper(rh), 1, 1.0f, st.p, st.m, st.v, kBf16, g.data(), DType::f32, n, out.data(), ot);
        const std::string ctx = std::string(isa_name(isa)) + " wd=" + std::to_string(wd) + " out " +
                                std::string(dtype_name(ot));
        expect_state(st, rp, rm, rv, ctx);
        expect_out(out.data(), rp, ot, ctx);
        const float nan_back = ot == DType::bf16 ? kernels::bf16_to_f32(out[5]) : kernels::f16_to_f32(out[5]);
        EXPECT_TRUE(std::isnan(nan_back)) << ctx;
      }
    }
  }
}

TEST(CpuAdamBf16States, ReferenceRoundingIsRoundToNearestEven) {
  // The reference's rounding itself, on hand-picked bits (the kernels are compared with it).
  auto f = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  EXPECT_EQ(ref_float_to_bf16(f(0x3f808000u)), 0x3f80);  // tie, even kept
  EXPECT_EQ(ref_float_to_bf16(f(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(ref_float_to_bf16(f(0x3f808001u)), 0x3f81);  // above half
  EXPECT_EQ(ref_float_to_bf16(f(0x3f807fffu)), 0x3f80);  // below half
  EXPECT_EQ(ref_float_to_bf16(f(0xbf818000u)), 0xbf82);  // sign kept
  EXPECT_EQ(ref_float_to_bf16(f(0x7f7fffffu)), 0x7f80);  // past the largest finite: inf
  EXPECT_EQ(ref_float_to_bf16(f(0x00018000u)), 0x0002);  // denormal tie, odd rounds up
  EXPECT_EQ(ref_float_to_bf16(f(0x7fa00000u)), 0x7fe0);  // signalling NaN made quiet
  // And the library's scalar conversion agrees on every bf16 boundary pattern sampled here.
  for (std::uint32_t u = 0; u < 0xffffffffu - 0x10000u; u += 0x10000u - 0x1235u)
    ASSERT_EQ(ref_float_to_bf16(f(u)), kernels::f32_to_bf16(f(u))) << std::hex << u;
}

TEST(CpuAdamBf16States, Fp32ThroughTheStateDTypeOverloadIsTheFloatOverload) {
  const std::size_t n = 4099;
  const std::vector<float> p0 = uniform(n, -1, 1, 1), m0 = uniform(n, -0.1f, 0.1f, 2), v0 = uniform(n, 0, 0.01f, 3);
  const std::vector<float> g = uniform(n, -1, 1, 4);
  AdamHyper h;
  h.weight_decay = 0.01;
  auto p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
  std::vector<std::uint16_t> o1(n), o2(n);
  CpuAdam adam(2);
  adam.step(h, 4, 1.0f, p1.data(), m1.data(), v1.data(), g.data(), DType::f32, n, o1.data());
  adam.step(h, 4, 1.0f, p2.data(), m2.data(), v2.data(), OptimizerStateDType::fp32, g.data(), DType::f32, n, o2.data());
  EXPECT_EQ(first_bit_difference(p1.data(), p2.data(), n), -1);
  EXPECT_EQ(first_bit_difference(m1.data(), m2.data(), n), -1);
  EXPECT_EQ(first_bit_difference(v1.data(), v2.data(), n), -1);
  EXPECT_EQ(o1, o2);
  // ... and both took the fp32 states' store classes.
  EXPECT_FALSE(adam.store_choice(n, DType::f32, true, kBf16).decided);
}

TEST(CpuAdamBf16States, DTypeNamesSizesAndParse) {
  EXPECT_EQ(optimizer_state_dtype_name(OptimizerStateDType::fp32), "fp32");
  EXPECT_EQ(optimizer_state_dtype_name(kBf16), "bf16");
  EXPECT_EQ(optimizer_state_dtype_size(OptimizerStateDType::fp32), 4u);
  EXPECT_EQ(optimizer_state_dtype_size(kBf16), 2u);
  for (OptimizerStateDType d : {OptimizerStateDType::fp32, kBf16})
    EXPECT_EQ(parse_optimizer_state_dtype(optimizer_state_dtype_name(d), "k"), d);
  for (const char* bad : {"fp16", "BF16", "bfloat16", ""}) {
    try {
      parse_optimizer_state_dtype(bad, "optimizer.state_dtype");
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "optimizer.state_dtype");
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("fp32"), std::string::npos) << what;
      EXPECT_NE(what.find("bf16"), std::string::npos) << what;
    }
  }
}

TEST(CpuAdamBf16States, RejectsBadArguments) {
  CpuAdam adam(1);
  float x = 1.0f, g = 1.0f;
  std::uint16_t m = 0, v = 0, out = 0;
  AdamHyper h;
  EXPECT_THROW(adam.step(h, 0, 1.0f, &x, &m, &v, kBf16, &g, DType::f32, 1), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, &x, &m, &v, kBf16, &g, DType::f32, 1, &out, DType::f32), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, &x, nullptr, &v, kBf16, &g, DType::f32, 1), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, &x, &m, nullptr, kBf16, &g, DType::f32, 1), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, &x, &m, &v, static_cast<OptimizerStateDType>(7), &g, DType::f32, 1), UsageError);
  EXPECT_EQ(x, 1.0f);  // nothing written by the rejected calls
  EXPECT_EQ(m, 0);
  adam.step(h, 1, 1.0f, nullptr, nullptr, nullptr, kBf16, nullptr, DType::f32, 0);  // n = 0: nothing to do
}

}  // namespace
}  // namespace zoe::optim::test
