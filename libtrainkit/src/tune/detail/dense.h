#pragma once
// Small dense linear algebra for the Gaussian process, on row-major double arrays. The GP's matrices are a
// few dozen to a few hundred wide: at that size an ATen op spends more time in dispatch than in arithmetic
// (a 50 x 50 Cholesky is ~20 000 multiply-adds, ~10 µs of loops), so these loops replace tensor ops there.
#include <cmath>
#include <cstdint>

namespace trainkit::tune::detail {

// Σ a[i] b[i] with four partial sums, so that the loop keeps several lanes busy without -ffast-math.
inline double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// The lower Cholesky factor of the symmetric n x n `a` (only its lower triangle is read) into `l`, whose upper
// triangle is zeroed; `a` and `l` may be the same array. False when a pivot is not positive (not positive
// definite, or NaN), with `l` partly written.
inline bool cholesky(const double* a, int64_t n, double* l) {
  for (int64_t i = 0; i < n; ++i) {
    double* li = l + i * n;
    for (int64_t j = 0; j <= i; ++j) {
      const double* lj = l + j * n;
      const double s = a[i * n + j] - dot(li, lj, j);
      if (j < i) {
        li[j] = s / lj[j];
      } else {
        if (!(s > 0)) return false;
        li[i] = std::sqrt(s);
      }
    }
    for (int64_t j = i + 1; j < n; ++j) li[j] = 0;
  }
  return true;
}

// Solves L x = b in place (L lower triangular, n x n).
inline void solve_lower(const double* l, int64_t n, double* b) {
  for (int64_t i = 0; i < n; ++i) b[i] = (b[i] - dot(l + i * n, b, i)) / l[i * n + i];
}

// Solves Lᵀ x = b in place, by columns of L (rows of Lᵀ are columns of L: this reads L row by row).
inline void solve_lower_transposed(const double* l, int64_t n, double* b) {
  for (int64_t i = n - 1; i >= 0; --i) {
    const double* li = l + i * n;
    const double xi = b[i] / li[i];
    b[i] = xi;
    for (int64_t k = 0; k < i; ++k) b[k] -= xi * li[k];
  }
}

// Solves L X = B in place for the m columns of B (n x m, row-major): one pass over L for all columns.
inline void solve_lower_columns(const double* l, int64_t n, double* b, int64_t m) {
  for (int64_t i = 0; i < n; ++i) {
    double* bi = b + i * m;
    for (int64_t k = 0; k < i; ++k) {
      const double lik = l[i * n + k];
      const double* bk = b + k * m;
      for (int64_t c = 0; c < m; ++c) bi[c] -= lik * bk[c];
    }
    const double inv = 1 / l[i * n + i];
    for (int64_t c = 0; c < m; ++c) bi[c] *= inv;
  }
}

// Solves Lᵀ X = B in place for the m columns of B (n x m, row-major).
inline void solve_lower_transposed_columns(const double* l, int64_t n, double* b, int64_t m) {
  for (int64_t i = n - 1; i >= 0; --i) {
    double* bi = b + i * m;
    const double inv = 1 / l[i * n + i];
    for (int64_t c = 0; c < m; ++c) bi[c] *= inv;
    for (int64_t k = 0; k < i; ++k) {
      const double lik = l[i * n + k];
      double* bk = b + k * m;
      for (int64_t c = 0; c < m; ++c) bk[c] -= lik * bi[c];
    }
  }
}

// U = L⁻ᵀ (upper triangular, row-major): row j of U is column j of L⁻¹, so that (LLᵀ)⁻¹ = UUᵀ has
// entry (i, j), i <= j, dot(U[i][j..n), U[j][j..n)), all contiguous reads.
inline void inverse_lower_transposed(const double* l, int64_t n, double* u) {
  for (int64_t j = 0; j < n; ++j) {
    double* uj = u + j * n;
    for (int64_t i = 0; i < j; ++i) uj[i] = 0;
    for (int64_t i = j; i < n; ++i) {
      const double* li = l + i * n;
      uj[i] = ((i == j ? 1.0 : 0.0) - dot(li + j, uj + j, i - j)) / li[i];
    }
  }
}

}  // namespace trainkit::tune::detail
