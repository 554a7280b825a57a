// File: dtype.h
// The element types a modelstate tensor can hold, their names in every
// spelling we meet (modelstate, PyTorch, safetensors, PyTorch's legacy tensor
// type names used in error texts), and element-wise conversion between any
// two of them with PyTorch's rounding rules.
//
// Example:
//   absl::StatusOr<DType> dt = ParseDType("torch.float16");   // kFloat16
//   ConvertElements(src, DType::kFloat32, dst, DType::kFloat16, n);
#ifndef MODELSTATE_CORE_DTYPE_H_
#define MODELSTATE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// Numbers are stable (they appear in the wire format's enum, offset by one).
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kUInt8 = 8,
  kBool = 9,
};
inline constexpr int kNumDTypes = 10;

// All dtypes, in enum order.
inline constexpr DType kAllDTypes[kNumDTypes] = {
    DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
    DType::kInt8,    DType::kInt16,   DType::kInt32,   DType::kInt64,
    DType::kUInt8,   DType::kBool};

// Bytes per element: 4, 8, 2, 2, 1, 2, 4, 8, 1, 1.
size_t ElementSize(DType dtype);

// True for float32, float64, float16 and bfloat16.
bool IsFloatingPoint(DType dtype);

// "float32", "float64", "float16", "bfloat16", "int8", ..., "uint8", "bool".
absl::string_view DTypeName(DType dtype);

// PyTorch's spelling: "torch.float32", ..., "torch.bool".
absl::string_view TorchDTypeName(DType dtype);

// safetensors' spelling: "F32", "F64", "F16", "BF16", "I8", "I16", "I32",
// "I64", "U8", "BOOL".
absl::string_view SafetensorsDTypeName(DType dtype);

// PyTorch's legacy CPU tensor type name, as `torch.typename()` prints it in
// error texts: "torch.FloatTensor", "torch.DoubleTensor", "torch.HalfTensor",
// "torch.BFloat16Tensor", "torch.CharTensor", "torch.ShortTensor",
// "torch.IntTensor", "torch.LongTensor", "torch.ByteTensor",
// "torch.BoolTensor".
absl::string_view LegacyTensorTypeName(DType dtype);

// Parses any of the spellings above, plus PyTorch's aliases ("float", "double",
// "half", "long", "int", "short", and the same with a "torch." prefix).
// Returns INVALID_ARGUMENT naming the text when it is none of them.
absl::StatusOr<DType> ParseDType(absl::string_view text);

// Converts `count` elements from `src` (of `src_dtype`) to `dst` (of
// `dst_dtype`), element by element, as PyTorch 1.13's CPU copy kernel does:
//  - equal dtypes: the bytes are copied unchanged (NaN payloads included);
//  - float64 -> float32 and integer -> floating: round to nearest even;
//  - any -> float16/bfloat16: via float32, then round to nearest even
//    (c10::Half(float), c10::BFloat16(float)), so float64 and int64 sources
//    round twice (float64 1 + 2^-11 + 2^-40 gives float16 1.0, not the
//    nearer 1 + 2^-10). A NaN becomes float16 0x7E00 with the input's sign
//    (fp16_ieee_from_fp32_value) and bfloat16 0x7FC0 whatever its sign
//    (c10::detail::round_to_nearest_even). PyTorch's AVX2/AVX-512 copy
//    kernels write 0xFFFF instead for NaNs that reach their vector body
//    (contiguous float32 -> bfloat16: all; float64 -> bfloat16: those in
//    whole 16-element blocks); its scalar and default-capability kernels,
//    strided copies and the other source dtypes give 0x7FC0, which we use
//    everywhere so that results depend on neither CPU nor position;
//  - float16/bfloat16 -> any: exact widening to float32 first. A float16 NaN
//    becomes a quiet float32 NaN with its payload (0x7C01 -> 0x7FC02000);
//    bfloat16 widening only shifts the bits (0x7F81 -> 0x7F810000);
//  - NaN payloads through float32 <-> float64 follow the hardware conversion
//    (x86 sets the quiet bit and keeps the leading payload bits);
//  - floating -> integer: truncation toward zero; NaN gives 0 and values
//    beyond int64's range saturate, then the result wraps to the target width
//    like an integer -> integer conversion (PyTorch leaves these cases
//    undefined: C++ UB, in practice x86's "integer indefinite" pattern, e.g.
//    NaN -> int32 INT32_MIN and 1e20 -> uint8 0, where we give 0 and 255).
//    float -> uint8 goes through int64 as c10 does, so -1.0 gives 255;
//  - integer -> integer: two's-complement wrap-around;
//  - any -> bool: value != 0 (NaN is true); bool -> any: 0 or 1 (a bool byte
//    other than 0 or 1 reads as true).
// float32 <-> float16 uses F16C and float32 <-> bfloat16 uses AVX2 when the
// CPU has them (checked once at run time), else portable scalar code with
// identical results (both assume the default round-to-nearest floating-point
// mode, as c10 does). `src` and `dst` need no alignment and must not overlap
// unless the dtypes are equal and the pointers are equal. `count` must not
// be negative.
void ConvertElements(const void* src, DType src_dtype, void* dst,
                     DType dst_dtype, int64_t count);

// Scalar conversions used by ConvertElements and tests (round to nearest
// even; NaN handling as above: FloatToHalfBits(NaN) is 0x7E00 | sign,
// FloatToBFloat16Bits(NaN) is 0x7FC0).
uint16_t FloatToHalfBits(float value);
float HalfBitsToFloat(uint16_t bits);
uint16_t FloatToBFloat16Bits(float value);
float BFloat16BitsToFloat(uint16_t bits);

// Reads element `index` of `data` (of `dtype`) as a double, and writes a
// double into element `index` with ConvertElements' rules. Slow; for tests,
// tiny tensors and printing.
double ReadElementAsDouble(const void* data, DType dtype, int64_t index);
void WriteElementFromDouble(void* data, DType dtype, int64_t index,
                            double value);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_DTYPE_H_
