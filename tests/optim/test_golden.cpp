// CpuAdam against torch.optim.AdamW / Adam (golden values made by tests/data/adam_golden.py with
// Debian's python3-torch 1.13): 100 steps, lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/optim/adam_reference.hpp"
#include "tests/optim/test_support.hpp"

namespace zoe::optim::test {
namespace {

constexpr std::size_t kN = 37;
constexpr int kSteps = 100;

// The inputs of adam_golden.py, rebuilt exactly (binary fractions).
std::int64_t k(std::int64_t t, std::int64_t i) {
  const std::uint64_t h = (std::uint64_t(i) * 2654435761u + std::uint64_t(t) * 40503u + 12345u) % (1ull << 32);
  return std::int64_t((h >> 8) % 2049) - 1024;
}
std::vector<float> grad(int t) {
  std::vector<float> g(kN);
  for (std::size_t i = 0; i < kN; ++i)
    g[i] = i % 13 == 0 ? 0.0f : float(std::ldexp(double(k(t, i)) / 1024.0, -(t % 7)));
  return g;
}
std::vector<float> param0() {
  std::vector<float> p(kN);
  for (std::size_t i = 0; i < kN; ++i) p[i] = float(double(k(0, i)) / 256.0);
  return p;
}

// "<adam|adamw> <param|exp_avg|exp_avg_sq> <hex bits>..." -> map["adamw param"] = values.
std::map<std::string, std::vector<float>> load_golden() {
  const char* src = std::getenv("ZOE_SOURCE_DIR");
  const std::string path = std::string(src ? src : ".") + "/tests/data/adam_golden.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (set ZOE_SOURCE_DIR to the repository root)";
  std::map<std::string, std::vector<float>> golden;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string opt, what, hex;
    ls >> opt >> what;
    auto& values = golden[opt + " " + what];
    while (ls >> hex) {
      const auto u = static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16));
      float f;
      std::memcpy(&f, &u, 4);
      values.push_back(f);
    }
  }
  return golden;
}

// Largest |got - want| / |want| per element (weights: all of magnitude ~1).
double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double denom = std::max(std::fabs(double(want[i])), 1e-30);
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / denom);
  }
  return worst;
}

// Largest |got - want| relative to the largest |want|: for the moments, where elements near zero
// (after sign changes of the running average) make per-element relative error meaningless.
double max_error_relative_to_scale(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1e-30, worst = 0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  return worst / scale;
}

TEST(TorchGolden, HundredStepsOfAdamWAndAdamWithinOnePpm) {
  const auto golden = load_golden();
  for (bool decoupled : {true, false}) {
    const std::string name = decoupled ? "adamw" : "adam";
    ASSERT_EQ(golden.count(name + " param"), 1u) << name;
    ASSERT_EQ(golden.at(name + " param").size(), kN);
    // The test's own reference, as a check that the inputs were rebuilt faithfully.
    RefHyper rh;
    rh.decoupled = decoupled;
    std::vector<float> rp = param0(), rm(kN, 0.0f), rv(kN, 0.0f);
    for (int t = 1; t <= kSteps; ++t) ref_adam_step(rh, t, 1.0f, rp, rm, rv, grad(t));
    EXPECT_LE(max_rel_error(rp, golden.at(name + " param")), 1e-6) << name << " reference vs torch";

    for (Isa isa : runnable_isas()) {
      CpuAdam adam(2, isa);
      AdamHyper h;
      h.lr = 1e-3;
      h.beta1 = 0.9;
      h.beta2 = 0.999;
      h.eps = 1e-8;
      h.weight_decay = 0.01;
      h.decoupled = decoupled;
      std::vector<float> p = param0(), m(kN, 0.0f), v(kN, 0.0f);
      for (int t = 1; t <= kSteps; ++t) {
        const auto g = grad(t);
        adam.step(h, t, 1.0f, p.data(), m.data(), v.data(), g.data(), DType::f32, kN);
      }
      const std::string ctx = name + " " + std::string(isa_name(isa));
      EXPECT_LE(max_rel_error(p, golden.at(name + " param")), 1e-6) << ctx;
      EXPECT_LE(max_error_relative_to_scale(m, golden.at(name + " exp_avg")), 1e-6) << ctx;
      EXPECT_LE(max_error_relative_to_scale(v, golden.at(name + " exp_avg_sq")), 1e-6) << ctx;
      std::printf("%s vs torch: param max relative error %.3g; exp_avg, exp_avg_sq max error / max value %.3g, %.3g\n",
                  ctx.c_str(), max_rel_error(p, golden.at(name + " param")),
                  max_error_relative_to_scale(m, golden.at(name + " exp_avg")),
                  max_error_relative_to_scale(v, golden.at(name + " exp_avg_sq")));
    }
  }
}

}  // namespace
}  // namespace zoe::optim::test
