// File: generator.cc
// Reproduces PyTorch 1.13's CPU random numbers bit for bit. Every step below
// mirrors one piece of ATen (named in the comments); the facts that are not
// visible in ATen's source were measured against torch 1.13 on x86-64:
//  - x86-64 builds run the AVX2 copies of the distribution kernels (also when
//    the CPU has AVX-512: normal_ has no AVX-512 kernel and uniform_ gives the
//    same values). Those copies are compiled with FMA enabled and the compiler
//    fuses `a * b + c` into one rounding, so several steps below use std::fma
//    where ATen's source shows a multiply and an add.
//  - at::uniform_real_distribution<float> accumulates in float, not double.
//  - at::normal_distribution<double> uses log(1 - u), not log1p(-u).
//  - Float16 kernels compute in float; BFloat16 ones call c10's BFloat16 math
//    overloads, which round every intermediate to bfloat16.
// tests/core/make_generator_vectors.py records the reference values.
#include "core/generator.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "base/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MODELSTATE_GENERATOR_X86 1
#else
#define MODELSTATE_GENERATOR_X86 0
#endif

namespace modelstate {
namespace generator_internal {
namespace {
std::atomic<bool> force_portable_kernels{false};
}  // namespace

void ForcePortableKernelsForTesting(bool force) {
  force_portable_kernels.store(force, std::memory_order_relaxed);
}
}  // namespace generator_internal

namespace {

// at::mt19937's constants.
constexpr int kN = 624;
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
constexpr uint32_t kTemperB = 0x9d2c5680u;
constexpr uint32_t kTemperC = 0xefc60000u;

// c10::pi<double>.
constexpr double kPi = std::numbers::pi;

// ATen's normal_fill works on blocks of 16: 8 values of u1 followed by the 8
// matching values of u2.
constexpr int64_t kNormalBlock = 16;
// How many 16-blocks the fused "draw uniforms, then transform" loop handles
// at a time; small enough to stay in L1.
constexpr int64_t kBlocksPerChunk = 128;

// ---------------------------------------------------------------------------
// Scalar building blocks.

// at::mt19937_engine::twist: the upper bit of `cur`, the lower 31 of `next`.
inline uint32_t Twist(uint32_t cur, uint32_t next) {
  const uint32_t mixed = (cur & kUpperMask) | (next & kLowerMask);
  return (mixed >> 1) ^ ((next & 1u) != 0 ? kMatrixA : 0u);
}

// at::mt19937_engine::operator()'s tempering.
inline uint32_t Temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & kTemperB;
  y ^= (y << 15) & kTemperC;
  y ^= y >> 18;
  return y;
}

// at::uniform_real_distribution<double>: random64() masked to 53 bits.
inline double UnitDouble(uint64_t bits) {
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

inline uint64_t Pack64(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// c10::Half(float): round to nearest even; NaN becomes 0x7E00 with the sign.
uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  // 65520 (0x477ff000) is halfway between 65504 and 2^16 and ties to even,
  // i.e. to infinity.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    // Below 2^-14: a half subnormal, in units of 2^-24.
    const uint32_t exponent = abs >> 23;
    const uint32_t shift = 126 - exponent;  // >= 14
    if (shift > 24) return sign;            // below 2^-25: rounds to zero
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half_unit = 1u << (shift - 1);
    if (rest > half_unit || (rest == half_unit && (q & 1u) != 0)) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: drop 13 mantissa bits with round to nearest even (a carry may
  // run into the exponent, which is right), then rebias 127 -> 15.
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

// c10::BFloat16(float): round to nearest even; NaN becomes 0x7FC0.
uint16_t FloatToBFloat16(float value) {
  if (std::isnan(value)) return 0x7fc0u;
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float BFloat16ToFloat(uint16_t bf16) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
}

// The reduced type of a FillUniformReduced / FillNormalReduced call.
struct Reduced {
  bool bfloat16;

  uint16_t Round(float value) const {
    return bfloat16 ? FloatToBFloat16(value) : FloatToHalf(value);
  }
  float Widen(uint16_t bits) const {
    return bfloat16 ? BFloat16ToFloat(bits) : HalfToFloat(bits);
  }
  // The value of `value` once stored in the reduced type.
  float RoundTrip(float value) const { return Widen(Round(value)); }
  // static_cast<c10::Half>(double) and the BFloat16 one go through float.
  float RoundTrip(double value) const {
    return RoundTrip(static_cast<float>(value));
  }
  // std::numeric_limits<T>::digits, the bits uniform_real keeps.
  int Digits() const { return bfloat16 ? 8 : 11; }
};

// ---------------------------------------------------------------------------
// Portable kernels. They give the same bits as the AVX2 ones below.

// at::mt19937_engine::next_state, then the tempering of each new word.
void TwistAndTemperPortable(uint32_t* state, uint32_t* out) {
  for (int i = 0; i < kN - kM; ++i) {
    state[i] = state[i + kM] ^ Twist(state[i], state[i + 1]);
  }
  for (int i = kN - kM; i < kN - 1; ++i) {
    state[i] = state[i + kM - kN] ^ Twist(state[i], state[i + 1]);
  }
  state[kN - 1] = state[kM - 1] ^ Twist(state[kN - 1], state[0]);
  for (int i = 0; i < kN; ++i) out[i] = Temper(state[i]);
}

// transformation::uniform_real<float> on 32-bit draws: 24 bits scaled to
// [0, 1), then x * (to - from) + from with one rounding (ATen's AVX2 build
// fuses it).
void UniformFloatPortable(const uint32_t* words, int64_t count, float range,
                          float from, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = static_cast<float>(words[i] & 0xffffffu) * 0x1p-24f;
    out[i] = std::fma(x, range, from);
  }
}

// One lane of log256_ps from ATen's avx_mathfun.h (Cephes' logf), with the
// multiply-adds fused as the AVX2 build fuses them. Only for x in
// [2^-24, 1], so the clamping of denormals and the NaN for x <= 0 that the
// original has are left out.
float CephesLogPortable(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int32_t exponent = static_cast<int32_t>(bits >> 23) - 0x7f;
  // Mantissa scaled into [0.5, 1).
  float m = std::bit_cast<float>((bits & ~0x7f800000u) | 0x3f000000u);
  float e = static_cast<float>(exponent) + 1.0f;
  const bool small = m < 0.707106781186547524f;
  const float tmp = small ? m : 0.0f;
  m = m - 1.0f;
  e = e - (small ? 1.0f : 0.0f);
  m = m + tmp;
  const float z = m * m;
  float y = 7.0376836292E-2f;
  y = std::fma(y, m, -1.1514610310E-1f);
  y = std::fma(y, m, 1.1676998740E-1f);
  y = std::fma(y, m, -1.2420140846E-1f);
  y = std::fma(y, m, 1.4249322787E-1f);
  y = std::fma(y, m, -1.6668057665E-1f);
  y = std::fma(y, m, 2.0000714765E-1f);
  y = std::fma(y, m, -2.4999993993E-1f);
  y = std::fma(y, m, 3.3333331174E-1f);
  y = y * m;
  y = std::fma(y, z, e * -2.12194440e-4f);
  y = std::fma(-z, 0.5f, y);
  return std::fma(e, 0.693359375f, m + y);
}

// One lane of sincos256_ps from ATen's avx_mathfun.h (Cephes' sinf/cosf),
// fused as the AVX2 build fuses it. Valid for |x| < 8192; here x < 2*pi.
void CephesSinCosPortable(float x, float* sin_out, float* cos_out) {
  uint32_t sign_sin = std::bit_cast<uint32_t>(x) & 0x80000000u;
  x = std::fabs(x);
  // Octant j, rounded up to even; y = j as a float.
  int32_t j = static_cast<int32_t>(x * 1.27323954473516f);
  j = (j + 1) & ~1;
  const float y = static_cast<float>(j);
  const uint32_t swap_sin = static_cast<uint32_t>(j & 4) << 29;
  const bool sin_uses_sin_poly = (j & 2) == 0;
  // Extended-precision reduction x - y * pi/4 in three pieces.
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  const uint32_t sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
  sign_sin ^= swap_sin;
  const float z = x * x;
  // Cosine polynomial.
  float yc = std::fma(2.443315711809948E-005f, z, -1.388731625493765E-003f);
  yc = std::fma(yc, z, 4.166664568298827E-002f);
  yc = yc * z;
  yc = std::fma(yc, z, -(z * 0.5f));
  yc = yc + 1.0f;
  // Sine polynomial.
  float ys = std::fma(-1.9515295891E-4f, z, 8.3321608736E-3f);
  ys = std::fma(ys, z, -1.6666654611E-1f);
  ys = ys * z;
  ys = std::fma(ys, x, x);
  // The original selects with masks, subtractions and additions; doing the
  // same arithmetic keeps the signs of zeros identical.
  const float sin_from_ys = sin_uses_sin_poly ? ys : 0.0f;
  const float sin_from_yc = sin_uses_sin_poly ? 0.0f : yc;
  ys = ys - sin_from_ys;
  yc = yc - sin_from_yc;
  *sin_out = std::bit_cast<float>(
      std::bit_cast<uint32_t>(sin_from_yc + sin_from_ys) ^ sign_sin);
  *cos_out = std::bit_cast<float>(std::bit_cast<uint32_t>(yc + ys) ^ sign_cos);
}

// normal_fill_16_AVX2 on `blocks` consecutive 16-blocks of uniforms.
void NormalBlocksFloatPortable(float* data, int64_t blocks, float mean,
                               float std) {
  const float two_pi = static_cast<float>(2.0 * kPi);
  for (int64_t b = 0; b < blocks; ++b) {
    float* block = data + b * kNormalBlock;
    for (int j = 0; j < 8; ++j) {
      const float u1 = 1.0f - block[j];  // [0, 1) -> (0, 1] for the log
      const float u2 = block[j + 8];
      const float radius = std::sqrt(-2.0f * CephesLogPortable(u1));
      float sin_theta;
      float cos_theta;
      CephesSinCosPortable(two_pi * u2, &sin_theta, &cos_theta);
      block[j] = std::fma(radius * cos_theta, std, mean);
      block[j + 8] = std::fma(radius * sin_theta, std, mean);
    }
  }
}

// ---------------------------------------------------------------------------
// AVX2 + FMA kernels: the same arithmetic, eight lanes at a time.

#if MODELSTATE_GENERATOR_X86
#define MODELSTATE_AVX2 __attribute__((target("avx2,fma")))

MODELSTATE_AVX2 inline __m256i TwistAvx2(__m256i cur, __m256i next,
                                         __m256i far) {
  const __m256i mixed =
      _mm256_or_si256(_mm256_and_si256(cur, _mm256_set1_epi32(kUpperMask)),
                      _mm256_and_si256(next, _mm256_set1_epi32(kLowerMask)));
  // All ones where next's low bit is set.
  const __m256i odd = _mm256_srai_epi32(_mm256_slli_epi32(next, 31), 31);
  const __m256i magic =
      _mm256_and_si256(odd, _mm256_set1_epi32(static_cast<int32_t>(kMatrixA)));
  return _mm256_xor_si256(far,
                          _mm256_xor_si256(_mm256_srli_epi32(mixed, 1), magic));
}

MODELSTATE_AVX2 inline __m256i LoadWords(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

MODELSTATE_AVX2 inline void StoreWords(uint32_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// next_state in vectors of 8. Word i depends on words i + 1 and i + 397
// (old) or i - 227 (already new), never on a word less than 8 away, so each
// vector only reads values that are final for it.
MODELSTATE_AVX2 void TwistAndTemperAvx2(uint32_t* state, uint32_t* out) {
  int i = 0;
  for (; i + 8 <= kN - kM; i += 8) {
    StoreWords(state + i,
               TwistAvx2(LoadWords(state + i), LoadWords(state + i + 1),
                         LoadWords(state + i + kM)));
  }
  for (; i < kN - kM; ++i) {
    state[i] = state[i + kM] ^ Twist(state[i], state[i + 1]);
  }
  for (; i + 8 <= kN - 1; i += 8) {
    StoreWords(state + i,
               TwistAvx2(LoadWords(state + i), LoadWords(state + i + 1),
                         LoadWords(state + i + kM - kN)));
  }
  for (; i < kN - 1; ++i) {
    state[i] = state[i + kM - kN] ^ Twist(state[i], state[i + 1]);
  }
  state[kN - 1] = state[kM - 1] ^ Twist(state[kN - 1], state[0]);

  const __m256i temper_b = _mm256_set1_epi32(static_cast<int32_t>(kTemperB));
  const __m256i temper_c = _mm256_set1_epi32(static_cast<int32_t>(kTemperC));
  static_assert(kN % 8 == 0);
  for (i = 0; i < kN; i += 8) {
    __m256i y = LoadWords(state + i);
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 11));
    y = _mm256_xor_si256(y,
                         _mm256_and_si256(_mm256_slli_epi32(y, 7), temper_b));
    y = _mm256_xor_si256(y,
                         _mm256_and_si256(_mm256_slli_epi32(y, 15), temper_c));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 18));
    StoreWords(out + i, y);
  }
}

MODELSTATE_AVX2 void UniformFloatAvx2(const uint32_t* words, int64_t count,
                                      float range, float from, float* out) {
  const __m256i mask = _mm256_set1_epi32(0xffffff);
  const __m256 scale = _mm256_set1_ps(0x1p-24f);
  const __m256 range_v = _mm256_set1_ps(range);
  const __m256 from_v = _mm256_set1_ps(from);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // 24-bit integers convert exactly.
    const __m256 x = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(LoadWords(words + i), mask)),
        scale);
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(x, range_v, from_v));
  }
  for (; i < count; ++i) {
    const float x = static_cast<float>(words[i] & 0xffffffu) * 0x1p-24f;
    out[i] = std::fma(x, range, from);
  }
}

// Eight lanes of CephesLogPortable (log256_ps).
MODELSTATE_AVX2 inline __m256 CephesLogAvx2(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256i exponent = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_castps_si256(x), 23), _mm256_set1_epi32(0x7f));
  __m256 m = _mm256_or_ps(
      _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(~0x7f800000))),
      _mm256_set1_ps(0.5f));
  __m256 e = _mm256_add_ps(_mm256_cvtepi32_ps(exponent), one);
  const __m256 small =
      _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OS);
  const __m256 tmp = _mm256_and_ps(m, small);
  m = _mm256_sub_ps(m, one);
  e = _mm256_sub_ps(e, _mm256_and_ps(one, small));
  m = _mm256_add_ps(m, tmp);
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 y = _mm256_set1_ps(7.0376836292E-2f);
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.1514610310E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.1676998740E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.2420140846E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.4249322787E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.6668057665E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(2.0000714765E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-2.4999993993E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(3.3333331174E-1f));
  y = _mm256_mul_ps(y, m);
  y = _mm256_fmadd_ps(y, z, _mm256_mul_ps(e, _mm256_set1_ps(-2.12194440e-4f)));
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(m, y));
}

// Eight lanes of CephesSinCosPortable (sincos256_ps).
MODELSTATE_AVX2 inline void CephesSinCosAvx2(__m256 x, __m256* sin_out,
                                             __m256* cos_out) {
  const __m256 sign_mask =
      _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(0x80000000u)));
  const __m256i two = _mm256_set1_epi32(2);
  const __m256i four = _mm256_set1_epi32(4);
  __m256 sign_sin = _mm256_and_ps(x, sign_mask);
  x = _mm256_andnot_ps(sign_mask, x);
  __m256i j =
      _mm256_cvttps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(1.27323954473516f)));
  j = _mm256_and_si256(_mm256_add_epi32(j, _mm256_set1_epi32(1)),
                       _mm256_set1_epi32(~1));
  const __m256 y = _mm256_cvtepi32_ps(j);
  const __m256 swap_sin =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(j, four), 29));
  const __m256 sin_uses_sin_poly = _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(j, two), _mm256_setzero_si256()));
  x = _mm256_fmadd_ps(y, _mm256_set1_ps(-0.78515625f), x);
  x = _mm256_fmadd_ps(y, _mm256_set1_ps(-2.4187564849853515625e-4f), x);
  x = _mm256_fmadd_ps(y, _mm256_set1_ps(-3.77489497744594108e-8f), x);
  const __m256 sign_cos = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_andnot_si256(_mm256_sub_epi32(j, two), four), 29));
  sign_sin = _mm256_xor_ps(sign_sin, swap_sin);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 yc = _mm256_fmadd_ps(_mm256_set1_ps(2.443315711809948E-005f), z,
                              _mm256_set1_ps(-1.388731625493765E-003f));
  yc = _mm256_fmadd_ps(yc, z, _mm256_set1_ps(4.166664568298827E-002f));
  yc = _mm256_mul_ps(yc, z);
  yc = _mm256_fmsub_ps(yc, z, _mm256_mul_ps(z, _mm256_set1_ps(0.5f)));
  yc = _mm256_add_ps(yc, _mm256_set1_ps(1.0f));
  __m256 ys = _mm256_fmadd_ps(_mm256_set1_ps(-1.9515295891E-4f), z,
                              _mm256_set1_ps(8.3321608736E-3f));
  ys = _mm256_fmadd_ps(ys, z, _mm256_set1_ps(-1.6666654611E-1f));
  ys = _mm256_mul_ps(ys, z);
  ys = _mm256_fmadd_ps(ys, x, x);
  const __m256 sin_from_ys = _mm256_and_ps(sin_uses_sin_poly, ys);
  const __m256 sin_from_yc = _mm256_andnot_ps(sin_uses_sin_poly, yc);
  ys = _mm256_sub_ps(ys, sin_from_ys);
  yc = _mm256_sub_ps(yc, sin_from_yc);
  *sin_out = _mm256_xor_ps(_mm256_add_ps(sin_from_yc, sin_from_ys), sign_sin);
  *cos_out = _mm256_xor_ps(_mm256_add_ps(yc, ys), sign_cos);
}

// normal_fill_16_AVX2.
MODELSTATE_AVX2 void NormalBlocksFloatAvx2(float* data, int64_t blocks,
                                           float mean, float std) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_two = _mm256_set1_ps(-2.0f);
  const __m256 two_pi = _mm256_set1_ps(static_cast<float>(2.0 * kPi));
  const __m256 mean_v = _mm256_set1_ps(mean);
  const __m256 std_v = _mm256_set1_ps(std);
  for (int64_t b = 0; b < blocks; ++b) {
    float* block = data + b * kNormalBlock;
    const __m256 u1 = _mm256_sub_ps(one, _mm256_loadu_ps(block));
    const __m256 u2 = _mm256_loadu_ps(block + 8);
    const __m256 radius =
        _mm256_sqrt_ps(_mm256_mul_ps(minus_two, CephesLogAvx2(u1)));
    __m256 sin_theta;
    __m256 cos_theta;
    CephesSinCosAvx2(_mm256_mul_ps(two_pi, u2), &sin_theta, &cos_theta);
    _mm256_storeu_ps(block, _mm256_fmadd_ps(_mm256_mul_ps(radius, cos_theta),
                                            std_v, mean_v));
    _mm256_storeu_ps(
        block + 8,
        _mm256_fmadd_ps(_mm256_mul_ps(radius, sin_theta), std_v, mean_v));
  }
}

#undef MODELSTATE_AVX2

bool CpuHasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif  // MODELSTATE_GENERATOR_X86

bool UseAvx2() {
#if MODELSTATE_GENERATOR_X86
  return CpuHasAvx2Fma() && !generator_internal::force_portable_kernels.load(
                                std::memory_order_relaxed);
#else
  return false;
#endif
}

void TwistAndTemper(uint32_t* state, uint32_t* out) {
#if MODELSTATE_GENERATOR_X86
  if (UseAvx2()) return TwistAndTemperAvx2(state, out);
#endif
  TwistAndTemperPortable(state, out);
}

void UniformFloatWords(const uint32_t* words, int64_t count, float range,
                       float from, float* out) {
#if MODELSTATE_GENERATOR_X86
  if (UseAvx2()) return UniformFloatAvx2(words, count, range, from, out);
#endif
  UniformFloatPortable(words, count, range, from, out);
}

void NormalBlocksFloat(float* data, int64_t blocks, float mean, float std) {
#if MODELSTATE_GENERATOR_X86
  if (UseAvx2()) return NormalBlocksFloatAvx2(data, blocks, mean, std);
#endif
  NormalBlocksFloatPortable(data, blocks, mean, std);
}

// normal_fill_16<double>.
void NormalBlocksDouble(double* data, int64_t blocks, double mean, double std) {
  for (int64_t b = 0; b < blocks; ++b) {
    double* block = data + b * kNormalBlock;
    for (int j = 0; j < 8; ++j) {
      const double u1 = 1.0 - block[j];
      const double u2 = block[j + 8];
      const double radius = std::sqrt(-2.0 * std::log(u1));
      // ATen writes 2.0f * pi<double>: a double product.
      const double theta = 2.0 * kPi * u2;
      block[j] = std::fma(radius * std::cos(theta), std, mean);
      block[j + 8] = std::fma(radius * std::sin(theta), std, mean);
    }
  }
}

// normal_fill_16<c10::Half>: stored values are halves, the math is float
// (c10 has no Half overloads of log/sqrt/sin/cos), and the final
// `radius * cos(theta) * std + mean` is fused.
void NormalBlocksHalf(uint16_t* data, int64_t blocks, float mean, float std) {
  const Reduced half{false};
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t* block = data + b * kNormalBlock;
    for (int j = 0; j < 8; ++j) {
      const float u1 = half.RoundTrip(1.0f - half.Widen(block[j]));
      const float u2 = half.Widen(block[j + 8]);
      const float radius = half.RoundTrip(std::sqrt(-2.0f * std::log(u1)));
      const float theta = half.RoundTrip(2.0 * kPi * static_cast<double>(u2));
      block[j] = half.Round(std::fma(radius * std::cos(theta), std, mean));
      block[j + 8] = half.Round(std::fma(radius * std::sin(theta), std, mean));
    }
  }
}

// normal_fill_16<c10::BFloat16>: c10's BFloat16 log/sqrt/sin/cos and
// operators all return BFloat16, so every step rounds to bfloat16.
void NormalBlocksBFloat16(uint16_t* data, int64_t blocks, float mean,
                          float std) {
  const Reduced bf16{true};
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t* block = data + b * kNormalBlock;
    for (int j = 0; j < 8; ++j) {
      const float u1 = bf16.RoundTrip(1.0f - bf16.Widen(block[j]));
      const float u2 = bf16.Widen(block[j + 8]);
      const float log_u1 = bf16.RoundTrip(std::log(u1));
      const float radius =
          bf16.RoundTrip(std::sqrt(bf16.RoundTrip(-2.0f * log_u1)));
      const float theta = bf16.RoundTrip(2.0 * kPi * static_cast<double>(u2));
      const float cos_theta = bf16.RoundTrip(std::cos(theta));
      const float sin_theta = bf16.RoundTrip(std::sin(theta));
      block[j] = bf16.Round(
          bf16.RoundTrip(bf16.RoundTrip(radius * cos_theta) * std) + mean);
      block[j + 8] = bf16.Round(
          bf16.RoundTrip(bf16.RoundTrip(radius * sin_theta) * std) + mean);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------

// at::mt19937_engine::init_with_uint32 (the seed is truncated to 32 bits).
// The first draw runs next_state, as ATen's left_ = 1 does.
Generator::Generator(uint64_t seed) : output_{}, index_(kN) {
  static_assert(kStateSize == kN);
  state_[0] = static_cast<uint32_t>(seed);
  for (int j = 1; j < kN; ++j) {
    state_[j] = 1812433253u * (state_[j - 1] ^ (state_[j - 1] >> 30)) +
                static_cast<uint32_t>(j);
  }
}

void Generator::Refill() {
  TwistAndTemper(state_, output_);
  index_ = 0;
}

uint32_t Generator::Random() {
  if (index_ == kN) Refill();
  return output_[index_++];
}

// CPUGeneratorImpl::random64: the first draw is the high half.
uint64_t Generator::Random64() {
  const uint32_t hi = Random();
  const uint32_t lo = Random();
  return Pack64(hi, lo);
}

void Generator::Discard(int64_t count) {
  while (count > 0) {
    if (index_ == kN) Refill();
    const int64_t step = std::min<int64_t>(count, kN - index_);
    index_ += static_cast<int>(step);
    count -= step;
  }
}

// at::normal_distribution<double>::operator() without the final
// `* std + mean`, which callers apply (fused, as ATen's AVX2 build does).
double Generator::NextStandardNormal() {
  if (next_double_normal_.has_value()) {
    const double cached = *next_double_normal_;
    next_double_normal_.reset();
    return cached;
  }
  const double u1 = UnitDouble(Random64());
  const double u2 = UnitDouble(Random64());
  const double radius = std::sqrt(-2.0 * std::log(1.0 - u2));
  const double theta = 2.0 * kPi * u1;
  next_double_normal_ = radius * std::sin(theta);
  return radius * std::cos(theta);
}

void Generator::FillUniform(DType dtype, void* data, int64_t count, double from,
                            double to) {
  switch (dtype) {
    case DType::kFloat32:
      return FillUniformFloat(static_cast<float*>(data), count, from, to);
    case DType::kFloat64:
      return FillUniformDouble(static_cast<double*>(data), count, from, to);
    case DType::kFloat16:
    case DType::kBFloat16:
      return FillUniformReduced(dtype, static_cast<uint16_t*>(data), count,
                                from, to);
    default:
      MODELSTATE_CHECK(false) << "FillUniform needs a floating dtype, got #"
                              << static_cast<int>(dtype);
  }
}

void Generator::FillNormal(DType dtype, void* data, int64_t count, double mean,
                           double std) {
  switch (dtype) {
    case DType::kFloat32:
      return FillNormalFloat(static_cast<float*>(data), count, mean, std);
    case DType::kFloat64:
      return FillNormalDouble(static_cast<double*>(data), count, mean, std);
    case DType::kFloat16:
    case DType::kBFloat16:
      return FillNormalReduced(dtype, static_cast<uint16_t*>(data), count, mean,
                               std);
    default:
      MODELSTATE_CHECK(false) << "FillNormal needs a floating dtype, got #"
                              << static_cast<int>(dtype);
  }
}

// uniform_kernel for float: from and to are cast to float first, and
// to - from is a float subtraction.
void Generator::FillUniformFloat(float* data, int64_t count, double from,
                                 double to) {
  const float from_f = static_cast<float>(from);
  const float range = static_cast<float>(to) - from_f;
  int64_t done = 0;
  while (done < count) {
    if (index_ == kN) Refill();
    const int64_t n = std::min<int64_t>(kN - index_, count - done);
    UniformFloatWords(output_ + index_, n, range, from_f, data + done);
    index_ += static_cast<int>(n);
    done += n;
  }
}

// uniform_kernel for double: one random64() per element.
void Generator::FillUniformDouble(double* data, int64_t count, double from,
                                  double to) {
  const double range = to - from;
  int64_t done = 0;
  while (done < count) {
    if (index_ == kN) Refill();
    const int64_t pairs = std::min<int64_t>((kN - index_) / 2, count - done);
    if (pairs == 0) {
      // One word left in this block: the value straddles two blocks.
      data[done++] = std::fma(UnitDouble(Random64()), range, from);
      continue;
    }
    const uint32_t* words = output_ + index_;
    for (int64_t i = 0; i < pairs; ++i) {
      const uint64_t bits = Pack64(words[2 * i], words[2 * i + 1]);
      data[done + i] = std::fma(UnitDouble(bits), range, from);
    }
    index_ += static_cast<int>(2 * pairs);
    done += pairs;
  }
}

// uniform_kernel for Half/BFloat16: from, to and to - from are rounded to
// the type, uniform_real keeps `digits` bits of a 32-bit draw, and
// x * (to - from) + from is float math (the product is exact, so whether
// it is fused does not matter) rounded once more on store.
void Generator::FillUniformReduced(DType dtype, uint16_t* data, int64_t count,
                                   double from, double to) {
  const Reduced type{dtype == DType::kBFloat16};
  const float from_r = type.RoundTrip(from);
  const float range = type.RoundTrip(type.RoundTrip(to) - from_r);
  const uint32_t mask = (1u << type.Digits()) - 1;
  const float scale = 1.0f / static_cast<float>(1u << type.Digits());
  for (int64_t i = 0; i < count; ++i) {
    const float x = static_cast<float>(Random() & mask) * scale;
    data[i] = type.Round(x * range + from_r);
  }
}

// normal_kernel for float: below 16 elements the serial
// normal_distribution<double> path, else normal_fill_AVX2. ATen first fills
// the whole tensor with uniforms and then transforms it block by block; the
// draws and the arithmetic are the same when each chunk is drawn and
// transformed in turn, which keeps the data in cache. When count % 16 != 0,
// ATen draws 16 fresh uniforms for the last 16 elements and transforms them
// again; the uniforms it had drawn for the leftover elements are overwritten.
void Generator::FillNormalFloat(float* data, int64_t count, double mean,
                                double std) {
  if (count < kNormalBlock) {
    for (int64_t i = 0; i < count; ++i) {
      data[i] = static_cast<float>(std::fma(NextStandardNormal(), std, mean));
    }
    return;
  }
  const float mean_f = static_cast<float>(mean);
  const float std_f = static_cast<float>(std);
  const int64_t blocks = count / kNormalBlock;
  for (int64_t b = 0; b < blocks; b += kBlocksPerChunk) {
    const int64_t n = std::min(kBlocksPerChunk, blocks - b);
    float* chunk = data + b * kNormalBlock;
    FillUniformFloat(chunk, n * kNormalBlock, 0.0, 1.0);
    NormalBlocksFloat(chunk, n, mean_f, std_f);
  }
  const int64_t leftover = count % kNormalBlock;
  if (leftover != 0) {
    Discard(leftover);
    float* tail = data + count - kNormalBlock;
    FillUniformFloat(tail, kNormalBlock, 0.0, 1.0);
    NormalBlocksFloat(tail, 1, mean_f, std_f);
  }
}

// normal_kernel for double: as for float, with normal_fill<double> (libm
// log/sqrt/cos/sin in double) instead of the AVX2 code.
void Generator::FillNormalDouble(double* data, int64_t count, double mean,
                                 double std) {
  if (count < kNormalBlock) {
    for (int64_t i = 0; i < count; ++i) {
      data[i] = std::fma(NextStandardNormal(), std, mean);
    }
    return;
  }
  const int64_t blocks = count / kNormalBlock;
  for (int64_t b = 0; b < blocks; b += kBlocksPerChunk) {
    const int64_t n = std::min(kBlocksPerChunk, blocks - b);
    double* chunk = data + b * kNormalBlock;
    FillUniformDouble(chunk, n * kNormalBlock, 0.0, 1.0);
    NormalBlocksDouble(chunk, n, mean, std);
  }
  const int64_t leftover = count % kNormalBlock;
  if (leftover != 0) {
    Discard(2 * leftover);  // one random64() per double
    double* tail = data + count - kNormalBlock;
    FillUniformDouble(tail, kNormalBlock, 0.0, 1.0);
    NormalBlocksDouble(tail, 1, mean, std);
  }
}

// normal_kernel for Half/BFloat16: the serial path casts the double sample
// (through float) to the type; normal_fill works in the type itself with
// mean and std cast to it.
void Generator::FillNormalReduced(DType dtype, uint16_t* data, int64_t count,
                                  double mean, double std) {
  const Reduced type{dtype == DType::kBFloat16};
  if (count < kNormalBlock) {
    for (int64_t i = 0; i < count; ++i) {
      data[i] = type.Round(
          static_cast<float>(std::fma(NextStandardNormal(), std, mean)));
    }
    return;
  }
  const float mean_r = type.RoundTrip(mean);
  const float std_r = type.RoundTrip(std);
  const auto transform = [&](uint16_t* blocks_data, int64_t n) {
    if (type.bfloat16) {
      NormalBlocksBFloat16(blocks_data, n, mean_r, std_r);
    } else {
      NormalBlocksHalf(blocks_data, n, mean_r, std_r);
    }
  };
  const int64_t blocks = count / kNormalBlock;
  for (int64_t b = 0; b < blocks; b += kBlocksPerChunk) {
    const int64_t n = std::min(kBlocksPerChunk, blocks - b);
    uint16_t* chunk = data + b * kNormalBlock;
    FillUniformReduced(dtype, chunk, n * kNormalBlock, 0.0, 1.0);
    transform(chunk, n);
  }
  const int64_t leftover = count % kNormalBlock;
  if (leftover != 0) {
    Discard(leftover);
    uint16_t* tail = data + count - kNormalBlock;
    FillUniformReduced(dtype, tail, kNormalBlock, 0.0, 1.0);
    transform(tail, 1);
  }
}

}  // namespace modelstate
