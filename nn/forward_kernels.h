// File: forward_kernels.h
// The numeric building blocks of forward.cc: the only place in core that
// talks to OpenBLAS (row-major gemm for float and double), and a small
// parallel-for for the kernels' own loops.
//
// Example:
//   // C[2x4] = A[2x3] * B[4x3]^T
//   internal::Gemm(false, true, 2, 4, 3, 1.0f, a, 3, b, 3, 0.0f, c, 4);
#ifndef MODELSTATE_NN_FORWARD_KERNELS_H_
#define MODELSTATE_NN_FORWARD_KERNELS_H_

#include <cstdint>
#include <functional>
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

// Runs fn(begin, end) over [0, n) split into at most `threads` contiguous
// ranges, on this thread plus threads-1 new ones. Runs inline when threads
// <= 1 or the work (`n * cost_per_item`, in rough nanoseconds) is too small
// to pay for starting threads.
void ParallelFor(int64_t n, int threads, int64_t cost_per_item,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_FORWARD_KERNELS_H_
