#include "nn/kernels/blas.h"

#include <cblas.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace modelstate::internal {

int64_t MaxBlasDim() { return std::numeric_limits<blasint>::max(); }

absl::Status CheckBlasDims(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d > MaxBlasDim()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "A matrix dimension of ", d, " exceeds what OpenBLAS can index (",
          MaxBlasDim(), ")"));
    }
  }
  return absl::OkStatus();
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(lda, 1)), b,
              static_cast<blasint>(std::max<int64_t>(ldb, 1)), beta, c,
              static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(lda, 1)), b,
              static_cast<blasint>(std::max<int64_t>(ldb, 1)), beta, c,
              static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

int BlasThreads() { return openblas_get_num_threads(); }

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }

}  // namespace modelstate::internal
