// zoe-gpt-head-bench: one rank's lm_head + softmax cross-entropy with its backward (the GPT
// trainer's hot loop: 6·N·C·V flops) for the Eigen fp32 reference (ops.hpp), and the oneDNN
// head (lm_head.hpp) in fp32 and bf16, single-threaded like a rank of the trainer.
//
// Bound: the same three matmuls (logits = x wte^T, dx = G wte, dwte = G^T x) run alone with
// oneDNN in the case's precision, over the same chunks, in the same run: what the head would
// cost if the softmax, the bf16 rounding and the memory traffic between them were free.
// value = tokens/s of the head; ratio = value / bound (<= 1; how close the fused head gets
// to its matmuls). The Eigen case is bounded by the fp32 matmuls. Best of --reps.
// --json prints one object per line: {"bench","case","value","unit","bound","ratio"}.
#include <CLI/CLI.hpp>
#include <dnnl.hpp>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/ops.hpp"

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <class F>
double best_seconds(int reps, F&& f) {
  f();  // warm-up: faults in the scratch, builds the primitives
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The three matmuls of the head alone, chunk by chunk (oneDNN, `type`).
double matmuls_seconds(int N, int C, int V, int chunk, dnnl::memory::data_type type, int reps) {
  using dims = dnnl::memory::dims;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const std::size_t es = type == dnnl::memory::data_type::f32 ? 4 : 2;
  const long R = std::min(chunk, N);
  std::vector<char> x(static_cast<std::size_t>(N) * C * es, 0), w(static_cast<std::size_t>(V) * C * es, 0),
      g(static_cast<std::size_t>(R) * V * es, 0);
  std::vector<float> logits(static_cast<std::size_t>(R) * V), dx(static_cast<std::size_t>(N) * C),
      dw(static_cast<std::size_t>(V) * C);
  auto make = [&](long M, long Nn, long K, dims sa, dims sb, bool acc) {
    dnnl::memory::desc a({M, K}, type, sa), b({K, Nn}, type, sb), c({M, Nn}, dnnl::memory::data_type::f32, dims{Nn, 1});
    dnnl::primitive_attr attr;
    if (acc) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    return std::make_tuple(dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng)), a, b, c);
  };
  auto [fwd, fa, fb, fc] = make(R, V, C, {C, 1}, {1, C}, false);
  auto [bx, xa, xb, xc] = make(R, C, V, {V, 1}, {C, 1}, true);
  auto [bw, wa, wb, wc] = make(V, C, R, {1, V}, {C, 1}, true);
  auto run = [&](dnnl::matmul& m, const dnnl::memory::desc& a, void* ap, const dnnl::memory::desc& b, void* bp,
                 const dnnl::memory::desc& c, float* cp) {
    dnnl::memory am(a, eng, ap), bm(b, eng, bp), cm(c, eng, cp);
    m.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  };
  return best_seconds(reps, [&] {
    for (long r0 = 0; r0 + R <= N; r0 += R) {
      char* xr = x.data() + static_cast<std::size_t>(r0) * C * es;
      run(fwd, fa, xr, fb, w.data(), fc, logits.data());
      run(bx, xa, g.data(), xb, w.data(), xc, dx.data() + static_cast<std::size_t>(r0) * C);
      run(bw, wa, g.data(), wb, xr, wc, dw.data());
    }
  });
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zoe-gpt-head-bench: the GPT trainer's lm_head + cross-entropy against its matmuls alone"};
  int N = 1024, C = 128, V = 50257, chunk = 1024, reps = 3;
  bool json = false;
  app.add_option("--rows", N, "token rows per call (a rank's micro-batch)")->capture_default_str();
  app.add_option("--width", C, "channels C")->capture_default_str();
  app.add_option("--vocab", V, "vocabulary V")->capture_default_str();
  app.add_option("--chunk", chunk, "rows per chunk")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (best is reported)")->capture_default_str();
  app.add_flag("--json", json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(1);  // one rank of the trainer on one core

  std::mt19937_64 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(N) * C), wte(static_cast<std::size_t>(V) * C);
  for (float& v : x) v = d(rng);
  for (float& v : wte) v = 0.02f * d(rng);
  std::vector<std::int32_t> y(N);
  for (int n = 0; n < N; ++n) y[n] = static_cast<std::int32_t>(rng() % V);
  std::vector<float> dx(x.size()), dw(wte.size());
  std::vector<float> scratch;

  const double t_f32 = matmuls_seconds(N, C, V, chunk, dnnl::memory::data_type::f32, reps);
  const double t_bf16 = matmuls_seconds(N, C, V, chunk, dnnl::memory::data_type::bf16, reps);
  gpt::LmHead head32(gpt::HeadPrecision::fp32, chunk), head16(gpt::HeadPrecision::bf16, chunk);
  struct Case {
    std::string name;
    double seconds, bound_seconds;
  };
  const Case cases[] = {
      {"eigen-fp32", best_seconds(reps, [&] {
         gpt::ops::lm_head_cross_entropy<float>(x.data(), wte.data(), y.data(), N, C, V, dx.data(), dw.data(), scratch, chunk);
       }), t_f32},
      {"onednn-fp32", best_seconds(reps, [&] {
         head32.loss_and_grad(x.data(), wte.data(), y.data(), N, C, V, dx.data(), dw.data());
       }), t_f32},
      {"onednn-bf16", best_seconds(reps, [&] {
         head16.loss_and_grad(x.data(), wte.data(), y.data(), N, C, V, dx.data(), dw.data());
       }), t_bf16},
  };
  const double flops = 6.0 * N * C * V;
  for (const Case& c : cases) {
    const double value = N / c.seconds, bound = N / c.bound_seconds;
    if (json) {
      std::printf("%s\n", nlohmann::json{{"bench", "gpt_head"}, {"case", c.name}, {"value", value},
                                         {"unit", "tokens/s"}, {"bound", bound}, {"ratio", value / bound}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%-12s %8.0f tokens/s (%5.1f GFLOP/s, %.3f s per call) | matmuls alone %8.0f tokens/s | ratio %.2f\n",
                  c.name.c_str(), value, flops / c.seconds / 1e9, c.seconds, bound, value / bound);
    }
  }
  if (!json)
    std::printf("speed-up of onednn-bf16 over the eigen-fp32 reference: %.2fx\n", cases[0].seconds / cases[2].seconds);
  return 0;
}
