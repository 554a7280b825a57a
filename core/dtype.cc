// File: dtype.cc
// dtype names and parsing, and ConvertElements: a 10 x 10 table of typed
// loops, one per (source, destination) pair, so the inner loops have no
// per-element switch. float32 <-> float16/bfloat16 use the SIMD kernels in
// internal/dtype_kernels; other pairs with a float16/bfloat16 side go through
// float32 in small stack chunks, which is exactly PyTorch's rule (everything
// reaches float16/bfloat16 via float32) and reuses the fast kernels.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/log.h"
#include "core/internal/dtype_kernels.h"

namespace modelstate {
namespace {

struct DTypeInfo {
  size_t size;
  bool floating_point;
  absl::string_view name;
  absl::string_view torch_name;
  absl::string_view safetensors_name;
  absl::string_view legacy_name;
};

// Indexed by the enum's value.
constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {4, true, "float32", "torch.float32", "F32", "torch.FloatTensor"},
    {8, true, "float64", "torch.float64", "F64", "torch.DoubleTensor"},
    {2, true, "float16", "torch.float16", "F16", "torch.HalfTensor"},
    {2, true, "bfloat16", "torch.bfloat16", "BF16", "torch.BFloat16Tensor"},
    {1, false, "int8", "torch.int8", "I8", "torch.CharTensor"},
    {2, false, "int16", "torch.int16", "I16", "torch.ShortTensor"},
    {4, false, "int32", "torch.int32", "I32", "torch.IntTensor"},
    {8, false, "int64", "torch.int64", "I64", "torch.LongTensor"},
    {1, false, "uint8", "torch.uint8", "U8", "torch.ByteTensor"},
    {1, false, "bool", "torch.bool", "BOOL", "torch.BoolTensor"},
}};

const DTypeInfo& Info(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  MODELSTATE_CHECK(index < kInfo.size())
      << "invalid DType value " << static_cast<int>(index);
  return kInfo[index];
}

struct Alias {
  absl::string_view name;
  DType dtype;
};

// PyTorch's short aliases; each is also accepted with a "torch." prefix.
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32}, {"double", DType::kFloat64},
    {"half", DType::kFloat16},  {"long", DType::kInt64},
    {"int", DType::kInt32},     {"short", DType::kInt16},
};

using internal::BFloat16Bits;
using internal::BoolByte;
using internal::CastElement;
using internal::HalfBits;
using internal::kIsHalfLike;

// Element access through memcpy: tensor data from the wire may sit at any
// byte offset, and compilers turn these into plain (vectorisable) moves.
template <typename T>
T Load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
template <typename T>
void Store(unsigned char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

template <typename Dst, typename Src>
void ConvertLoop(const unsigned char* src, unsigned char* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    Store(dst + i * sizeof(Dst),
          CastElement<Dst>(Load<Src>(src + i * sizeof(Src))));
  }
}

// float32 <-> float16/bfloat16 arrays through the selected kernels.
template <typename HalfLike>
void ToFloat(const unsigned char* src, unsigned char* dst, int64_t count) {
  const internal::HalfKernels& kernels = internal::SelectedHalfKernels();
  if constexpr (std::is_same_v<HalfLike, HalfBits>) {
    kernels.half_to_float(src, dst, count);
  } else {
    kernels.bfloat16_to_float(src, dst, count);
  }
}
template <typename HalfLike>
void FromFloat(const unsigned char* src, unsigned char* dst, int64_t count) {
  const internal::HalfKernels& kernels = internal::SelectedHalfKernels();
  if constexpr (std::is_same_v<HalfLike, HalfBits>) {
    kernels.float_to_half(src, dst, count);
  } else {
    kernels.float_to_bfloat16(src, dst, count);
  }
}

// Converts any pair with a float16/bfloat16 side (but not float32 on the
// other side, which calls the kernels directly) through a float32 buffer.
template <typename Dst, typename Src>
void ConvertViaFloat(const unsigned char* src, unsigned char* dst,
                     int64_t count) {
  // Small enough for the stack and L1, large enough to amortise the calls.
  constexpr int64_t kChunk = 1024;
  float buffer[kChunk];
  auto* staged = reinterpret_cast<unsigned char*>(buffer);
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t n = std::min(kChunk, count - start);
    const unsigned char* chunk_src = src + start * sizeof(Src);
    unsigned char* chunk_dst = dst + start * sizeof(Dst);
    if constexpr (kIsHalfLike<Src>) {
      ToFloat<Src>(chunk_src, staged, n);
    } else {
      ConvertLoop<float, Src>(chunk_src, staged, n);
    }
    if constexpr (kIsHalfLike<Dst>) {
      FromFloat<Dst>(staged, chunk_dst, n);
    } else {
      ConvertLoop<Dst, float>(staged, chunk_dst, n);
    }
  }
}

template <typename Dst, typename Src>
void ConvertTyped(const void* src, void* dst, int64_t count) {
  const auto* src_bytes = static_cast<const unsigned char*>(src);
  auto* dst_bytes = static_cast<unsigned char*>(dst);
  if constexpr (std::is_same_v<Src, Dst>) {
    // PyTorch copies same-dtype data bit for bit. Equal pointers are
    // allowed (a no-op); memcpy would be UB for them.
    if (src != dst) {
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(Src));
    }
  } else if constexpr (std::is_same_v<Src, float> && kIsHalfLike<Dst>) {
    FromFloat<Dst>(src_bytes, dst_bytes, count);
  } else if constexpr (kIsHalfLike<Src> && std::is_same_v<Dst, float>) {
    ToFloat<Src>(src_bytes, dst_bytes, count);
  } else if constexpr (kIsHalfLike<Src> || kIsHalfLike<Dst>) {
    ConvertViaFloat<Dst, Src>(src_bytes, dst_bytes, count);
  } else {
    ConvertLoop<Dst, Src>(src_bytes, dst_bytes, count);
  }
}

using ConvertFn = void (*)(const void*, void*, int64_t);

// Storage type per DType, in enum order.
template <size_t kIndex>
struct Storage;
template <>
struct Storage<0> {
  using type = float;
};
template <>
struct Storage<1> {
  using type = double;
};
template <>
struct Storage<2> {
  using type = HalfBits;
};
template <>
struct Storage<3> {
  using type = BFloat16Bits;
};
template <>
struct Storage<4> {
  using type = int8_t;
};
template <>
struct Storage<5> {
  using type = int16_t;
};
template <>
struct Storage<6> {
  using type = int32_t;
};
template <>
struct Storage<7> {
  using type = int64_t;
};
template <>
struct Storage<8> {
  using type = uint8_t;
};
template <>
struct Storage<9> {
  using type = BoolByte;
};

// kConverters[src][dst], built at compile time.
template <size_t kSrc, size_t... kDst>
constexpr std::array<ConvertFn, kNumDTypes> ConverterRow(
    std::index_sequence<kDst...>) {
  return {&ConvertTyped<typename Storage<kDst>::type,
                        typename Storage<kSrc>::type>...};
}
template <size_t... kSrc>
constexpr std::array<std::array<ConvertFn, kNumDTypes>, kNumDTypes>
ConverterTable(std::index_sequence<kSrc...>) {
  return {ConverterRow<kSrc>(std::make_index_sequence<kNumDTypes>())...};
}
constexpr auto kConverters =
    ConverterTable(std::make_index_sequence<kNumDTypes>());

}  // namespace

size_t ElementSize(DType dtype) { return Info(dtype).size; }

bool IsFloatingPoint(DType dtype) { return Info(dtype).floating_point; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::string_view TorchDTypeName(DType dtype) { return Info(dtype).torch_name; }

absl::string_view SafetensorsDTypeName(DType dtype) {
  return Info(dtype).safetensors_name;
}

absl::string_view LegacyTensorTypeName(DType dtype) {
  return Info(dtype).legacy_name;
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  for (DType dtype : kAllDTypes) {
    const DTypeInfo& info = Info(dtype);
    if (text == info.name || text == info.torch_name ||
        text == info.safetensors_name || text == info.legacy_name) {
      return dtype;
    }
  }
  absl::string_view alias_text = text;
  absl::ConsumePrefix(&alias_text, "torch.");
  for (const Alias& alias : kAliases) {
    if (alias_text == alias.name) return alias.dtype;
  }
  // The text may come from a request: escape it and keep the message short.
  constexpr size_t kMaxShown = 64;
  std::string shown = absl::CEscape(text.substr(0, kMaxShown));
  if (text.size() > kMaxShown) absl::StrAppend(&shown, "...");
  return absl::InvalidArgumentError(absl::StrCat(
      "Unknown dtype '", shown,
      "'; expected float32, float64, float16, bfloat16, int8, int16, int32, "
      "int64, uint8 or bool, optionally prefixed with 'torch.', a PyTorch "
      "alias (float, double, half, long, int, short), a safetensors name "
      "(F32, BF16, I64, BOOL, ...) or a legacy type (torch.FloatTensor, ...)"));
}

void ConvertElements(const void* src, DType src_dtype, void* dst,
                     DType dst_dtype, int64_t count) {
  MODELSTATE_CHECK(count >= 0) << "negative element count " << count;
  // Validates both dtypes.
  static_cast<void>(Info(src_dtype));
  static_cast<void>(Info(dst_dtype));
  if (count == 0) return;
  kConverters[static_cast<size_t>(src_dtype)][static_cast<size_t>(dst_dtype)](
      src, dst, count);
}

uint16_t FloatToHalfBits(float value) {
  return internal::FloatToHalfBitsInline(value);
}

float HalfBitsToFloat(uint16_t bits) {
  return internal::HalfBitsToFloatInline(bits);
}

uint16_t FloatToBFloat16Bits(float value) {
  return internal::FloatToBFloat16BitsInline(value);
}

float BFloat16BitsToFloat(uint16_t bits) {
  return internal::BFloat16BitsToFloatInline(bits);
}

double ReadElementAsDouble(const void* data, DType dtype, int64_t index) {
  MODELSTATE_CHECK(index >= 0) << "negative index " << index;
  const auto* element = static_cast<const unsigned char*>(data) +
                        static_cast<size_t>(index) * ElementSize(dtype);
  double value;
  ConvertElements(element, dtype, &value, DType::kFloat64, 1);
  return value;
}

void WriteElementFromDouble(void* data, DType dtype, int64_t index,
                            double value) {
  MODELSTATE_CHECK(index >= 0) << "negative index " << index;
  auto* element = static_cast<unsigned char*>(data) +
                  static_cast<size_t>(index) * ElementSize(dtype);
  ConvertElements(&value, DType::kFloat64, element, dtype, 1);
}

}  // namespace modelstate
