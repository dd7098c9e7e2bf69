// column_major_gemm (gemm_layout.hpp), the mapping CudaOps hands cuBLAS, on the CPU: the
// column-major call it returns, run by a BLAS-definition reference (sgemm's loops), must
// compute the row-major product, for every transpose combination, with padded leading
// dimensions, batch strides and beta != 0, and leave the padding of C alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "examples/gpt/gemm_layout.hpp"

namespace gpt {
namespace {

// The BLAS definition, column-major: C(i, j) at C[i + j ldc], op(X)(i, l) = X[i + l ld] or,
// transposed, X[l + i ld]; C = alpha op(first) op(second) + beta C, `batch` times.
void blas_gemm_reference(const ColumnMajorGemm& g, float alpha, float beta, float* C, int batch) {
  for (int b = 0; b < batch; ++b) {
    const float* X = g.first + b * g.stride_first;
    const float* Y = g.second + b * g.stride_second;
    float* Z = C + b * g.stride_c;
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        double acc = 0;
        for (int l = 0; l < g.k; ++l) {
          const float x = g.trans_first ? X[l + static_cast<std::int64_t>(i) * g.ld_first]
                                        : X[i + static_cast<std::int64_t>(l) * g.ld_first];
          const float y = g.trans_second ? Y[j + static_cast<std::int64_t>(l) * g.ld_second]
                                         : Y[l + static_cast<std::int64_t>(j) * g.ld_second];
          acc += static_cast<double>(x) * y;
        }
        float& z = Z[i + static_cast<std::int64_t>(j) * g.ldc];
        z = static_cast<float>(alpha * acc + beta * static_cast<double>(z));
      }
  }
}

TEST(GemmLayout, ColumnMajorCallComputesTheRowMajorProduct) {
  constexpr int M = 5, N = 7, K = 3, kBatch = 3, kPad = 2;
  constexpr float alpha = 0.5f, beta = 2.f;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << ", trans_b " << tb);
      // Stored shapes and padded row strides; batch strides beyond one matrix.
      const int a_rows = ta ? K : M, a_cols = ta ? M : K;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N;
      RowMajorGemm g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.M = M;
      g.N = N;
      g.K = K;
      g.lda = a_cols + kPad;
      g.ldb = b_cols + kPad;
      g.ldc = N + kPad;
      g.stride_a = static_cast<std::int64_t>(a_rows) * g.lda + 1;
      g.stride_b = static_cast<std::int64_t>(b_rows) * g.ldb + 3;
      g.stride_c = static_cast<std::int64_t>(M) * g.ldc + 5;
      std::vector<float> A(kBatch * g.stride_a), B(kBatch * g.stride_b), C(kBatch * g.stride_c);
      for (auto* v : {&A, &B, &C})
        for (float& x : *v) x = nd(rng);
      g.A = A.data();
      g.B = B.data();

      // Row-major reference: C[i, j] = alpha sum_l op(A)[i, l] op(B)[l, j] + beta C[i, j].
      std::vector<float> want = C;
      for (int b = 0; b < kBatch; ++b)
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int l = 0; l < K; ++l) {
              const float a = ta ? A[b * g.stride_a + l * g.lda + i] : A[b * g.stride_a + i * g.lda + l];
              const float bv = tb ? B[b * g.stride_b + j * g.ldb + l] : B[b * g.stride_b + l * g.ldb + j];
              acc += static_cast<double>(a) * bv;
            }
            float& c = want[b * g.stride_c + i * g.ldc + j];
            c = static_cast<float>(alpha * acc + beta * static_cast<double>(c));
          }

      const ColumnMajorGemm cm = column_major_gemm(g);
      EXPECT_EQ(cm.m, N);
      EXPECT_EQ(cm.n, M);
      EXPECT_EQ(cm.k, K);
      std::vector<float> got = C;
      blas_gemm_reference(cm, alpha, beta, got.data(), kBatch);
      // Every element, padding and gaps included (those must be untouched: equal to C).
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1.f + std::abs(want[i]))) << "element " << i;
    }
}

}  // namespace
}  // namespace gpt
