// The host device's optimizer loop (Device::adam_step): kernels::adam_update per element, built
// three times from one body, for the baseline x86-64, AVX2 and AVX-512, and run with the widest
// the CPU has (CPUID, once). The compiler vectorizes the body; it may not contract a*b+c
// (-ffp-contract=off, src/device/CMakeLists.txt) and IEEE sqrt, divide, multiply and add round
// the same in every lane width, so every build gives the scalar loop's bits (tested per ISA).
// Each build is one function with a target attribute into which the body and the kernels/
// math it calls are inlined (always_inline, flatten): no out-of-line copy of a shared inline
// function is compiled for a wider ISA, so the linker can never hand the baseline code one.
#include <cstdint>
#include <type_traits>

#include "kernels/adam_math.hpp"
#include "kernels/elementwise.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe::host_ops {
namespace {

namespace k = zoe::kernels;

// The body every build inlines. A local copy of the coefficients: the stores through the
// arrays could otherwise alias them, which forces a reload per element and blocks vectors.
template <DType G, DType O, bool Out>
[[gnu::always_inline]] inline void adam_body(const k::AdamCoeffs& coeffs, float* __restrict master,
                                             float* __restrict exp_avg, float* __restrict exp_avg_sq,
                                             const void* __restrict grad, void* __restrict out, std::size_t n) {
  const k::AdamCoeffs c = coeffs;
  for (std::size_t i = 0; i < n; ++i) {
    k::adam_update(c, k::load_f32(grad, G, i), master[i], exp_avg[i], exp_avg_sq[i]);
    if constexpr (Out) k::store_f32(out, O, i, master[i]);
  }
}

template <DType G, DType O, bool Out>
[[gnu::flatten]] void adam_baseline(const k::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                                    const void* grad, void* out, std::size_t n) {
  adam_body<G, O, Out>(c, master, exp_avg, exp_avg_sq, grad, out, n);
}

#if defined(__x86_64__)
template <DType G, DType O, bool Out>
[[gnu::flatten, gnu::target("avx2,f16c")]] void adam_avx2(const k::AdamCoeffs& c, float* master, float* exp_avg,
                                                           float* exp_avg_sq, const void* grad, void* out,
                                                           std::size_t n) {
  adam_body<G, O, Out>(c, master, exp_avg, exp_avg_sq, grad, out, n);
}

template <DType G, DType O, bool Out>
[[gnu::flatten, gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")]] void adam_avx512(
    const k::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq, const void* grad, void* out,
    std::size_t n) {
  adam_body<G, O, Out>(c, master, exp_avg, exp_avg_sq, grad, out, n);
}
#endif

using AdamLoop = void (*)(const k::AdamCoeffs&, float*, float*, float*, const void*, void*, std::size_t);

// The build `isa` of the loop for these dtypes (no output: `out_dtype` ignored).
template <DType G>
AdamLoop pick_out(AdamIsa isa, bool has_out, DType out_dtype) {
  auto of = [isa](auto o, auto with_out) -> AdamLoop {
    constexpr DType O = decltype(o)::value;
    constexpr bool W = decltype(with_out)::value;
#if defined(__x86_64__)
    switch (isa) {
      case AdamIsa::avx512: return &adam_avx512<G, O, W>;
      case AdamIsa::avx2: return &adam_avx2<G, O, W>;
      case AdamIsa::baseline: break;
    }
#else
    (void)isa;
#endif
    return &adam_baseline<G, O, W>;
  };
  using F32 = std::integral_constant<DType, DType::f32>;
  using BF16 = std::integral_constant<DType, DType::bf16>;
  using F16 = std::integral_constant<DType, DType::f16>;
  if (!has_out) return of(F32{}, std::false_type{});
  switch (out_dtype) {
    case DType::bf16: return of(BF16{}, std::true_type{});
    case DType::f16: return of(F16{}, std::true_type{});
    case DType::f32: break;
  }
  return of(F32{}, std::true_type{});
}

AdamLoop pick(AdamIsa isa, DType grad_dtype, bool has_out, DType out_dtype) {
  switch (grad_dtype) {
    case DType::bf16: return pick_out<DType::bf16>(isa, has_out, out_dtype);
    case DType::f16: return pick_out<DType::f16>(isa, has_out, out_dtype);
    case DType::f32: break;
  }
  return pick_out<DType::f32>(isa, has_out, out_dtype);
}

}  // namespace

bool adam_isa_available(AdamIsa isa) {
#if !defined(__x86_64__)
  return isa == AdamIsa::baseline;
#else
  switch (isa) {
    case AdamIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && adam_isa_available(AdamIsa::avx2);
    case AdamIsa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case AdamIsa::baseline: return true;
  }
  return false;
#endif
}

AdamIsa best_adam_isa() {
  static const AdamIsa best = adam_isa_available(AdamIsa::avx512) ? AdamIsa::avx512
                              : adam_isa_available(AdamIsa::avx2)  ? AdamIsa::avx2
                                                                   : AdamIsa::baseline;
  return best;
}

void adam_range(AdamIsa isa, const kernels::AdamCoeffs& c, float* master, float* exp_avg, float* exp_avg_sq,
                const void* grad, DType grad_dtype, void* out, DType out_dtype, std::size_t n) {
  pick(isa, grad_dtype, out != nullptr, out_dtype)(c, master, exp_avg, exp_avg_sq, grad, out, n);
}

}  // namespace zoe::host_ops
