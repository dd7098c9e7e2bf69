// The whole CPU step of ZeRO-Offload (offload_optimizer.device = cpu), one rank, against the
// bound of its bytes:
//   1. gradient add from the tier: the reduced bf16 gradient shard cast into the tier's fp32
//      gradient (the first micro-batch), its sum of squares and finiteness;
//   2. the global norm from those sums, the overflow check, the clip coefficient (max norm 1.0),
//      the unscale (loss scale 1024) folded into Adam's grad_scale;
//   3. AdamW over every sub-group with the bf16 copy-out of the updated weights.
// Two implementations, timed interleaved in the same run:
//  - "as the pipeline runs it": offload::OptimizerStates::add_grad handed the step's CpuAdam
//    (OptimizerStatesOptions::adam, as the engine does: CpuAdam::add_grad, the cast + sum of
//    squares + finiteness in one pass over the CpuAdam threads), grad_sum_squares /
//    grad_finite, for_each + CpuAdam::step, as src/core/step.cpp drives them (not through an
//    Engine: see step_bench.cpp);
//  - "tier-free": the same CpuAdam::add_grad and CpuAdam::step on arrays of our own laid out as
//    the cpu tier lays them out ([master | exp_avg | exp_avg_sq] per sub-group, and its fp32
//    gradient), so the gap between the two is the tier's own cost (host-access checks,
//    for_each). The arithmetic and results are identical.
// Bytes: 36 per element: 2 (bf16 gradient read) + 4 (fp32 gradient written) in part 1, then
// 16 read + 12 written + 2 (bf16 copy) in part 3; the norm's re-read of the fp32 gradient is not
// counted (a fused pass needs none).
// Bound (same run, same sub-group ranges, order rotated with the variants): a STREAM-style pass
// of part 1's pattern (2-byte read, 4-byte write) plus bench/adam's Adam-pattern pass (4 fp32
// reads, 3 in-place writes, one 16-bit write), each with the faster of its store kinds in that
// repetition. Ratio = bound seconds / variant seconds (target >= 0.9).
#include "bench/offload/cpu_step_bench.hpp"

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <span>
#include <string>
#include <vector>

#include "bench/adam/bench_loops.hpp"
#include "kernels/half.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/offload/optimizer_states.hpp"
#include "src/optim/cpu_adam.hpp"

namespace zoe::bench {
namespace {

// Part 1's access pattern: dst[i] = float(src[i]) (bf16 -> fp32, exact), streaming or not.
template <bool NT>
__attribute__((target("avx512f,avx512bw"))) void widen_avx512(const std::uint16_t* src, float* dst, std::size_t b,
                                                              std::size_t e) {
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    if constexpr (NT) _mm512_stream_ps(dst + i, x);
    else _mm512_storeu_ps(dst + i, x);
  }
  if constexpr (NT) _mm_sfence();
  for (; i < e; ++i) dst[i] = kernels::bf16_to_f32(src[i]);
}

void widen_scalar(const std::uint16_t* src, float* dst, std::size_t b, std::size_t e) {
  for (std::size_t i = b; i < e; ++i) dst[i] = kernels::bf16_to_f32(src[i]);
}

void widen_pass(tbb::task_arena& arena, const std::uint16_t* src, float* dst, std::size_t n, bool nt) {
  const bool avx512 = optim::active_isa() == optim::Isa::avx512;
  nt = nt && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0;
  const std::size_t chunk = optim::CpuAdam::kChunk, chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t c = r.begin(); c != r.end(); ++c) {
        const std::size_t b = c * chunk, e = std::min(n, b + chunk);
        if (avx512) nt ? widen_avx512<true>(src, dst, b, e) : widen_avx512<false>(src, dst, b, e);
        else widen_scalar(src, dst, b, e);
      }
    });
  });
}

double thread_cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string millions(std::int64_t n) {
  return n % 1'000'000 == 0 ? std::to_string(n / 1'000'000) + "M" : std::to_string(n);
}

// The cpu tier's layout, owned here: per sub-group [master | exp_avg | exp_avg_sq] and its
// fp32 gradient.
struct OwnTier {
  std::vector<AlignedBuffer> states, grads;
};

}  // namespace

void run_cpu_step_case(const CpuStepBenchOptions& o, const Report& report) {
  const std::int64_t psi = o.psi, sub = o.sub_group_numel;
  std::vector<std::int64_t> begin, numel;
  for (std::int64_t c = 0; c < psi; c += sub) begin.push_back(c), numel.push_back(std::min(sub, psi - c));
  const auto n_all = static_cast<std::size_t>(psi);

  // Inputs: the reduced bf16 gradient shard; the bf16 weight copy written by Adam.
  AlignedBuffer grad16(n_all * 2), out16(n_all * 2);
  auto* g16 = grad16.as<std::uint16_t>().data();
  auto* out = out16.as<std::uint16_t>().data();
  for (std::size_t i = 0; i < n_all; ++i)
    g16[i] = kernels::f32_to_bf16((static_cast<float>(i % 997) - 498.0f) * 1e-4f + 1e-5f);
  std::memset(out, 0, n_all * 2);

  // Variant "pipeline": the cpu tier of OptimizerStates.
  optim::CpuAdam adam(o.threads);
  offload::OptimizerStatesOptions so;
  so.device = OffloadDevice::cpu;
  so.adam = &adam;  // the gradient add in the step's arena, as the engine hands it
  offload::OptimizerStates states(so);
  std::vector<int> ids;
  for (std::int64_t n : numel) ids.push_back(states.add(n));
  states.finalize();
  std::vector<float> initial(static_cast<std::size_t>(std::min(sub, psi)));
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = 0.5f + static_cast<float>(i % 1021) * 1e-3f;
  for (std::size_t k = 0; k < ids.size(); ++k)
    states.write_initial(ids[k], std::span<const float>(initial.data(), static_cast<std::size_t>(numel[k])));
  states.finish_initial();

  // Variant "tier-free": the same layout in buffers of our own.
  OwnTier own;
  for (std::int64_t n : numel) {
    const auto un = static_cast<std::size_t>(n);
    own.states.emplace_back(un * 12, 64);
    own.grads.emplace_back(un * 4, 64);
    float* s = own.states.back().as<float>().data();
    std::copy(initial.begin(), initial.begin() + n, s);
    std::memset(s + un, 0, un * 8);
    std::memset(own.grads.back().data(), 0, un * 4);
  }

  tbb::task_arena arena(adam.threads());
  optim::AdamHyper h;
  h.weight_decay = 0.01;
  const double loss_scale = 1024.0, max_norm = 1.0;
  std::int64_t t_pipeline = 0, t_tier_free = 0;
  double last_norm[2] = {0, 0};
  // Part 2: norm, overflow, clip coefficient -> Adam's grad_scale (src/core/step.cpp's formula).
  auto grad_scale_of = [&](double sum_squares, bool finite, int which) {
    const double inv = 1.0 / loss_scale;
    const double norm = std::sqrt(sum_squares) * inv;
    last_norm[which] = norm;
    const double clip = finite && max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
    return static_cast<float>(inv * clip);
  };
  auto pipeline = [&] {
    for (std::size_t k = 0; k < ids.size(); ++k) states.add_grad(ids[k], g16 + begin[k], DType::bf16, true, true);
    double sum = 0;
    bool finite = true;
    for (int id : ids) sum += states.grad_sum_squares(id), finite = finite && states.grad_finite(id);
    const float scale = grad_scale_of(sum, finite, 0);
    ++t_pipeline;
    std::size_t k = 0;
    states.for_each(ids, [&](const offload::SubGroupStates& sg) {
      adam.step(h, t_pipeline, scale, sg.master, sg.exp_avg, sg.exp_avg_sq, sg.state_dtype, sg.grad, sg.grad_dtype,
                static_cast<std::size_t>(sg.numel), out + begin[k++], DType::bf16);
    });
  };
  auto tier_free = [&] {
    double sum = 0;
    bool finite = true;
    for (std::size_t k = 0; k < numel.size(); ++k) {
      const auto st = adam.add_grad(g16 + begin[k], DType::bf16, own.grads[k].as<float>().data(),
                                    static_cast<std::size_t>(numel[k]), true);
      sum += st.sum_squares, finite = finite && st.finite;
    }
    const float scale = grad_scale_of(sum, finite, 1);
    ++t_tier_free;
    for (std::size_t k = 0; k < numel.size(); ++k) {
      const auto n = static_cast<std::size_t>(numel[k]);
      float* s = own.states[k].as<float>().data();
      adam.step(h, t_tier_free, scale, s, s + n, s + 2 * n, own.grads[k].as<float>().data(), DType::f32, n, out + begin[k],
                DType::bf16);
    }
  };
  const optim::Stores kinds[] = {{optim::StoreKind::ordinary, optim::StoreKind::ordinary},
                                 {optim::StoreKind::nontemporal, optim::StoreKind::nontemporal},
                                 {optim::StoreKind::ordinary, optim::StoreKind::nontemporal}};
  auto widen_bound = [&](bool nt) {
    for (std::size_t k = 0; k < numel.size(); ++k)
      widen_pass(arena, g16 + begin[k], own.grads[k].as<float>().data(), static_cast<std::size_t>(numel[k]), nt);
  };
  auto adam_bound = [&](int kind) {
    for (std::size_t k = 0; k < numel.size(); ++k) {
      const auto n = static_cast<std::size_t>(numel[k]);
      float* s = own.states[k].as<float>().data();
      stream_bound_pass(arena, s, s + n, s + 2 * n, own.grads[k].as<float>().data(), out + begin[k], n, kinds[kind]);
    }
  };

  const bool cpu_clock = o.thread_cpu && adam.threads() == 1;
  auto seconds = [cpu_clock](auto&& f) {
    if (!cpu_clock) return zoe::bench::seconds(f);
    const double t0 = thread_cpu_now();
    f();
    return thread_cpu_now() - t0;
  };
  const std::string name = "cpu psi=" + millions(psi) + " sub-group=" + millions(sub) +
                           " threads=" + std::to_string(adam.threads()) + (cpu_clock ? " clock=thread-cpu" : "");
  report.text("# %s: whole CPU step (gradient add, norm, clip, AdamW, bf16 copy), %zu sub-groups\n", name.c_str(),
              numel.size());
  // Warm-up: faults nothing new, starts the threads, runs CpuAdam's store trials (StorePolicy::
  // measure decides per size class on its first calls, here the first steps' sub-groups).
  for (int w = 0; w < 4; ++w) pipeline(), tier_free();

  enum { kPipeline, kTierFree, kWidenOrd, kWidenNt, kAdamOrd, kAdamNt, kAdamNtHalf, kPasses };
  std::vector<std::vector<double>> secs(kPasses);
  std::vector<int> order{kPipeline, kWidenOrd, kAdamOrd, kTierFree, kWidenNt, kAdamNt, kAdamNtHalf};
  for (int r = 0; r < o.reps; ++r) {
    std::rotate(order.begin(), order.begin() + 1, order.end());
    for (int p : order) {
      double dt = 0;
      switch (p) {
        case kPipeline: dt = seconds(pipeline); break;
        case kTierFree: dt = seconds(tier_free); break;
        case kWidenOrd: dt = seconds([&] { widen_bound(false); }); break;
        case kWidenNt: dt = seconds([&] { widen_bound(true); }); break;
        default: dt = seconds([&] { adam_bound(p - kAdamOrd); }); break;
      }
      secs[p].push_back(dt);
    }
    report.text("#   rep %d: pipeline %.3f s, tier-free %.3f s, bound %.3f s (widen %.3f / %.3f, adam %.3f / %.3f / %.3f)\n", r,
                secs[kPipeline].back(), secs[kTierFree].back(),
                std::min(secs[kWidenOrd].back(), secs[kWidenNt].back()) +
                    std::min({secs[kAdamOrd].back(), secs[kAdamNt].back(), secs[kAdamNtHalf].back()}),
                secs[kWidenOrd].back(), secs[kWidenNt].back(), secs[kAdamOrd].back(), secs[kAdamNt].back(),
                secs[kAdamNtHalf].back());
  }
  if (last_norm[0] != last_norm[1])
    report.text("# WARNING: the two variants' gradient norms differ: %.17g vs %.17g\n", last_norm[0], last_norm[1]);
  const double bytes = 36.0 * static_cast<double>(psi);
  std::vector<double> bound_s;
  for (int r = 0; r < o.reps; ++r)
    bound_s.push_back(std::min(secs[kWidenOrd][r], secs[kWidenNt][r]) +
                      std::min({secs[kAdamOrd][r], secs[kAdamNt][r], secs[kAdamNtHalf][r]}));
  auto line = [&](const std::string& what, int p) {
    std::vector<double> ratio;
    for (int r = 0; r < o.reps; ++r) ratio.push_back(bound_s[r] / secs[p][r]);
    report.line(name + " " + what, bytes / median(secs[p]) / 1e9, "GB/s", bytes / median(bound_s) / 1e9,
                median(ratio), "(36 B/element; bound: widen + Adam-pattern passes, best stores)");
  };
  line("CPU step as the pipeline runs it", kPipeline);
  line("CPU step tier-free", kTierFree);
  const auto choice = adam.store_choice(static_cast<std::size_t>(numel.front()), DType::f32, true);
  const auto grad_choice = adam.add_grad_store_choice(static_cast<std::size_t>(numel.front()), DType::bf16, true);
  report.text("# CpuAdam's measured picks for the sub-groups: step %s (%s), add_grad %s stores (%s)\n",
              optim::stores_name(choice.stores).c_str(), choice.decided ? "measured" : "still measuring",
              grad_choice.stores.in_place == optim::StoreKind::nontemporal ? "nontemporal" : "ordinary",
              grad_choice.decided ? "measured" : "still measuring");
}

}  // namespace zoe::bench
