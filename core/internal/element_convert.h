// File: internal/element_convert.h
// The element conversion rules between every pair of dtypes, one element at
// a time, compiled for both the host and (in the CUDA build) the device, so
// that a GPU converts bit for bit like the CPU. core/dtype.h states the
// rules: round-to-nearest-even into floating types, float16/bfloat16 reached
// through float32, floating -> integer truncating with NaN -> 0 and
// saturation at int64's range, then wrap-around to the target width.
//
// ConvertElements (dtype.cc) uses these scalars inside its vectorised loops;
// tests/core/element_convert_test.cc checks ConvertOne against it for every
// pair and every float16/bfloat16 bit pattern.
#ifndef MODELSTATE_CORE_INTERNAL_ELEMENT_CONVERT_H_
#define MODELSTATE_CORE_INTERNAL_ELEMENT_CONVERT_H_

#include <cstdint>
#include <cstring>
#include <type_traits>
#if !defined(__CUDACC__)
#include <bit>
#endif

#if defined(__CUDACC__)
#define MODELSTATE_HOST_DEVICE __host__ __device__
#else
#define MODELSTATE_HOST_DEVICE
#endif

namespace modelstate::internal {

template <typename To, typename From>
MODELSTATE_HOST_DEVICE inline To BitCast(From value) {
  static_assert(sizeof(To) == sizeof(From));
#if defined(__CUDACC__)  // nvcc compiles the kernels as C++17.
  To result;
  memcpy(&result, &value, sizeof(To));
  return result;
#else
  return std::bit_cast<To>(value);
#endif
}

// PyTorch's NaN encodings (see core/dtype.h).
inline constexpr uint16_t kHalfNaN = 0x7E00;      // Plus the input's sign bit.
inline constexpr uint16_t kBFloat16NaN = 0x7FC0;  // Sign dropped.

// Round-to-nearest-even float32 -> float16 on the bit patterns, equal to
// fp16_ieee_from_fp32_value (and to F16C) for every non-NaN input. Written
// as selects between candidates rather than branches, so loops over it
// vectorise (it is the whole conversion on CPUs without F16C). Like c10, it
// assumes the default round-to-nearest floating-point mode and float
// arithmetic done in float (FLT_EVAL_METHOD 0: x86-64 SSE, ARM, CUDA; not
// x87).
MODELSTATE_HOST_DEVICE inline uint16_t FloatToHalfBitsInline(float value) {
  const uint32_t bits = BitCast<uint32_t>(value);
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
  // many x86 CPUs take a slow microcode assist for subnormal operands, and
  // a GPU may flush them.
  const uint32_t addend =
      abs & (0u - static_cast<uint32_t>(abs >= 0x00800000u));
  const uint32_t subnormal =
      BitCast<uint32_t>(BitCast<float>(addend) + 0.5f) - 0x3F000000u;
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
MODELSTATE_HOST_DEVICE inline float HalfBitsToFloatInline(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x03FFu;
  if (exponent == 0x1F) {
    if (mantissa == 0) return BitCast<float>(sign | 0x7F800000u);
    return BitCast<float>(sign | 0x7FC00000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return BitCast<float>(sign | BitCast<uint32_t>(magnitude));
  }
  return BitCast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// c10::detail::round_to_nearest_even: add 0x7FFF plus the lowest kept bit,
// keep the top 16 bits. Infinities survive and large finite values round up
// to infinity. NaN must be replaced (the addition could carry a NaN into
// infinity); a select rather than an early return keeps the loop free of
// branches so compilers can vectorise it.
MODELSTATE_HOST_DEVICE inline uint16_t FloatToBFloat16BitsInline(float value) {
  const uint32_t bits = BitCast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? kBFloat16NaN : rounded);
}

MODELSTATE_HOST_DEVICE inline float BFloat16BitsToFloatInline(uint16_t bits) {
  return BitCast<float>(static_cast<uint32_t>(bits) << 16);
}

// Storage types for the elements that have no C++ arithmetic type of their
// own. They only select overloads; the bits are read and written through
// them unchanged.
struct HalfBits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};
// bool is stored as one byte; reading it as uint8_t avoids UB on bytes
// other than 0 and 1.
struct BoolByte {
  uint8_t byte;
};

template <typename T>
inline constexpr bool kIsHalfLike =
    std::is_same_v<T, HalfBits> || std::is_same_v<T, BFloat16Bits>;

// floating -> integer: truncate toward zero; NaN -> 0; beyond int64's range
// saturate; then wrap to the target width (C++20 defines integer
// narrowing as modular). Every static_cast here is in range, so there is no
// UB for UBSan to find.
template <typename Int, typename Float>
MODELSTATE_HOST_DEVICE inline Int FloatToInt(Float value) {
  // 2^63 is exact in float and double; [-2^63, 2^63) converts to int64.
  constexpr Float kTwoTo63 = static_cast<Float>(9223372036854775808.0);
  int64_t wide;
  if (!(value == value)) {
    wide = 0;
  } else if (value >= kTwoTo63) {
    wide = INT64_MAX;
  } else if (value < -kTwoTo63) {
    wide = INT64_MIN;
  } else {
    wide = static_cast<int64_t>(value);
  }
  return static_cast<Int>(wide);
}

// float <-> double for NaN inputs, as x86's cvtss2sd/cvtsd2ss do them: the
// sign and the top payload bits are kept and the NaN becomes quiet. Spelled
// out because GPUs return a canonical NaN instead.
MODELSTATE_HOST_DEVICE inline double FloatNaNToDouble(float value) {
  const uint64_t bits = BitCast<uint32_t>(value);
  return BitCast<double>(((bits & 0x80000000u) << 32) | 0x7FF8000000000000ull |
                         ((bits & 0x007FFFFFu) << 29));
}
MODELSTATE_HOST_DEVICE inline float DoubleNaNToFloat(double value) {
  const uint64_t bits = BitCast<uint64_t>(value);
  return BitCast<float>(static_cast<uint32_t>(((bits >> 32) & 0x80000000u) |
                                              0x7FC00000u |
                                              ((bits >> 29) & 0x007FFFFFu)));
}

// One element between the arithmetic types and BoolByte (float16/bfloat16
// go through float32; see ConvertOne).
template <typename Dst, typename Src>
MODELSTATE_HOST_DEVICE inline Dst CastElement(Src value) {
  if constexpr (std::is_same_v<Src, BoolByte>) {
    return CastElement<Dst>(static_cast<uint8_t>(value.byte != 0 ? 1 : 0));
  } else if constexpr (std::is_same_v<Dst, BoolByte>) {
    return BoolByte{static_cast<uint8_t>(value != 0 ? 1 : 0)};
  } else if constexpr (std::is_same_v<Dst, double> &&
                       std::is_same_v<Src, float>) {
#if defined(__CUDA_ARCH__)
    if (!(value == value)) return FloatNaNToDouble(value);
#endif
    return static_cast<double>(value);
  } else if constexpr (std::is_same_v<Dst, float> &&
                       std::is_same_v<Src, double>) {
#if defined(__CUDA_ARCH__)
    if (!(value == value)) return DoubleNaNToFloat(value);
#endif
    return static_cast<float>(value);  // Round to nearest even.
  } else if constexpr (std::is_floating_point_v<Dst>) {
    // integer -> floating rounds to nearest even.
    return static_cast<Dst>(value);
  } else if constexpr (std::is_floating_point_v<Src>) {
    return FloatToInt<Dst>(value);
  } else {
    return static_cast<Dst>(value);  // Integer wrap-around.
  }
}

template <typename T>
MODELSTATE_HOST_DEVICE inline float ToFloat32(T value) {
  if constexpr (std::is_same_v<T, HalfBits>) {
    return HalfBitsToFloatInline(value.bits);
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    return BFloat16BitsToFloatInline(value.bits);
  } else {
    return CastElement<float>(value);
  }
}

template <typename T>
MODELSTATE_HOST_DEVICE inline T FromFloat32(float value) {
  if constexpr (std::is_same_v<T, HalfBits>) {
    return HalfBits{FloatToHalfBitsInline(value)};
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    return BFloat16Bits{FloatToBFloat16BitsInline(value)};
  } else {
    return CastElement<T>(value);
  }
}

// One element of any pair, exactly as ConvertElements converts it.
template <typename Dst, typename Src>
MODELSTATE_HOST_DEVICE inline Dst ConvertOne(Src value) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return value;  // Same dtype: the bits, unchanged.
  } else if constexpr (kIsHalfLike<Src> || kIsHalfLike<Dst>) {
    return FromFloat32<Dst>(ToFloat32(value));
  } else {
    return CastElement<Dst>(value);
  }
}

// Calls visit(T{}) with the storage type of the dtype whose enum value is
// `dtype_number` (core/dtype.h's order). Returns false for an unknown value.
template <typename Visitor>
inline bool VisitElementType(int dtype_number, Visitor&& visit) {
  switch (dtype_number) {
    case 0:
      visit(float{});
      return true;
    case 1:
      visit(double{});
      return true;
    case 2:
      visit(HalfBits{});
      return true;
    case 3:
      visit(BFloat16Bits{});
      return true;
    case 4:
      visit(int8_t{});
      return true;
    case 5:
      visit(int16_t{});
      return true;
    case 6:
      visit(int32_t{});
      return true;
    case 7:
      visit(int64_t{});
      return true;
    case 8:
      visit(uint8_t{});
      return true;
    case 9:
      visit(BoolByte{});
      return true;
  }
  return false;
}

}  // namespace modelstate::internal

#endif  // MODELSTATE_CORE_INTERNAL_ELEMENT_CONVERT_H_
