// File: internal/dtype_kernels.h
// Private to dtype.cc and its tests: the bit-level float16/bfloat16 scalar
// conversions (inline, so the scalar loops and vector tails do not pay a call
// per element) and the float32 <-> float16/bfloat16 array kernels, scalar and
// SIMD, plus the run-time choice between them. See core/dtype.h for the
// rounding and NaN rules these implement.
#ifndef MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_
#define MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_

#include <bit>
#include <cstdint>

namespace modelstate::internal {

// PyTorch's NaN encodings (see core/dtype.h).
inline constexpr uint16_t kHalfNaN = 0x7E00;      // Plus the input's sign bit.
inline constexpr uint16_t kBFloat16NaN = 0x7FC0;  // Sign dropped.

// Round-to-nearest-even float32 -> float16 on the bit patterns, equal to
// fp16_ieee_from_fp32_value (and to F16C) for every non-NaN input. Written
// as selects between candidates rather than branches, so loops over it
// vectorise (it is the whole conversion on CPUs without F16C). Like c10, it
// assumes the default round-to-nearest floating-point mode and float
// arithmetic done in float (FLT_EVAL_METHOD 0: x86-64 SSE, ARM; not x87).
inline uint16_t FloatToHalfBitsInline(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  // Normal float16 (|x| >= 2^-14): rebias the exponent (127 -> 15) and round
  // the 13 dropped mantissa bits to even; a carry out of the mantissa
  // correctly bumps the exponent. Meaningless (but harmless unsigned
  // wrap-around) for other inputs.
  const uint32_t normal =
      (abs + 0x0FFFu + ((abs >> 13) & 1u) - (112u << 23)) >> 13;
  // Subnormal float16 or zero (|x| < 2^-14): 0.5 has an ulp of 2^-24, the
  // float16 subnormal spacing, so the FPU's round-to-nearest-even addition
  // 0.5 + |x| leaves exactly the rounded count of 2^-24 units in the low
  // mantissa bits. A count of 0x400 is the smallest normal's encoding.
  // Float subnormals (which round to 0 anyway) are replaced by 0 first:
  // many x86 CPUs take a slow microcode assist for subnormal operands.
  const uint32_t addend =
      abs & (0u - static_cast<uint32_t>(abs >= 0x00800000u));
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(addend) + 0.5f) -
      0x3F000000u;
  // 65520 (0x477FF000) is the midpoint between 65504, the largest float16,
  // and 65536; it rounds to even, i.e. up to infinity. All-ones/all-zeros
  // masks instead of ?: so that no branch survives into the loop.
  const uint32_t is_small = 0u - static_cast<uint32_t>(abs < 0x38800000u);
  const uint32_t is_inf = 0u - static_cast<uint32_t>(abs >= 0x477FF000u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(abs > 0x7F800000u);
  uint32_t magnitude = (subnormal & is_small) | (normal & ~is_small);
  magnitude = (0x7C00u & is_inf) | (magnitude & ~is_inf);
  magnitude = (kHalfNaN & is_nan) | (magnitude & ~is_nan);
  return static_cast<uint16_t>(sign | magnitude);
}

// Exact float16 -> float32. NaNs keep sign and payload and become quiet,
// as fp16_ieee_to_fp32_value and F16C both do.
inline float HalfBitsToFloatInline(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x03FFu;
  if (exponent == 0x1F) {
    if (mantissa == 0) return std::bit_cast<float>(sign | 0x7F800000u);
    return std::bit_cast<float>(sign | 0x7FC00000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) |
                              (mantissa << 13));
}

// c10::detail::round_to_nearest_even: add 0x7FFF plus the lowest kept bit,
// keep the top 16 bits. Infinities survive and large finite values round up
// to infinity. NaN must be replaced (the addition could carry a NaN into
// infinity); a select rather than an early return keeps the loop free of
// branches so compilers can vectorise it.
inline uint16_t FloatToBFloat16BitsInline(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? kBFloat16NaN : rounded);
}

inline float BFloat16BitsToFloatInline(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Array kernels over `n` >= 0 elements: float32 on one side, float16 or
// bfloat16 bits on the other. Pointers need no alignment (tensor data from
// the wire may sit at any byte offset); src and dst must not overlap.
using NarrowKernel = void (*)(const void* src, void* dst, int64_t n);
using WidenKernel = void (*)(const void* src, void* dst, int64_t n);

void FloatToHalfScalar(const void* src, void* dst, int64_t n);
void HalfToFloatScalar(const void* src, void* dst, int64_t n);
void FloatToBFloat16Scalar(const void* src, void* dst, int64_t n);
void BFloat16ToFloatScalar(const void* src, void* dst, int64_t n);

// SIMD kernels; call only when the matching Cpu*() check is true. On
// non-x86 builds they are the scalar kernels.
void FloatToHalfF16C(const void* src, void* dst, int64_t n);
void HalfToFloatF16C(const void* src, void* dst, int64_t n);
void FloatToBFloat16Avx2(const void* src, void* dst, int64_t n);
void BFloat16ToFloatAvx2(const void* src, void* dst, int64_t n);

// Whether the CPU (and OS) support the SIMD kernels: F16C kernels need
// both AVX2 and F16C, bfloat16 kernels AVX2.
bool CpuHasAvx2F16C();
bool CpuHasAvx2();

// The kernels ConvertElements uses: the SIMD ones when the CPU has them,
// chosen on first use, else the scalar ones.
struct HalfKernels {
  NarrowKernel float_to_half;
  WidenKernel half_to_float;
  NarrowKernel float_to_bfloat16;
  WidenKernel bfloat16_to_float;
};
const HalfKernels& SelectedHalfKernels();

}  // namespace modelstate::internal

#endif  // MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_
