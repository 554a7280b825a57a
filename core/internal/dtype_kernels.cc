// File: internal/dtype_kernels.cc
// float32 <-> float16/bfloat16 array kernels. The build targets baseline
// x86-64, so the SIMD kernels carry per-function target attributes and are
// only called after a run-time CPU check. Every kernel is bit-identical to
// the inline scalar functions in dtype_kernels.h, for every input.
#include "core/internal/dtype_kernels.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace modelstate::internal {

namespace {

// Element access through memcpy: no alignment is assumed, and compilers
// turn each call into one (vectorisable) move.
inline float LoadFloat(const unsigned char* p) {
  float value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}
inline uint16_t LoadBits16(const unsigned char* p) {
  uint16_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}
inline void StoreFloat(unsigned char* p, float value) {
  std::memcpy(p, &value, sizeof(value));
}
inline void StoreBits16(unsigned char* p, uint16_t value) {
  std::memcpy(p, &value, sizeof(value));
}

}  // namespace

void FloatToHalfScalar(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    StoreBits16(out + 2 * i, FloatToHalfBitsInline(LoadFloat(in + 4 * i)));
  }
}

void HalfToFloatScalar(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    StoreFloat(out + 4 * i, HalfBitsToFloatInline(LoadBits16(in + 2 * i)));
  }
}

void FloatToBFloat16Scalar(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    StoreBits16(out + 2 * i, FloatToBFloat16BitsInline(LoadFloat(in + 4 * i)));
  }
}

void BFloat16ToFloatScalar(const void* src, void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    StoreFloat(out + 4 * i, BFloat16BitsToFloatInline(LoadBits16(in + 2 * i)));
  }
}

#if defined(__x86_64__)

namespace {

// F16C's vcvtps2ph keeps a NaN's sign and leading payload bits; PyTorch
// writes 0x7E00 | sign. Works on 16-bit lanes of the converted result, so it
// costs four cheap integer ops per 16 elements and needs no repacking of a
// float compare mask. A float16 lane is NaN iff (bits & 0x7FFF) > 0x7C00;
// the signed compare is safe because both sides are below 0x8000.
__attribute__((target("avx2"))) inline __m256i CanonicalizeHalfNaN256(
    __m256i half) {
  const __m256i magnitude_mask = _mm256_set1_epi16(0x7FFF);
  const __m256i infinity = _mm256_set1_epi16(0x7C00);
  const __m256i nan = _mm256_set1_epi16(static_cast<int16_t>(kHalfNaN));
  const __m256i is_nan =
      _mm256_cmpgt_epi16(_mm256_and_si256(half, magnitude_mask), infinity);
  // NaN lanes: keep only the sign, then or in the canonical NaN.
  const __m256i cleared =
      _mm256_andnot_si256(_mm256_and_si256(is_nan, magnitude_mask), half);
  return _mm256_or_si256(cleared, _mm256_and_si256(is_nan, nan));
}

__attribute__((target("avx2"))) inline __m128i CanonicalizeHalfNaN128(
    __m128i half) {
  const __m128i magnitude_mask = _mm_set1_epi16(0x7FFF);
  const __m128i infinity = _mm_set1_epi16(0x7C00);
  const __m128i nan = _mm_set1_epi16(static_cast<int16_t>(kHalfNaN));
  const __m128i is_nan =
      _mm_cmpgt_epi16(_mm_and_si128(half, magnitude_mask), infinity);
  const __m128i cleared =
      _mm_andnot_si128(_mm_and_si128(is_nan, magnitude_mask), half);
  return _mm_or_si128(cleared, _mm_and_si128(is_nan, nan));
}

// Eight floats -> eight bfloat16 in the low 16 bits of each 32-bit lane,
// with c10's rounding (see FloatToBFloat16BitsInline) and NaN -> 0x7FC0.
__attribute__((target("avx2"))) inline __m256i FloatToBFloat16Lanes(
    __m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i nan = _mm256_set1_epi32(kBFloat16NaN);
  const __m256i lowest_kept =
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(bias, lowest_kept)), 16);
  const __m256i is_nan =
      _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

}  // namespace

// The unaligned-load/store intrinsics accept any address; their typed
// pointer parameters are only a formality, hence the casts from bytes.
// 16 elements per iteration (two 8-wide conversions, one 256-bit store),
// then one 8-wide step, then the scalar kernel for the last < 8.
__attribute__((target("avx2,f16c"))) void FloatToHalfF16C(const void* src,
                                                          void* dst,
                                                          int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i low =
        _mm256_cvtps_ph(_mm256_loadu_ps(reinterpret_cast<const float*>(in)),
                        _MM_FROUND_TO_NEAREST_INT);
    const __m128i high = _mm256_cvtps_ph(
        _mm256_loadu_ps(reinterpret_cast<const float*>(in + 32)),
        _MM_FROUND_TO_NEAREST_INT);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        CanonicalizeHalfNaN256(both));
    in += 64;
    out += 32;
  }
  if (i + 8 <= n) {
    const __m128i half =
        _mm256_cvtps_ph(_mm256_loadu_ps(reinterpret_cast<const float*>(in)),
                        _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     CanonicalizeHalfNaN128(half));
    in += 32;
    out += 16;
    i += 8;
  }
  FloatToHalfScalar(in, out, n - i);
}

// vcvtph2ps already quiets NaNs and keeps their payload, exactly like
// HalfBitsToFloatInline, so no fix-up is needed.
__attribute__((target("avx2,f16c"))) void HalfToFloatF16C(const void* src,
                                                          void* dst,
                                                          int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m128i high =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
    _mm256_storeu_ps(reinterpret_cast<float*>(out), _mm256_cvtph_ps(low));
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 32), _mm256_cvtph_ps(high));
    in += 32;
    out += 64;
  }
  if (i + 8 <= n) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    _mm256_storeu_ps(reinterpret_cast<float*>(out), _mm256_cvtph_ps(half));
    in += 16;
    out += 32;
    i += 8;
  }
  HalfToFloatScalar(in, out, n - i);
}

__attribute__((target("avx2"))) void FloatToBFloat16Avx2(const void* src,
                                                         void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i low = FloatToBFloat16Lanes(
        _mm256_loadu_ps(reinterpret_cast<const float*>(in)));
    const __m256i high = FloatToBFloat16Lanes(
        _mm256_loadu_ps(reinterpret_cast<const float*>(in + 32)));
    // packus works within 128-bit lanes, giving low[0:4] high[0:4]
    // low[4:8] high[4:8]; the permute restores element order. Values fit in
    // 16 bits, so the unsigned saturation never triggers.
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(low, high), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
    in += 64;
    out += 32;
  }
  if (i + 8 <= n) {
    const __m256i lanes = FloatToBFloat16Lanes(
        _mm256_loadu_ps(reinterpret_cast<const float*>(in)));
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(lanes),
                                            _mm256_extracti128_si256(lanes, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
    in += 32;
    out += 16;
    i += 8;
  }
  FloatToBFloat16Scalar(in, out, n - i);
}

__attribute__((target("avx2"))) void BFloat16ToFloatAvx2(const void* src,
                                                         void* dst, int64_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m128i high =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(low), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(high), 16));
    in += 32;
    out += 64;
  }
  if (i + 8 <= n) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    in += 16;
    out += 32;
    i += 8;
  }
  BFloat16ToFloatScalar(in, out, n - i);
}

bool CpuHasAvx2() {
  // libgcc and compiler-rt set "avx2" only when the OS also saves the AVX
  // state (they check XGETBV), so the 256-bit registers are usable.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

namespace {

bool CpuHasF16C() {
#if defined(__clang__)
  // Clang (14 at least) rejects "f16c" in __builtin_cpu_supports, so read
  // the CPUID bit (leaf 1, ECX bit 29) directly.
  unsigned int eax, ebx, ecx, edx;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
#else
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
#endif
}

}  // namespace

bool CpuHasAvx2F16C() {
  // F16C's 256-bit forms need the OS-saved AVX state that CpuHasAvx2()
  // checks for.
  return CpuHasAvx2() && CpuHasF16C();
}

#else  // !defined(__x86_64__)

void FloatToHalfF16C(const void* src, void* dst, int64_t n) {
  FloatToHalfScalar(src, dst, n);
}
void HalfToFloatF16C(const void* src, void* dst, int64_t n) {
  HalfToFloatScalar(src, dst, n);
}
void FloatToBFloat16Avx2(const void* src, void* dst, int64_t n) {
  FloatToBFloat16Scalar(src, dst, n);
}
void BFloat16ToFloatAvx2(const void* src, void* dst, int64_t n) {
  BFloat16ToFloatScalar(src, dst, n);
}
bool CpuHasAvx2F16C() { return false; }
bool CpuHasAvx2() { return false; }

#endif  // defined(__x86_64__)

namespace {

HalfKernels ChooseHalfKernels() {
  HalfKernels kernels{FloatToHalfScalar, HalfToFloatScalar,
                      FloatToBFloat16Scalar, BFloat16ToFloatScalar};
  if (CpuHasAvx2F16C()) {
    kernels.float_to_half = FloatToHalfF16C;
    kernels.half_to_float = HalfToFloatF16C;
  }
  if (CpuHasAvx2()) {
    kernels.float_to_bfloat16 = FloatToBFloat16Avx2;
    kernels.bfloat16_to_float = BFloat16ToFloatAvx2;
  }
  return kernels;
}

}  // namespace

const HalfKernels& SelectedHalfKernels() {
  // Chosen once; the CPU does not change under a running process.
  static const HalfKernels kernels = ChooseHalfKernels();
  return kernels;
}

}  // namespace modelstate::internal
