// Central finite differences in double precision, for checking hand-written backward passes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace gpt::test {

inline std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Checks analytic[i] == d f / d x[i] (central difference, step h) for every element of x;
/// f reads x. Tolerance: |a - n| <= tol * max(1, |a|, |n|).
inline void expect_gradient(const std::string& what, std::vector<double>& x,
                            const std::vector<double>& analytic,
                            const std::function<double()>& f, double h = 1e-6,
                            double tol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double fp = f();
    x[i] = saved - h;
    const double fm = f();
    x[i] = saved;
    const double numeric = (fp - fm) / (2 * h);
    const double err = std::abs(analytic[i] - numeric) /
                       std::max({1.0, std::abs(analytic[i]), std::abs(numeric)});
    worst = std::max(worst, err);
    if (err > tol) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric;
      return;
    }
  }
  SCOPED_TRACE(what);
  EXPECT_LE(worst, tol);
}

/// sum(g .* y): the scalar whose gradient w.r.t. y is g.
inline double dot(const std::vector<double>& g, const std::vector<double>& y) {
  double s = 0;
  for (std::size_t i = 0; i < g.size(); ++i) s += g[i] * y[i];
  return s;
}

}  // namespace gpt::test
