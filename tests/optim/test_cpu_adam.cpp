// CpuAdam::step against the independent reference (adam_reference.hpp): every ISA path, sizes
// around the SIMD widths and chunk edges, half gradients and outputs, resume, thread counts.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "src/common/aligned_buffer.hpp"
#include "src/optim/store_pick.hpp"
#include "tests/optim/adam_reference.hpp"
#include "tests/optim/test_support.hpp"
#include "zoe/error.hpp"

namespace zoe::optim::test {
namespace {

// State of one optimizer run in 64-byte aligned buffers (the layout the offload engine uses),
// optionally shifted by `offset` floats to exercise unaligned arrays.
struct State {
  State(std::size_t n_, std::size_t offset = 0)
      : n(n_),
        pb((n_ + offset + 1) * 4, 64), mb((n_ + offset + 1) * 4, 64), vb((n_ + offset + 1) * 4, 64),
        p(pb.as<float>().data() + offset), m(mb.as<float>().data() + offset), v(vb.as<float>().data() + offset) {}
  void load(const std::vector<float>& p0, const std::vector<float>& m0, const std::vector<float>& v0) {
    std::copy(p0.begin(), p0.end(), p);
    std::copy(m0.begin(), m0.end(), m);
    std::copy(v0.begin(), v0.end(), v);
  }
  std::size_t n;
  AlignedBuffer pb, mb, vb;
  float *p, *m, *v;
};

struct Case {
  std::vector<float> p, m, v;            // start state
  std::vector<std::vector<float>> grads;  // one per step, fp32
};

Case make_case(std::size_t n, int steps, unsigned seed) {
  Case c;
  c.p = uniform(n, -2.0f, 2.0f, seed);
  c.m = uniform(n, -0.1f, 0.1f, seed + 1);
  c.v = uniform(n, 0.0f, 0.01f, seed + 2);
  for (int s = 0; s < steps; ++s) c.grads.push_back(uniform(n, -1.0f, 1.0f, seed + 10 + s));
  return c;
}

void expect_bitwise(const char* what, const float* got, const std::vector<float>& want, const std::string& ctx) {
  const long i = first_bit_difference(got, want.data(), want.size());
  EXPECT_EQ(i, -1) << what << " differs from the reference (" << ctx << ") at element " << i << ": got "
                   << (i >= 0 ? got[i] : 0.0f) << " want " << (i >= 0 ? want[i] : 0.0f);
}

// Sets an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_, old_.c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

const std::size_t kSizes[] = {0, 1, 7, 15, 16, 17, 1025, 64 * 128, (std::size_t{1} << 20) + 3};

TEST(CpuAdam, EveryIsaMatchesReferenceBitwiseForAllSizes) {
  constexpr int kSteps = 3;
  for (bool decoupled : {true, false}) {
    for (std::size_t n : kSizes) {
      Case c = make_case(n, kSteps, 7 + static_cast<unsigned>(n));
      c.v.assign(n, 0.0f);  // a first step: exp_avg_sq becomes > 0 wherever the kernels wrote
      RefHyper rh;
      rh.decoupled = decoupled;
      auto rp = c.p, rm = c.m, rv = c.v;
      for (int s = 0; s < kSteps; ++s) ref_adam_step(rh, 10 + s, 0.5f, rp, rm, rv, c.grads[s]);
      for (Isa isa : runnable_isas()) {
        CpuAdam adam(2, isa);
        State st(n);
        st.load(c.p, c.m, c.v);
        for (int s = 0; s < kSteps; ++s)
          adam.step(to_hyper(rh), 10 + s, 0.5f, st.p, st.m, st.v, c.grads[s].data(), DType::f32, n);
        const std::string ctx = std::string(isa_name(isa)) + (decoupled ? " AdamW" : " Adam") + " n=" + std::to_string(n);
        expect_bitwise("param", st.p, rp, ctx);
        expect_bitwise("exp_avg", st.m, rm, ctx);
        expect_bitwise("exp_avg_sq", st.v, rv, ctx);
        // Every gradient is nonzero, so every written exp_avg_sq is > 0; a skipped one stays 0.
        std::size_t unchanged = 0;
        for (std::size_t i = 0; i < n; ++i) unchanged += st.v[i] == c.v[i];
        EXPECT_EQ(unchanged, 0u) << "elements not updated, " << ctx;
      }
    }
  }
}

TEST(CpuAdam, UnalignedArraysMatchReference) {
  // Arrays shifted off the 64-byte grid take the ordinary-store path, also past the stream size.
  const std::size_t n = (std::size_t{1} << 20) + 35;
  const Case c = make_case(n, 1, 99);
  RefHyper rh;
  auto rp = c.p, rm = c.m, rv = c.v;
  ref_adam_step(rh, 1, 1.0f, rp, rm, rv, c.grads[0]);
  for (Isa isa : runnable_isas()) {
    CpuAdam adam(2, isa);
    State st(n, 3);
    st.load(c.p, c.m, c.v);
    std::vector<std::uint16_t> out(n + 1);
    adam.step(to_hyper(rh), 1, 1.0f, st.p, st.m, st.v, c.grads[0].data(), DType::f32, n, out.data() + 1, DType::bf16);
    const std::string ctx = std::string(isa_name(isa)) + " unaligned";
    expect_bitwise("param", st.p, rp, ctx);
    expect_bitwise("exp_avg_sq", st.v, rv, ctx);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += out[i + 1] != kernels::f32_to_bf16(rp[i]);
    EXPECT_EQ(wrong, 0u) << ctx;
  }
}

TEST(CpuAdam, EveryStoreKindMatchesReferenceBitwise) {
  // Each forced store policy, with bf16 and fp16 copies (the non-temporal paths need the
  // 64-byte aligned State arrays and a 32-byte aligned copy, as here).
  for (StorePolicy policy : {StorePolicy::ordinary, StorePolicy::nontemporal, StorePolicy::nontemporal_half}) {
    for (std::size_t n : {std::size_t{1025}, (std::size_t{1} << 20) + 3}) {
      for (DType ot : {DType::bf16, DType::f16}) {
        const Case c = make_case(n, 1, 13);
        RefHyper rh;
        auto rp = c.p, rm = c.m, rv = c.v;
        ref_adam_step(rh, 2, 1.0f, rp, rm, rv, c.grads[0]);
        for (Isa isa : runnable_isas()) {
          CpuAdam adam(2, isa);
          adam.set_store_policy(policy);
          EXPECT_EQ(adam.store_policy(), policy);
          State st(n);
          st.load(c.p, c.m, c.v);
          AlignedBuffer out(n * 2, 64);
          auto* o = out.as<std::uint16_t>().data();
          adam.step(to_hyper(rh), 2, 1.0f, st.p, st.m, st.v, c.grads[0].data(), DType::f32, n, o, ot);
          const std::string ctx = std::string(isa_name(isa)) + " stores " + std::string(store_policy_name(policy)) +
                                  " n=" + std::to_string(n);
          expect_bitwise("param", st.p, rp, ctx);
          expect_bitwise("exp_avg", st.m, rm, ctx);
          expect_bitwise("exp_avg_sq", st.v, rv, ctx);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < n; ++i)
            wrong += o[i] != (ot == DType::bf16 ? kernels::f32_to_bf16(rp[i]) : kernels::f32_to_f16(rp[i]));
          EXPECT_EQ(wrong, 0u) << ctx;
        }
      }
    }
  }
}

TEST(CpuAdam, MeasuredStorePolicyTrialsThenKeepsOneAndStaysBitwiseEqual) {
  // StorePolicy::measure (the default): one untimed warm-up call, then kStoreTrialRounds rounds
  // over the candidates (6 with a half copy), then decided. Every call is bitwise the reference.
  const std::size_t n = (std::size_t{1} << 18) + 5;
  const int calls = 1 + CpuAdam::kStoreTrialRounds * 6;
  const Case c = make_case(n, calls + 1, 21);
  RefHyper rh;
  auto rp = c.p, rm = c.m, rv = c.v;
  CpuAdam adam(2);
  EXPECT_EQ(adam.store_policy(), StorePolicy::measure);
  State st(n);
  st.load(c.p, c.m, c.v);
  AlignedBuffer out(n * 2, 64);
  auto* o = out.as<std::uint16_t>().data();
  const std::vector<Stores> candidates = {
      {StoreKind::ordinary, StoreKind::ordinary, false},     {StoreKind::nontemporal, StoreKind::nontemporal, false},
      {StoreKind::ordinary, StoreKind::ordinary, true},      {StoreKind::nontemporal, StoreKind::nontemporal, true},
      {StoreKind::ordinary, StoreKind::nontemporal, false},  {StoreKind::ordinary, StoreKind::nontemporal, true}};
  for (int k = 0; k <= calls; ++k) {
    const CpuAdam::StoreChoice before = adam.store_choice(n, DType::f32, true);
    EXPECT_EQ(before.decided, k >= calls) << "call " << k;
    if (k == 0) EXPECT_EQ(before.stores, candidates[0]) << "the warm-up call uses ordinary stores";
    if (k == 0) EXPECT_EQ(before.gbps[0], 0.0);
    ref_adam_step(rh, 1 + k, 1.0f, rp, rm, rv, c.grads[k]);
    adam.step(to_hyper(rh), 1 + k, 1.0f, st.p, st.m, st.v, c.grads[k].data(), DType::f32, n, o, DType::bf16);
    const std::string ctx = "measured stores, call " + std::to_string(k);
    expect_bitwise("param", st.p, rp, ctx);
    expect_bitwise("exp_avg_sq", st.v, rv, ctx);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += o[i] != kernels::f32_to_bf16(rp[i]);
    EXPECT_EQ(wrong, 0u) << ctx;
  }
  const CpuAdam::StoreChoice done = adam.store_choice(n, DType::f32, true);
  ASSERT_TRUE(done.decided);
  for (int k = 0; k < 6; ++k) EXPECT_GT(done.gbps[k], 0.0) << "candidate " << k;
  // The pick is the first (simplest) candidate within the noise margin of the fastest median
  // (the exact rule, on per-round ratios, is tested in test_store_pick.cpp).
  EXPECT_GE(done.margin, detail::kMinStoreMargin);
  const bool picked_a_candidate = std::find(candidates.begin(), candidates.end(), done.stores) != candidates.end();
  EXPECT_TRUE(picked_a_candidate) << stores_name(done.stores);
  // Another size class (and the class without a half copy) has its own trials.
  EXPECT_FALSE(adam.store_choice(n * 4, DType::f32, true).decided);
  EXPECT_FALSE(adam.store_choice(n, DType::f32, false).decided);
  // Four candidates without a half copy: decided after 1 + rounds * 4 calls.
  for (int k = 0; k < 1 + CpuAdam::kStoreTrialRounds * 4; ++k) {
    EXPECT_FALSE(adam.store_choice(n, DType::f32, false).decided);
    adam.step(to_hyper(rh), 1, 1.0f, st.p, st.m, st.v, c.grads[0].data(), DType::f32, n);
  }
  const CpuAdam::StoreChoice plain = adam.store_choice(n, DType::f32, false);
  EXPECT_TRUE(plain.decided);
  EXPECT_EQ(plain.stores.half_out, StoreKind::ordinary);
  EXPECT_GT(plain.gbps[3], 0.0);
  EXPECT_EQ(plain.gbps[4], 0.0);  // nontemporal-half: not a candidate without a copy
  // set_store_policy forgets the measurements.
  adam.set_store_policy(StorePolicy::measure);
  EXPECT_FALSE(adam.store_choice(n, DType::f32, true).decided);
}

TEST(CpuAdam, MeasuredStorePolicyIgnoresUnalignedCalls) {
  // Arrays off the 64-byte grid cannot stream: their calls use ordinary stores and are no trials.
  const std::size_t n = 4096 + 3;
  const Case c = make_case(n, 1, 5);
  CpuAdam adam(1);
  State st(n, 3);
  st.load(c.p, c.m, c.v);
  for (int k = 0; k < 20; ++k)
    adam.step(AdamHyper{}, 1 + k, 1.0f, st.p, st.m, st.v, c.grads[0].data(), DType::f32, n);
  const CpuAdam::StoreChoice ch = adam.store_choice(n, DType::f32, false);
  EXPECT_FALSE(ch.decided);
  EXPECT_EQ(ch.gbps[0], 0.0);
}

TEST(CpuAdam, StorePolicyFromEnvironmentAndForcedChoice) {
  {
    const ScopedEnv env("ZOE_ADAM_STORES", "nontemporal-half");
    CpuAdam adam(1);
    EXPECT_EQ(adam.store_policy(), StorePolicy::nontemporal_half);
    const CpuAdam::StoreChoice with_copy = adam.store_choice(100, DType::bf16, true);
    EXPECT_TRUE(with_copy.decided);
    EXPECT_EQ(with_copy.stores, (Stores{StoreKind::ordinary, StoreKind::nontemporal}));
    EXPECT_EQ(adam.store_choice(100, DType::bf16, false).stores, (Stores{}));  // no copy: nothing to stream
  }
  for (StorePolicy p : {StorePolicy::measure, StorePolicy::ordinary, StorePolicy::nontemporal,
                        StorePolicy::nontemporal_half}) {
    const std::string name(store_policy_name(p));
    EXPECT_EQ(parse_store_policy(name, "key"), p) << name;
    const ScopedEnv env("ZOE_ADAM_STORES", name.c_str());
    EXPECT_EQ(CpuAdam(1).store_policy(), p) << name;
  }
  EXPECT_EQ(stores_name({StoreKind::ordinary, StoreKind::ordinary}), "ordinary");
  EXPECT_EQ(stores_name({StoreKind::nontemporal, StoreKind::nontemporal}), "nontemporal");
  EXPECT_EQ(stores_name({StoreKind::ordinary, StoreKind::nontemporal}), "nontemporal-half");
  EXPECT_EQ(stores_name({StoreKind::ordinary, StoreKind::ordinary, true}), "ordinary+prefetch");
  const ScopedEnv bad("ZOE_ADAM_STORES", "streaming");
  try {
    CpuAdam adam(1);
    ADD_FAILURE() << "no ConfigError for ZOE_ADAM_STORES=streaming";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ZOE_ADAM_STORES"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nontemporal-half"), std::string::npos) << e.what();
  }
}

TEST(CpuAdam, HalfGradientsAndHalfOutputs) {
  for (std::size_t n : {std::size_t{1025}, (std::size_t{1} << 20) + 3}) {
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (DType ot : {DType::bf16, DType::f16}) {
        const Case c = make_case(n, 1, 31);
        std::vector<float> g_exact = c.grads[0];
        std::vector<std::uint16_t> g_half;
        if (gt != DType::f32) g_half = to_half(c.grads[0], gt, &g_exact);
        const void* g = gt == DType::f32 ? static_cast<const void*>(c.grads[0].data()) : g_half.data();
        RefHyper rh;
        auto rp = c.p, rm = c.m, rv = c.v;
        ref_adam_step(rh, 3, 0.25f, rp, rm, rv, g_exact);
        for (Isa isa : runnable_isas()) {
          CpuAdam adam(2, isa);
          State st(n);
          st.load(c.p, c.m, c.v);
          AlignedBuffer out(n * 2, 64);
          auto* o = out.as<std::uint16_t>().data();
          adam.step(to_hyper(rh), 3, 0.25f, st.p, st.m, st.v, g, gt, n, o, ot);
          const std::string ctx = std::string(isa_name(isa)) + " grad " + std::string(dtype_name(gt)) + " out " +
                                  std::string(dtype_name(ot)) + " n=" + std::to_string(n);
          expect_bitwise("param", st.p, rp, ctx);
          expect_bitwise("exp_avg", st.m, rm, ctx);
          std::size_t wrong = 0, far = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t want = ot == DType::bf16 ? kernels::f32_to_bf16(rp[i]) : kernels::f32_to_f16(rp[i]);
            wrong += o[i] != want;
            // Independently of any rounding code: the half value is within half a unit in the
            // last place of the fp32 result (round to nearest).
            const double got = ot == DType::bf16 ? kernels::bf16_to_f32(o[i]) : kernels::f16_to_f32(o[i]);
            const int e = std::ilogb(rp[i]);
            const double ulp = ot == DType::bf16 ? std::ldexp(1.0, e - 7) : std::ldexp(1.0, std::max(e, -14) - 10);
            far += std::fabs(got - double(rp[i])) > 0.5 * ulp;
          }
          EXPECT_EQ(wrong, 0u) << "half output is not the fp32 result rounded to nearest even, " << ctx;
          EXPECT_EQ(far, 0u) << ctx;
        }
      }
    }
  }
}

TEST(CpuAdam, SpecialValuesNanGradientsAndDenormalWeights) {
  // NaN / inf gradients give NaN weights whose half copies stay NaN; denormal weights round to
  // the correctly rounded bf16 denormal (vcvtneps2bf16 alone would flush them to zero).
  const std::size_t n = 64;
  std::vector<float> p0(n), m0(n, 0.0f), v0(n, 0.0f), g(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) p0[i] = std::ldexp(float(i + 1) * 1.37f, -130);  // denormal
  g[5] = std::numeric_limits<float>::quiet_NaN();
  g[21] = std::numeric_limits<float>::infinity();
  RefHyper rh;
  rh.weight_decay = 0.0;
  auto rp = p0, rm = m0, rv = v0;
  ref_adam_step(rh, 1, 1.0f, rp, rm, rv, g);
  ASSERT_TRUE(std::isnan(rp[5]) && std::isnan(rp[21]));
  for (Isa isa : runnable_isas()) {
    for (DType ot : {DType::bf16, DType::f16}) {
      CpuAdam adam(1, isa);
      State st(n);
      st.load(p0, m0, v0);
      std::vector<std::uint16_t> out(n);
      adam.step(to_hyper(rh), 1, 1.0f, st.p, st.m, st.v, g.data(), DType::f32, n, out.data(), ot);
      const std::string ctx = std::string(isa_name(isa)) + " out " + std::string(dtype_name(ot));
      expect_bitwise("param", st.p, rp, ctx);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t want = ot == DType::bf16 ? kernels::f32_to_bf16(rp[i]) : kernels::f32_to_f16(rp[i]);
        EXPECT_EQ(out[i], want) << ctx << " element " << i;
      }
      const float nan_back = ot == DType::bf16 ? kernels::bf16_to_f32(out[5]) : kernels::f16_to_f32(out[5]);
      EXPECT_TRUE(std::isnan(nan_back)) << ctx;
      if (ot == DType::bf16) EXPECT_NE(out[7] & 0x7fff, 0) << "denormal weight flushed to zero, " << ctx;
    }
  }
}

TEST(CpuAdam, ResumeAtStepFiveEqualsUninterruptedRunBitwise) {
  const std::size_t n = 4099;
  const Case c = make_case(n, 6, 55);
  AdamHyper h;
  h.weight_decay = 0.01;
  State full(n), resumed(n);
  full.load(c.p, c.m, c.v);
  resumed.load(c.p, c.m, c.v);
  {
    CpuAdam adam(2);
    for (int s = 1; s <= 6; ++s) adam.step(h, s, 1.0f, full.p, full.m, full.v, c.grads[s - 1].data(), DType::f32, n);
  }
  {
    CpuAdam first(2);
    for (int s = 1; s <= 5; ++s)
      first.step(h, s, 1.0f, resumed.p, resumed.m, resumed.v, c.grads[s - 1].data(), DType::f32, n);
  }
  CpuAdam fresh(1);  // a new optimizer that only knows 5 steps were taken
  fresh.step(h, 6, 1.0f, resumed.p, resumed.m, resumed.v, c.grads[5].data(), DType::f32, n);
  EXPECT_EQ(first_bit_difference(full.p, resumed.p, n), -1);
  EXPECT_EQ(first_bit_difference(full.m, resumed.m, n), -1);
  EXPECT_EQ(first_bit_difference(full.v, resumed.v, n), -1);
}

TEST(CpuAdam, OneTwoAndEightThreadsBitwiseEqual) {
  // oneTBB caps its workers at the core count; lift the cap so 8 threads really run.
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const Case c = make_case(n, 2, 77);
  const auto g16 = to_half(c.grads[1], DType::bf16, nullptr);
  AdamHyper h;
  h.weight_decay = 0.01;
  for (Isa isa : runnable_isas()) {
    std::vector<std::vector<float>> results;
    std::vector<double> sums;
    for (int threads : {1, 2, 8}) {
      CpuAdam adam(threads, isa);
      ASSERT_EQ(adam.threads(), threads);
      State st(n);
      st.load(c.p, c.m, c.v);
      adam.step(h, 1, 1.0f, st.p, st.m, st.v, c.grads[0].data(), DType::f32, n);
      adam.step(h, 2, 1.0f, st.p, st.m, st.v, g16.data(), DType::bf16, n);
      results.emplace_back(st.p, st.p + n);
      results.back().insert(results.back().end(), st.v, st.v + n);
      sums.push_back(adam.sum_squares(st.p, DType::f32, n));
    }
    for (std::size_t k = 1; k < results.size(); ++k) {
      EXPECT_EQ(first_bit_difference(results[0].data(), results[k].data(), results[0].size()), -1) << isa_name(isa);
      EXPECT_EQ(bits(float(sums[0])), bits(float(sums[k])));
      EXPECT_EQ(sums[0], sums[k]) << isa_name(isa);
    }
  }
}

TEST(CpuAdam, RejectsBadArguments) {
  CpuAdam adam(1);
  float x = 1.0f, m = 0.0f, v = 0.0f, g = 1.0f;
  AdamHyper h;
  EXPECT_THROW(adam.step(h, 0, 1.0f, &x, &m, &v, &g, DType::f32, 1), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, &x, &m, &v, &g, DType::f32, 1, &x, DType::f32), UsageError);
  EXPECT_THROW(adam.step(h, 1, 1.0f, nullptr, &m, &v, &g, DType::f32, 1), UsageError);
  EXPECT_THROW(CpuAdam(-1), UsageError);
  EXPECT_EQ(x, 1.0f);  // nothing written by the rejected calls
}

TEST(CpuAdam, IsaOverrideFromEnvironment) {
  {
    const ScopedEnv env("ZOE_ISA", "scalar");
    EXPECT_EQ(active_isa(), Isa::scalar);
    EXPECT_EQ(CpuAdam(1).isa(), Isa::scalar);
  }
  const ScopedEnv env("ZOE_ISA", "sse9");
  try {
    active_isa();
    ADD_FAILURE() << "ZOE_ISA=sse9 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "ZOE_ISA");
  }
}

}  // namespace
}  // namespace zoe::optim::test
