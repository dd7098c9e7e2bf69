// A row-major GEMM as the column-major (BLAS, cuBLAS) call that computes it: CudaOps'
// row-major products go to cuBLAS through column_major_gemm, and tests/gpt/test_gemm_layout.cpp
// checks the mapping on the CPU against the BLAS definition (no GPU needed).
//
// A row-major matrix X [r, c] with row stride ld is, read column-major, X^T [c, r] with leading
// dimension ld. So row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands
// swap places, M and N swap, the transpose flags and leading dimensions stay with their operand.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace gpt {

/// Row-major C [M, N] = alpha op(A) op(B) + beta C, `batch` times with element strides
/// stride_a, stride_b, stride_c between the batch's matrices. A is stored [M, K] (or [K, M] when
/// trans_a), B [K, N] (or [N, K] when trans_b); lda, ldb, ldc are the stored row strides in
/// elements (lda >= K or M, ldb >= N or K, ldc >= N).
struct RowMajorGemm {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int lda = 0;
  std::int64_t stride_a = 0;
  const float* B = nullptr;
  int ldb = 0;
  std::int64_t stride_b = 0;
  int ldc = 0;
  std::int64_t stride_c = 0;
};

/// The BLAS call C = op(first) op(second) (column-major, m x n, inner k) computing a
/// RowMajorGemm; C, alpha, beta and the batch count are the same as the row-major ones.
struct ColumnMajorGemm {
  bool trans_first = false, trans_second = false;
  int m = 0, n = 0, k = 0;
  const float* first = nullptr;
  int ld_first = 0;
  std::int64_t stride_first = 0;
  const float* second = nullptr;
  int ld_second = 0;
  std::int64_t stride_second = 0;
  int ldc = 0;
  std::int64_t stride_c = 0;
};

inline ColumnMajorGemm column_major_gemm(const RowMajorGemm& g) {
  ColumnMajorGemm c;
  c.trans_first = g.trans_b;
  c.trans_second = g.trans_a;
  c.m = g.N;
  c.n = g.M;
  c.k = g.K;
  c.first = g.B;
  c.ld_first = g.ldb;
  c.stride_first = g.stride_b;
  c.second = g.A;
  c.ld_second = g.lda;
  c.stride_second = g.stride_a;
  c.ldc = g.ldc;
  c.stride_c = g.stride_c;
  return c;
}

}  // namespace gpt
