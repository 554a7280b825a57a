#include "nn/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MODELSTATE_VECTOR_MATH_X86 1
#else
#define MODELSTATE_VECTOR_MATH_X86 0
#endif

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Scalar formulas (CPUs without AVX2 + FMA).

// 1 + erf(-y) = erfc(y) and 1 + tanh(u) = 2 / (1 + exp(-2u)) avoid the
// cancellation in 1 + erf and 1 + tanh for negative x.
float GeluErfScalar(float x) {
  return 0.5f * x * std::erfc(-x * static_cast<float>(M_SQRT1_2));
}

float GeluTanhScalar(float x) {
  const float k = static_cast<float>(M_2_SQRTPI * M_SQRT1_2);  // sqrt(2/pi)
  return x / (1.0f + std::exp(-2.0f * k * (x + 0.044715f * x * x * x)));
}

float SiluScalar(float x) { return x / (1.0f + std::exp(-x)); }

float SigmoidScalar(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void SoftmaxRowScalar(float* row, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, row[i]);
  // An all -inf row gives NaN, as in PyTorch (exp(-inf - -inf)).
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    row[i] = std::exp(row[i] - max);
    sum += row[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) row[i] *= inv;
}

#if MODELSTATE_VECTOR_MATH_X86
#define MODELSTATE_AVX2_FMA __attribute__((target("avx2,fma")))

// The polynomial coefficients below were fitted for this file by weighted
// least squares on Chebyshev nodes against 30-digit references (mpmath).

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two so n ln2 is
// exact), exp(r) = 1 + r + r^2 q(r) with q of degree 4 (relative error
// 4e-9 before rounding), times 2^n built in the exponent bits. The clamp
// to [-104, 89] keeps n in [-150, 128]; 2^n is applied as two factors so
// that both are normal floats, which makes the result round correctly into
// the subnormals and overflow to +inf past 88.72. exp(-inf) is exactly 0,
// and NaN passes through the clamp (max/min return their second operand
// when either is NaN).
MODELSTATE_AVX2_FMA inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(89.0f),
                    _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 q = _mm256_set1_ps(0.00137514079f);
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.00836891634f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.0416695331f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.166665185f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.499999886f));
  const __m256 p = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r),
                                 _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 scale2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale1), scale2);
}

// 1 + erf(x / sqrt 2) without cancellation for negative x; z = x / sqrt 2:
//  - |z| < 0.5: 1 + z P(z^2), P of degree 5 (relative error 4e-8 in erf);
//  - |z| >= 0.5: erfc(|z|) = exp(-z^2) R(t), t = 1 / (1 + |z| / 2), R of
//    degree 8 fitted on [0.5, 10] (relative error 5e-8, 3e-7 once rounded
//    in float), giving 2 - erfc for z > 0 and erfc itself for z < 0. Past
//    |z| = 10 erfc is below float's range and is taken as 0, which also
//    makes gelu(-inf) = -inf * 0 = NaN as in PyTorch. exp(-z^2) is taken
//    from x^2 / 2 split into a rounded square and its exact rounding error
//    (an FMA), because the rounding of z and of z^2 would cost a relative
//    error of z^2 * 2^-23 (1e-6 at z = 2.5) in erfc.
MODELSTATE_AVX2_FMA inline __m256 OnePlusErfOfScaled8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.707106781f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
  const __m256 z2 = _mm256_mul_ps(z, z);
  __m256 p = _mm256_set1_ps(-0.000566799519f);
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(0.00492741985f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-0.0267208936f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(0.112805789f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-0.376123907f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(1.12837915f));
  const __m256 near_zero = _mm256_fmadd_ps(z, p, one);

  // NaN passes through the min (second operand) and on to the result.
  const __m256 limit = _mm256_set1_ps(10.0f);
  const __m256 ac = _mm256_min_ps(limit, a);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(ac, half, one));
  __m256 rt = _mm256_set1_ps(0.0411714447f);
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(-0.0536528589f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(-0.159455013f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(0.248713044f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(0.0907632782f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(0.272458977f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(0.277589945f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(0.282525967f));
  rt = _mm256_fmadd_ps(rt, t, _mm256_set1_ps(-1.73200157e-05f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 x2_error = _mm256_fmsub_ps(x, x, x2);  // x^2 - x2, exactly
  const __m256 gauss =
      _mm256_mul_ps(Exp8(_mm256_mul_ps(_mm256_set1_ps(-0.5f), x2)),
                    _mm256_fnmadd_ps(half, x2_error, one));
  __m256 erfc = _mm256_mul_ps(gauss, rt);
  erfc = _mm256_andnot_ps(_mm256_cmp_ps(a, limit, _CMP_GT_OQ), erfc);
  const __m256 negative = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 far = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), erfc),
                                      erfc, negative);
  return _mm256_blendv_ps(far, near_zero,
                          _mm256_cmp_ps(a, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
}

MODELSTATE_AVX2_FMA inline __m256 GeluErf8(__m256 x) {
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                       OnePlusErfOfScaled8(x));
}

// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)).
MODELSTATE_AVX2_FMA inline __m256 GeluTanh8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u =
      _mm256_mul_ps(_mm256_set1_ps(0.797884561f),
                    _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  const __m256 e = Exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

MODELSTATE_AVX2_FMA inline __m256 Silu8(__m256 x) {
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

MODELSTATE_AVX2_FMA inline __m256 Sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

// All ones in the first `count` (< 8) lanes.
MODELSTATE_AVX2_FMA inline __m256i TailMask(int64_t count) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lanes);
}

template <__m256 (*kFn)(__m256)>
MODELSTATE_AVX2_FMA void MapAvx2(float* data, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(data + i, kFn(_mm256_loadu_ps(data + i)));
  }
  if (i < n) {
    const __m256i mask = TailMask(n - i);
    _mm256_maskstore_ps(data + i, mask,
                        kFn(_mm256_maskload_ps(data + i, mask)));
  }
}

MODELSTATE_AVX2_FMA float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

MODELSTATE_AVX2_FMA float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

MODELSTATE_AVX2_FMA void SoftmaxRowAvx2(float* row, int64_t n) {
  const __m256 neg_inf =
      _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t full = n / 8 * 8;
  const __m256i tail = TailMask(n - full);
  // A NaN may or may not survive max_ps (it keeps its second operand's
  // NaN only); either way exp(NaN - max) makes the sum and so the whole row
  // NaN, as in PyTorch. So does a maximum of -inf (all -inf: -inf - -inf)
  // or +inf (inf - inf).
  __m256 max = neg_inf;
  for (int64_t i = 0; i < full; i += 8) {
    max = _mm256_max_ps(max, _mm256_loadu_ps(row + i));
  }
  if (full < n) {
    max = _mm256_max_ps(
        max, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(row + full, tail),
                              _mm256_castsi256_ps(tail)));
  }
  const float max_value = HorizontalMax(max);
  const __m256 shift = _mm256_set1_ps(max_value);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < full; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), shift));
    _mm256_storeu_ps(row + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (full < n) {
    __m256 e = Exp8(_mm256_sub_ps(_mm256_maskload_ps(row + full, tail), shift));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(row + full, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / HorizontalSum(sum));
  for (int64_t i = 0; i < full; i += 8) {
    _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), inv));
  }
  if (full < n) {
    _mm256_maskstore_ps(
        row + full, tail,
        _mm256_mul_ps(_mm256_maskload_ps(row + full, tail), inv));
  }
}

MODELSTATE_AVX2_FMA float MaxAbsAvx2(const float* data, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 max = _mm256_setzero_ps();
  // max_ps drops a NaN in its first operand: track NaN apart.
  __m256 nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = i + 8 <= n ? _mm256_loadu_ps(data + i)
                                : _mm256_maskload_ps(data + i, TailMask(n - i));
    max = _mm256_max_ps(max, _mm256_andnot_ps(sign, v));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan) != 0) {
    return std::numeric_limits<float>::infinity();
  }
  return HorizontalMax(max);
}

#undef MODELSTATE_AVX2_FMA

bool CpuHasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
bool CpuHasAvx2Fma() { return false; }
#endif  // MODELSTATE_VECTOR_MATH_X86

template <float (*kFn)(float)>
void MapScalar(float* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] = kFn(data[i]);
}

float ExpScalar(float x) { return std::exp(x); }

float MaxAbsScalar(const float* data, int64_t n) {
  float max = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(data[i])) return std::numeric_limits<float>::infinity();
    max = std::max(max, std::abs(data[i]));
  }
  return max;
}

}  // namespace

bool VectorMathUsesAvx2() { return CpuHasAvx2Fma(); }

#if MODELSTATE_VECTOR_MATH_X86
#define MODELSTATE_DISPATCH(avx2, scalar) \
  if (CpuHasAvx2Fma()) {                  \
    avx2;                                 \
  } else {                                \
    scalar;                               \
  }
#else
#define MODELSTATE_DISPATCH(avx2, scalar) scalar
#endif

void GeluErfInPlace(float* data, int64_t n) {
  MODELSTATE_DISPATCH(MapAvx2<GeluErf8>(data, n),
                      MapScalar<GeluErfScalar>(data, n));
}

void GeluTanhInPlace(float* data, int64_t n) {
  MODELSTATE_DISPATCH(MapAvx2<GeluTanh8>(data, n),
                      MapScalar<GeluTanhScalar>(data, n));
}

void SiluInPlace(float* data, int64_t n) {
  MODELSTATE_DISPATCH(MapAvx2<Silu8>(data, n), MapScalar<SiluScalar>(data, n));
}

void SigmoidInPlace(float* data, int64_t n) {
  MODELSTATE_DISPATCH(MapAvx2<Sigmoid8>(data, n),
                      MapScalar<SigmoidScalar>(data, n));
}

void SoftmaxRowInPlace(float* row, int64_t n) {
  MODELSTATE_DISPATCH(SoftmaxRowAvx2(row, n), SoftmaxRowScalar(row, n));
}

float MaxAbs(const float* data, int64_t n) {
  MODELSTATE_DISPATCH(return MaxAbsAvx2(data, n), return MaxAbsScalar(data, n));
}

void ExpInPlace(float* data, int64_t n) {
  MODELSTATE_DISPATCH(MapAvx2<Exp8>(data, n), MapScalar<ExpScalar>(data, n));
}

#undef MODELSTATE_DISPATCH

}  // namespace modelstate::internal
