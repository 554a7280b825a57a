// File: blas.h
// The only place in modelstate that talks to OpenBLAS: row-major gemm for
// float and double, the size check that keeps extents within what OpenBLAS
// can index, its thread count, and the linear map y = x W^T + b that the
// Linear and attention layers share.
//
// Example:
//   // C[2x4] = A[2x3] * B[4x3]^T
//   MODELSTATE_RETURN_IF_ERROR(internal::CheckBlasDims({2, 4, 3}));
//   internal::Gemm(false, true, 2, 4, 3, 1.0f, a, 3, b, 3, 0.0f, c, 4);
#ifndef MODELSTATE_NN_KERNELS_BLAS_H_
#define MODELSTATE_NN_KERNELS_BLAS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"

namespace modelstate::internal {

// The largest extent or leading dimension OpenBLAS can take (its blasint).
int64_t MaxBlasDim();

// RESOURCE_EXHAUSTED unless every value fits MaxBlasDim().
absl::Status CheckBlasDims(std::initializer_list<int64_t> dims);

// C[m x n] = alpha * op(A) * op(B) + beta * C, row-major; op(X) is X or X^T.
// A is m x k (k x m when transposed) with leading dimension lda, and so on.
// REQUIRES: dimensions checked with CheckBlasDims.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          float beta, float* c, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc);

// OpenBLAS's thread count (process-wide), and setting it.
int BlasThreads();
void SetBlasThreads(int threads);

// y[rows, out] = x[rows, in] * w[out, in]^T + b (b may be null: no bias).
// REQUIRES: dimensions checked with CheckBlasDims.
template <typename T>
void LinearRows(const T* x, int64_t rows, int64_t in, const T* w, int64_t out,
                const T* b, T* y) {
  if (b != nullptr) {
    for (int64_t r = 0; r < rows; ++r) std::copy(b, b + out, y + r * out);
  }
  if (in == 0) {
    if (b == nullptr) std::fill(y, y + rows * out, T(0));
    return;
  }
  Gemm(false, true, rows, out, in, T(1), x, in, w, in, b ? T(1) : T(0), y, out);
}

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_KERNELS_BLAS_H_
