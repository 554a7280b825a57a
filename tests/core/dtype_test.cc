// Tests for core/dtype.h: names and parsing, the float16/bfloat16 scalar
// conversions against an independent reference, the SIMD kernels against the
// scalar functions (exhaustively where affordable), every dtype pair against
// vectors produced by real PyTorch 1.13 (dtype_vectors.inc), and our own rule
// for the float -> int cases PyTorch leaves undefined.
#include "core/dtype.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/internal/dtype_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Helpers.

uint32_t FloatBits(float value) { return std::bit_cast<uint32_t>(value); }
float BitsFloat(uint32_t bits) { return std::bit_cast<float>(bits); }

// Raw little-endian element bits <-> memory.
uint64_t LoadBits(const void* element, size_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, element, size);
  return bits;
}
void StoreBits(void* element, size_t size, uint64_t bits) {
  std::memcpy(element, &bits, size);
}

bool IsHalfNaN(uint16_t bits) { return (bits & 0x7FFF) > 0x7C00; }
bool IsBFloat16NaN(uint16_t bits) { return (bits & 0x7FFF) > 0x7F80; }

// Round-half-to-even of a non-negative double that holds at most 53
// significant bits, written with floor and explicit tie handling rather
// than the current rounding mode.
double RoundHalfEven(double x) {
  const double floor_x = std::floor(x);
  const double fraction = x - floor_x;  // Exact.
  if (fraction > 0.5) return floor_x + 1;
  if (fraction < 0.5) return floor_x;
  return std::fmod(floor_x, 2.0) == 0 ? floor_x : floor_x + 1;
}

// Reference float -> float16 in double arithmetic: find the quantum (the
// spacing of float16 values around |x|), round |x| / quantum to an integer,
// then encode. Independent of the bit tricks under test.
uint16_t ReferenceFloatToHalf(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) return sign | 0x7E00;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (std::isinf(magnitude)) return sign | 0x7C00;
  int exponent;  // magnitude = m * 2^exponent, m in [0.5, 1).
  std::frexp(magnitude, &exponent);
  // float16: 11 significant bits, smallest normal 2^-14, subnormals spaced
  // 2^-24.
  const int quantum_exponent = std::max(exponent - 11, -24);
  const double units = RoundHalfEven(std::ldexp(magnitude, -quantum_exponent));
  const double rounded = std::ldexp(units, quantum_exponent);
  if (rounded > 65504.0) return sign | 0x7C00;
  if (rounded < 0x1p-14) {
    return sign | static_cast<uint16_t>(units);  // Subnormal or zero.
  }
  int rounded_exponent;
  const double m = std::frexp(rounded, &rounded_exponent);  // [0.5, 1)
  const auto biased = static_cast<uint16_t>(rounded_exponent - 1 + 15);
  const auto mantissa = static_cast<uint16_t>((m * 2 - 1) * 1024);
  return sign | static_cast<uint16_t>(biased << 10) | mantissa;
}

// Reference float -> bfloat16, same method: 8 significant bits, smallest
// normal 2^-126, subnormals spaced 2^-133; NaN -> 0x7FC0 (sign dropped, as
// c10 does).
uint16_t ReferenceFloatToBFloat16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (std::isinf(magnitude)) return sign | 0x7F80;
  if (magnitude == 0) return sign;
  int exponent;
  std::frexp(magnitude, &exponent);
  const int quantum_exponent = std::max(exponent - 8, -133);
  const double units = RoundHalfEven(std::ldexp(magnitude, -quantum_exponent));
  const double rounded = std::ldexp(units, quantum_exponent);
  if (rounded >= 0x1p128) return sign | 0x7F80;
  // A bfloat16 value is a float32 with 16 zero low bits, so the encoding of
  // an exactly representable value is its float32 encoding's top half.
  return sign |
         static_cast<uint16_t>(FloatBits(static_cast<float>(rounded)) >> 16);
}

// Reference float16 -> float: (-1)^s * significand * 2^(e - 25).
uint32_t ReferenceHalfToFloatBits(uint16_t bits) {
  const bool negative = (bits & 0x8000) != 0;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  if (exponent == 0x1F) {
    // Infinity, or a quiet NaN with the payload in the top mantissa bits.
    const uint32_t payload =
        mantissa == 0 ? 0
                      : 0x00400000u | (static_cast<uint32_t>(mantissa) << 13);
    return (negative ? 0x80000000u : 0) | 0x7F800000u | payload;
  }
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -24)
                               : std::ldexp(mantissa + 1024, exponent - 25);
  return FloatBits(static_cast<float>(negative ? -magnitude : magnitude));
}

// The float patterns that matter most for float16/bfloat16 rounding: zeros,
// the subnormal ranges, values just around every rounding midpoint of every
// float16 and bfloat16 binade, the overflow thresholds, infinities and NaNs,
// both signs.
std::vector<uint32_t> EdgeFloatPatterns() {
  std::vector<uint32_t> patterns;
  auto add_around = [&](uint32_t center, uint32_t radius) {
    for (uint32_t d = 0; d <= radius; ++d) {
      patterns.push_back(center + d);
      patterns.push_back(center - d);
    }
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      const uint32_t base = sign | (exponent << 23);
      // Midpoints for float16 (13 dropped bits) and bfloat16 (16), with an
      // even and an odd kept last bit, plus the binade's ends.
      for (uint32_t kept : {0u, 1u, 2u, 3u, 0x3FEu, 0x3FFu}) {
        add_around(base | (kept << 13) | 0x1000u, 2);
      }
      for (uint32_t kept : {0u, 1u, 2u, 0x7Eu, 0x7Fu}) {
        add_around(base | (kept << 16) | 0x8000u, 2);
      }
      add_around(base, 2);
      add_around(base | 0x007FFFFFu, 2);
    }
    for (uint32_t bits :
         {0x00000001u, 0x00000002u, 0x007FFFFFu, 0x33000000u, 0x33000001u,
          0x337FFFFFu, 0x387FFFFFu, 0x38800000u, 0x38FFF000u, 0x477FEFFFu,
          0x477FF000u, 0x477FF001u, 0x477FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u,
          0x7F7FFFFFu, 0x7F800000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u,
          0x7FC00001u, 0x7FFFFFFFu, 0x7F812345u}) {
      patterns.push_back(sign | bits);
    }
  }
  return patterns;
}

// ---------------------------------------------------------------------------
// Names and parsing.

struct NameCase {
  DType dtype;
  size_t size;
  bool floating_point;
  const char* name;
  const char* torch_name;
  const char* safetensors_name;
  const char* legacy_name;
};

constexpr NameCase kNameCases[] = {
    {DType::kFloat32, 4, true, "float32", "torch.float32", "F32",
     "torch.FloatTensor"},
    {DType::kFloat64, 8, true, "float64", "torch.float64", "F64",
     "torch.DoubleTensor"},
    {DType::kFloat16, 2, true, "float16", "torch.float16", "F16",
     "torch.HalfTensor"},
    {DType::kBFloat16, 2, true, "bfloat16", "torch.bfloat16", "BF16",
     "torch.BFloat16Tensor"},
    {DType::kInt8, 1, false, "int8", "torch.int8", "I8", "torch.CharTensor"},
    {DType::kInt16, 2, false, "int16", "torch.int16", "I16",
     "torch.ShortTensor"},
    {DType::kInt32, 4, false, "int32", "torch.int32", "I32", "torch.IntTensor"},
    {DType::kInt64, 8, false, "int64", "torch.int64", "I64",
     "torch.LongTensor"},
    {DType::kUInt8, 1, false, "uint8", "torch.uint8", "U8", "torch.ByteTensor"},
    {DType::kBool, 1, false, "bool", "torch.bool", "BOOL", "torch.BoolTensor"},
};

TEST(DTypeTest, AllDTypesListsEveryEnumValueInOrder) {
  ASSERT_EQ(std::size(kAllDTypes), static_cast<size_t>(kNumDTypes));
  for (int i = 0; i < kNumDTypes; ++i) {
    EXPECT_EQ(static_cast<int>(kAllDTypes[i]), i);
    EXPECT_EQ(kNameCases[i].dtype, kAllDTypes[i]);
  }
}

TEST(DTypeTest, NamesSizesAndFloatingPointMatchTheHeader) {
  for (const NameCase& c : kNameCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(ElementSize(c.dtype), c.size);
    EXPECT_EQ(IsFloatingPoint(c.dtype), c.floating_point);
    EXPECT_EQ(DTypeName(c.dtype), c.name);
    EXPECT_EQ(TorchDTypeName(c.dtype), c.torch_name);
    EXPECT_EQ(SafetensorsDTypeName(c.dtype), c.safetensors_name);
    EXPECT_EQ(LegacyTensorTypeName(c.dtype), c.legacy_name);
  }
}

TEST(DTypeTest, ParseDTypeAcceptsEverySpelling) {
  for (DType dtype : kAllDTypes) {
    for (absl::string_view text :
         {DTypeName(dtype), TorchDTypeName(dtype), SafetensorsDTypeName(dtype),
          LegacyTensorTypeName(dtype)}) {
      SCOPED_TRACE(text);
      absl::StatusOr<DType> parsed = ParseDType(text);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, dtype);
    }
  }
}

TEST(DTypeTest, ParseDTypeAcceptsTorchAliasesWithAndWithoutPrefix) {
  const std::pair<const char*, DType> aliases[] = {
      {"float", DType::kFloat32}, {"double", DType::kFloat64},
      {"half", DType::kFloat16},  {"long", DType::kInt64},
      {"int", DType::kInt32},     {"short", DType::kInt16},
  };
  for (const auto& [alias, dtype] : aliases) {
    for (const std::string& text :
         {std::string(alias), absl::StrCat("torch.", alias)}) {
      SCOPED_TRACE(text);
      absl::StatusOr<DType> parsed = ParseDType(text);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, dtype);
    }
  }
}

TEST(DTypeTest, ParseDTypeRejectsUnknownNamesWithInvalidArgument) {
  absl::StatusOr<DType> parsed = ParseDType("float17");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("Unknown dtype 'float17'"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("bfloat16"));

  // Near misses: wrong case, whitespace, empty, bare prefix, a spelling
  // from one scheme with another's prefix.
  for (const char* text :
       {"", "Float32", "f32", " float32", "float32 ", "torch.", "torch.F32",
        "torch.torch.float", "FloatTensor", "torch.cfloat", "uint16"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<DType> result = ParseDType(text);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(),
                HasSubstr(absl::StrCat("'", text, "'")));
  }
}

TEST(DTypeTest, ParseDTypeEscapesAndShortensHostileText) {
  absl::StatusOr<DType> parsed = ParseDType(std::string("a\nb\0c", 5));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("'a\\nb\\000c'"));

  const std::string long_text(10000, 'x');
  parsed = ParseDType(long_text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_LT(parsed.status().message().size(), 1000u);
  EXPECT_THAT(parsed.status().message(), HasSubstr("xxx..."));
}

// ---------------------------------------------------------------------------
// float16 / bfloat16 scalar functions and kernels.

TEST(DTypeTest, HalfToFloatMatchesReferenceForAllPatterns) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(65536);
  ConvertElements(halves.data(), DType::kFloat16, floats.data(),
                  DType::kFloat32, 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto bits = static_cast<uint16_t>(i);
    const uint32_t expected = ReferenceHalfToFloatBits(bits);
    ASSERT_EQ(FloatBits(HalfBitsToFloat(bits)), expected) << std::hex << i;
    ASSERT_EQ(FloatBits(floats[i]), expected) << std::hex << i;
  }
}

TEST(DTypeTest, HalfRoundTripsThroughFloatForAllPatterns) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(65536);
  std::vector<uint16_t> back(65536);
  ConvertElements(halves.data(), DType::kFloat16, floats.data(),
                  DType::kFloat32, 65536);
  ConvertElements(floats.data(), DType::kFloat32, back.data(), DType::kFloat16,
                  65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto bits = static_cast<uint16_t>(i);
    // NaNs come back as PyTorch's NaN, 0x7E00, keeping their sign.
    const uint16_t expected =
        IsHalfNaN(bits) ? static_cast<uint16_t>((bits & 0x8000) | 0x7E00)
                        : bits;
    ASSERT_EQ(back[i], expected) << std::hex << i;
    ASSERT_EQ(FloatToHalfBits(HalfBitsToFloat(bits)), expected)
        << std::hex << i;
  }
}

TEST(DTypeTest, BFloat16RoundTripsThroughFloatForAllPatterns) {
  std::vector<uint16_t> values(65536);
  for (uint32_t i = 0; i < 65536; ++i) values[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(65536);
  std::vector<uint16_t> back(65536);
  ConvertElements(values.data(), DType::kBFloat16, floats.data(),
                  DType::kFloat32, 65536);
  ConvertElements(floats.data(), DType::kFloat32, back.data(), DType::kBFloat16,
                  65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto bits = static_cast<uint16_t>(i);
    // Widening is a plain shift, NaN payloads and signalling NaNs included.
    ASSERT_EQ(FloatBits(floats[i]), i << 16) << std::hex << i;
    ASSERT_EQ(FloatBits(BFloat16BitsToFloat(bits)), i << 16) << std::hex << i;
    // Every NaN comes back as c10's 0x7FC0, whatever its sign.
    const uint16_t expected = IsBFloat16NaN(bits) ? 0x7FC0 : bits;
    ASSERT_EQ(back[i], expected) << std::hex << i;
    ASSERT_EQ(FloatToBFloat16Bits(BFloat16BitsToFloat(bits)), expected)
        << std::hex << i;
  }
}

TEST(DTypeTest, ScalarFloatToHalfMatchesReferenceOnEdgeCases) {
  struct Case {
    uint32_t float_bits;
    uint16_t half_bits;
  };
  const Case cases[] = {
      {0x00000000, 0x0000},  // +0
      {0x80000000, 0x8000},  // -0
      {0x3F800000, 0x3C00},  // 1
      {0x3F801000, 0x3C00},  // 1 + 2^-11: tie, 1's last bit is even
      {0x3F803000, 0x3C02},  // 1 + 3 * 2^-11: tie, rounds up to even
      {0x3F801001, 0x3C01},  // just above the tie
      {0x3F807FFF, 0x3C04},  // rounds up within the binade
      {0x3FFFF000, 0x4000},  // 2 - 2^-11: tie rounds up into the next binade
      {0x477FE000, 0x7BFF},  // 65504, the largest float16
      {0x477FEFFF, 0x7BFF},  // just below the overflow midpoint
      {0x477FF000, 0x7C00},  // 65520: tie, rounds to even = infinity
      {0xC77FF000, 0xFC00},  // -65520
      {0x7F7FFFFF, 0x7C00},  // FLT_MAX
      {0x7F800000, 0x7C00},  // inf
      {0xFF800000, 0xFC00},  // -inf
      {0x33800000, 0x0001},  // 2^-24, the smallest subnormal
      {0x33000000, 0x0000},  // 2^-25: tie with 0, rounds to even 0
      {0xB3000000, 0x8000},  // -2^-25 keeps its sign
      {0x33000001, 0x0001},  // just above 2^-25
      {0x33C00000, 0x0002},  // 1.5 * 2^-24: tie, rounds to even 2
      {0x34200000, 0x0002},  // 2.5 * 2^-24: tie, rounds to even 2
      {0x387FC000, 0x03FF},  // largest subnormal
      {0x387FE000, 0x0400},  // tie above it: rounds into the normals
      {0x38800000, 0x0400},  // 2^-14, the smallest normal
      {0x00000001, 0x0000},  // float subnormal
      {0x7FC00000, 0x7E00},  // NaN
      {0xFFC00000, 0xFE00},  // -NaN keeps its sign
      {0x7F800001, 0x7E00},  // signalling NaN
      {0x7F802000, 0x7E00},  // NaN whose payload F16C would keep
      {0xFFFFFFFF, 0xFE00},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(absl::Hex(c.float_bits)));
    EXPECT_EQ(FloatToHalfBits(BitsFloat(c.float_bits)), c.half_bits);
    EXPECT_EQ(ReferenceFloatToHalf(BitsFloat(c.float_bits)), c.half_bits);
  }
}

TEST(DTypeTest, ScalarFloatToBFloat16MatchesReferenceOnEdgeCases) {
  struct Case {
    uint32_t float_bits;
    uint16_t bfloat16_bits;
  };
  const Case cases[] = {
      {0x00000000, 0x0000}, {0x80000000, 0x8000},
      {0x3F808000, 0x3F80},  // tie, even stays
      {0x3F818000, 0x3F82},  // tie, odd rounds up
      {0x3F808001, 0x3F81},  // above the tie
      {0x3FFF8000, 0x4000},  // tie rounds up into the next binade
      {0x7F7F7FFF, 0x7F7F},  // largest finite that stays finite
      {0x7F7F8000, 0x7F80},  // tie at the top: rounds to infinity
      {0x7F7FFFFF, 0x7F80},  // FLT_MAX -> inf
      {0xFF7FFFFF, 0xFF80}, {0x7F800000, 0x7F80},
      {0xFF800000, 0xFF80}, {0x00000001, 0x0000},  // smallest float subnormal
      {0x00008000, 0x0000},                        // tie with 0
      {0x00008001, 0x0001}, {0x00018000, 0x0002},
      {0x007FFFFF, 0x0080},  // largest float subnormal rounds into normals
      {0x7FC00000, 0x7FC0}, {0xFFC00000, 0x7FC0},  // sign dropped
      {0x7F800001, 0x7FC0}, {0x7FFFFFFF, 0x7FC0},
      {0xFFFFFFFF, 0x7FC0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(absl::Hex(c.float_bits)));
    EXPECT_EQ(FloatToBFloat16Bits(BitsFloat(c.float_bits)), c.bfloat16_bits);
    EXPECT_EQ(ReferenceFloatToBFloat16(BitsFloat(c.float_bits)),
              c.bfloat16_bits);
  }
}

TEST(DTypeTest, ScalarConversionsMatchReferenceOnEdgePatternsAndRandomSample) {
  std::vector<uint32_t> patterns = EdgeFloatPatterns();
  std::mt19937 rng(20240611);
  for (int i = 0; i < 4000000; ++i) patterns.push_back(rng());
  // Values of float16's own range are under-represented in random bits.
  std::uniform_int_distribution<uint32_t> half_range(0x33000000u, 0x47800000u);
  for (int i = 0; i < 2000000; ++i) {
    patterns.push_back(half_range(rng) | (rng() & 0x80000000u));
  }
  int64_t failures = 0;
  for (uint32_t bits : patterns) {
    const float value = BitsFloat(bits);
    const uint16_t half = FloatToHalfBits(value);
    const uint16_t bf16 = FloatToBFloat16Bits(value);
    if (half != ReferenceFloatToHalf(value) ||
        bf16 != ReferenceFloatToBFloat16(value)) {
      ADD_FAILURE() << "float bits 0x" << std::hex << bits << ": half 0x"
                    << half << " (reference 0x" << ReferenceFloatToHalf(value)
                    << "), bfloat16 0x" << bf16 << " (reference 0x"
                    << ReferenceFloatToBFloat16(value) << ")";
      if (++failures >= 10) return;
    }
  }
}

// Patterns start, start + stride, ... below `end` whose ConvertElements
// (SIMD) result differs from the scalar kernels (plain loops over the scalar
// functions), at most 10. Runs on its own thread.
std::vector<uint32_t> SweepFloatPatterns(uint64_t start, uint64_t end,
                                         uint64_t stride) {
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint32_t> bits(kChunk);
  std::vector<uint16_t> half(kChunk), want_half(kChunk);
  std::vector<uint16_t> bf16(kChunk), want_bf16(kChunk);
  std::vector<uint32_t> mismatches;
  for (uint64_t chunk = start; chunk < end; chunk += kChunk * stride) {
    size_t n = 0;
    for (uint64_t p = chunk; p < end && n < kChunk; p += stride) {
      bits[n++] = static_cast<uint32_t>(p);
    }
    const auto count = static_cast<int64_t>(n);
    const void* floats = bits.data();
    ConvertElements(floats, DType::kFloat32, half.data(), DType::kFloat16,
                    count);
    ConvertElements(floats, DType::kFloat32, bf16.data(), DType::kBFloat16,
                    count);
    internal::FloatToHalfScalar(floats, want_half.data(), count);
    internal::FloatToBFloat16Scalar(floats, want_bf16.data(), count);
    if (std::memcmp(half.data(), want_half.data(), 2 * n) == 0 &&
        std::memcmp(bf16.data(), want_bf16.data(), 2 * n) == 0) {
      continue;
    }
    for (size_t i = 0; i < n && mismatches.size() < 10; ++i) {
      if (half[i] != want_half[i] || bf16[i] != want_bf16[i]) {
        mismatches.push_back(bits[i]);
      }
    }
    if (mismatches.size() >= 10) break;
  }
  return mismatches;
}

// All 2^32 float32 patterns take about 3.6 s on the 2-core dev machine in a
// RelWithDebInfo build, split over two threads (about 8 s on one; up to 7 s
// on two when the machine is busy), so optimised builds sweep them all.
// Sanitizer and -O0 builds are 50-100x slower (every 7th pattern takes a
// minute under clang's ASan+UBSan at -O0), so they sweep every 127th
// pattern. Both also run the edge patterns (rounding midpoints of every
// binade, subnormals, overflow, infinities, NaNs, +-0).
// MODELSTATE_DTYPE_SWEEP=full|strided|sparse (stride 1, 7, 127) overrides.
uint64_t SweepStride() {
  if (const char* mode = std::getenv("MODELSTATE_DTYPE_SWEEP")) {
    const std::string name(mode);
    if (name == "full") return 1;
    if (name == "strided") return 7;
    if (name == "sparse") return 127;
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return 127;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(undefined_behavior_sanitizer)
  return 127;
#endif
#endif
#if !defined(__OPTIMIZE__)
  return 127;
#else
  return 1;
#endif
}

TEST(DTypeTest, VectorFloatToHalfAndBFloat16MatchScalarForAllFloatPatterns) {
  const auto start_time = std::chrono::steady_clock::now();
  const uint64_t stride = SweepStride();
  constexpr uint64_t kEnd = uint64_t{1} << 32;
  // Two halves, the first a multiple of the stride long, so together they
  // visit exactly the patterns 0, stride, 2 * stride, ...
  const uint64_t middle = (kEnd / 2) / stride * stride;
  std::vector<uint32_t> upper_mismatches;
  std::thread upper(
      [&] { upper_mismatches = SweepFloatPatterns(middle, kEnd, stride); });
  std::vector<uint32_t> mismatches = SweepFloatPatterns(0, middle, stride);
  upper.join();
  mismatches.insert(mismatches.end(), upper_mismatches.begin(),
                    upper_mismatches.end());

  // The strided sweep misses most rounding boundaries; cover them too.
  const std::vector<uint32_t> edges = EdgeFloatPatterns();
  std::vector<uint16_t> half(edges.size());
  std::vector<uint16_t> bf16(edges.size());
  ConvertElements(edges.data(), DType::kFloat32, half.data(), DType::kFloat16,
                  static_cast<int64_t>(edges.size()));
  ConvertElements(edges.data(), DType::kFloat32, bf16.data(), DType::kBFloat16,
                  static_cast<int64_t>(edges.size()));
  for (size_t i = 0; i < edges.size(); ++i) {
    const float value = BitsFloat(edges[i]);
    if (half[i] != FloatToHalfBits(value) ||
        bf16[i] != FloatToBFloat16Bits(value)) {
      mismatches.push_back(edges[i]);
    }
  }
  // (A single element would take the scalar tail, so only the scalar side
  // is shown; the pattern identifies the failure.)
  for (size_t i = 0; i < mismatches.size() && i < 20; ++i) {
    const float value = BitsFloat(mismatches[i]);
    ADD_FAILURE() << "SIMD and scalar differ for float bits 0x" << std::hex
                  << mismatches[i] << "; scalar half 0x"
                  << FloatToHalfBits(value) << ", scalar bfloat16 0x"
                  << FloatToBFloat16Bits(value);
  }
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start_time)
                             .count();
  std::printf("[ sweep    ] float32 patterns with stride %d: %.1f s\n",
              static_cast<int>(stride), seconds);
}

TEST(DTypeTest, SimdKernelsAreSelectedWhenTheCpuHasThem) {
  const internal::HalfKernels& kernels = internal::SelectedHalfKernels();
  if (internal::CpuHasAvx2F16C()) {
    EXPECT_EQ(kernels.float_to_half, &internal::FloatToHalfF16C);
    EXPECT_EQ(kernels.half_to_float, &internal::HalfToFloatF16C);
  } else {
    EXPECT_EQ(kernels.float_to_half, &internal::FloatToHalfScalar);
    EXPECT_EQ(kernels.half_to_float, &internal::HalfToFloatScalar);
  }
  if (internal::CpuHasAvx2()) {
    EXPECT_EQ(kernels.float_to_bfloat16, &internal::FloatToBFloat16Avx2);
    EXPECT_EQ(kernels.bfloat16_to_float, &internal::BFloat16ToFloatAvx2);
  } else {
    EXPECT_EQ(kernels.float_to_bfloat16, &internal::FloatToBFloat16Scalar);
    EXPECT_EQ(kernels.bfloat16_to_float, &internal::BFloat16ToFloatScalar);
  }
}

// Every kernel, SIMD (when available) and scalar, at every length around the
// 8- and 16-element vector steps and at unaligned addresses, against the
// scalar functions; the elements around the destination must stay untouched.
TEST(DTypeTest, KernelsHandleTailsAndUnalignedPointers) {
  std::mt19937 rng(7);
  std::vector<uint32_t> pool = EdgeFloatPatterns();
  for (int i = 0; i < 2000; ++i) pool.push_back(rng());
  std::shuffle(pool.begin(), pool.end(), rng);

  std::vector<std::pair<internal::NarrowKernel, uint16_t (*)(float)>>
      narrowing = {
          {internal::FloatToHalfScalar, FloatToHalfBits},
          {internal::FloatToBFloat16Scalar, FloatToBFloat16Bits},
      };
  std::vector<std::pair<internal::WidenKernel, float (*)(uint16_t)>> widening =
      {
          {internal::HalfToFloatScalar, HalfBitsToFloat},
          {internal::BFloat16ToFloatScalar, BFloat16BitsToFloat},
      };
  // ConvertElements itself, whichever kernels it selected.
  narrowing.push_back({+[](const void* src, void* dst, int64_t n) {
                         ConvertElements(src, DType::kFloat32, dst,
                                         DType::kFloat16, n);
                       },
                       FloatToHalfBits});
  narrowing.push_back({+[](const void* src, void* dst, int64_t n) {
                         ConvertElements(src, DType::kFloat32, dst,
                                         DType::kBFloat16, n);
                       },
                       FloatToBFloat16Bits});
  widening.push_back({+[](const void* src, void* dst, int64_t n) {
                        ConvertElements(src, DType::kFloat16, dst,
                                        DType::kFloat32, n);
                      },
                      HalfBitsToFloat});
  widening.push_back({+[](const void* src, void* dst, int64_t n) {
                        ConvertElements(src, DType::kBFloat16, dst,
                                        DType::kFloat32, n);
                      },
                      BFloat16BitsToFloat});
  if (internal::CpuHasAvx2F16C()) {
    narrowing.push_back({internal::FloatToHalfF16C, FloatToHalfBits});
    widening.push_back({internal::HalfToFloatF16C, HalfBitsToFloat});
  }
  if (internal::CpuHasAvx2()) {
    narrowing.push_back({internal::FloatToBFloat16Avx2, FloatToBFloat16Bits});
    widening.push_back({internal::BFloat16ToFloatAvx2, BFloat16BitsToFloat});
  }

  constexpr uint16_t kCanary16 = 0xA5A5;
  constexpr uint32_t kCanary32 = 0xDEADBEEF;
  for (int64_t length : {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 1003}) {
    for (int64_t offset : {0, 1, 3}) {
      SCOPED_TRACE(absl::StrCat("length ", length, " offset ", offset));
      // Byte buffers so that `offset` misaligns even the element type.
      std::vector<unsigned char> src(4 * (length + 8));
      std::vector<unsigned char> dst(4 * (length + 8));
      for (int64_t i = 0; i < length + 2; ++i) {
        StoreBits(&src[offset + 4 * i], 4, pool[i % pool.size()]);
      }
      for (const auto& [kernel, scalar] : narrowing) {
        std::memset(dst.data(), 0xA5, dst.size());
        kernel(&src[offset], &dst[offset], length);
        for (int64_t i = 0; i < length; ++i) {
          const auto in =
              static_cast<uint32_t>(LoadBits(&src[offset + 4 * i], 4));
          ASSERT_EQ(LoadBits(&dst[offset + 2 * i], 2), scalar(BitsFloat(in)))
              << "element " << i;
        }
        ASSERT_EQ(LoadBits(&dst[offset + 2 * length], 2), kCanary16);
      }
      for (int64_t i = 0; i < length + 2; ++i) {
        StoreBits(&src[offset + 2 * i], 2, pool[i % pool.size()] >> 7);
      }
      for (const auto& [kernel, scalar] : widening) {
        std::memset(dst.data(), 0xEF, dst.size());
        StoreBits(&dst[offset + 4 * length], 4, kCanary32);
        kernel(&src[offset], &dst[offset], length);
        for (int64_t i = 0; i < length; ++i) {
          const auto in =
              static_cast<uint16_t>(LoadBits(&src[offset + 2 * i], 2));
          ASSERT_EQ(LoadBits(&dst[offset + 4 * i], 4), FloatBits(scalar(in)))
              << "element " << i;
        }
        ASSERT_EQ(LoadBits(&dst[offset + 4 * length], 4), kCanary32);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Every dtype pair against PyTorch.

struct TorchVector {
  DType src;
  DType dst;
  uint64_t src_bits;
  uint64_t dst_bits;
};

constexpr TorchVector kTorchVectors[] = {
#include "tests/core/dtype_vectors.inc"
};

TEST(DTypeTest, EveryPairMatchesTorchElementByElement) {
  std::set<std::pair<DType, DType>> pairs;
  for (const TorchVector& v : kTorchVectors) {
    pairs.insert({v.src, v.dst});
    unsigned char src[8];
    unsigned char dst[8];
    StoreBits(src, ElementSize(v.src), v.src_bits);
    ConvertElements(src, v.src, dst, v.dst, 1);
    EXPECT_EQ(LoadBits(dst, ElementSize(v.dst)), v.dst_bits)
        << DTypeName(v.src) << " 0x" << std::hex << v.src_bits << " -> "
        << DTypeName(v.dst);
  }
  EXPECT_EQ(pairs.size(), static_cast<size_t>(kNumDTypes * kNumDTypes));
}

// The same vectors as one array per pair, repeated to cross the vector
// bodies and tails, from an unaligned source and to an unaligned
// destination.
TEST(DTypeTest, EveryPairMatchesTorchAsUnalignedArrays) {
  std::map<std::pair<DType, DType>, std::vector<const TorchVector*>> by_pair;
  for (const TorchVector& v : kTorchVectors) {
    by_pair[{v.src, v.dst}].push_back(&v);
  }
  for (const auto& [pair, vectors] : by_pair) {
    const auto [src_dtype, dst_dtype] = pair;
    SCOPED_TRACE(
        absl::StrCat(DTypeName(src_dtype), " -> ", DTypeName(dst_dtype)));
    const size_t src_size = ElementSize(src_dtype);
    const size_t dst_size = ElementSize(dst_dtype);
    const size_t count = vectors.size() * 3 + 5;
    std::vector<unsigned char> src(src_size * count + 1);
    std::vector<unsigned char> dst(dst_size * count + 1);
    for (size_t i = 0; i < count; ++i) {
      StoreBits(&src[1 + i * src_size], src_size,
                vectors[i % vectors.size()]->src_bits);
    }
    ConvertElements(&src[1], src_dtype, &dst[1], dst_dtype,
                    static_cast<int64_t>(count));
    for (size_t i = 0; i < count; ++i) {
      const TorchVector& v = *vectors[i % vectors.size()];
      ASSERT_EQ(LoadBits(&dst[1 + i * dst_size], dst_size), v.dst_bits)
          << "element " << i << " source 0x" << std::hex << v.src_bits;
    }
  }
}

TEST(DTypeTest, TorchVectorsCoverDoubleRoundingAndBoolCases) {
  // Spot checks that the table holds the facts the header states, so a
  // regenerated table cannot silently lose them.
  auto find = [](DType src, DType dst, uint64_t src_bits) -> int64_t {
    for (const TorchVector& v : kTorchVectors) {
      if (v.src == src && v.dst == dst && v.src_bits == src_bits) {
        return static_cast<int64_t>(v.dst_bits);
      }
    }
    return -1;
  };
  // float64 1 + 2^-11 + 2^-40 -> float16 1.0 (via float32), not 0x3C01.
  EXPECT_EQ(find(DType::kFloat64, DType::kFloat16, 0x3FF0020000001000), 0x3C00);
  // int64 2^31 + 2^23 + 1 -> bfloat16 2^31 (via float32), not 0x4F01.
  EXPECT_EQ(find(DType::kInt64, DType::kBFloat16, 0x80800001), 0x4F00);
  // float32 -1.0 -> uint8 255 (through int64); -2.7 -> int32 -2.
  EXPECT_EQ(find(DType::kFloat32, DType::kUInt8, 0xBF800000), 0xFF);
  EXPECT_EQ(find(DType::kFloat32, DType::kInt32, 0xC02CCCCD), 0xFFFFFFFE);
  // NaN -> bool is true; -0.0 -> bool is false; int64 256 -> bool true.
  EXPECT_EQ(find(DType::kFloat32, DType::kBool, 0x7FC00000), 1);
  EXPECT_EQ(find(DType::kFloat32, DType::kBool, 0x80000000), 0);
  EXPECT_EQ(find(DType::kInt64, DType::kBool, 256), 1);
  // Wrap-around: int16 257 -> int8 1, uint8 200 -> int8 -56.
  EXPECT_EQ(find(DType::kInt16, DType::kInt8, 257), 1);
  EXPECT_EQ(find(DType::kUInt8, DType::kInt8, 200), 0xC8);
  // NaN -> float16 keeps the sign, -> bfloat16 does not.
  EXPECT_EQ(find(DType::kFloat32, DType::kFloat16, 0xFFC00000), 0xFE00);
  EXPECT_EQ(find(DType::kFloat32, DType::kBFloat16, 0xFFC00000), 0x7FC0);
  EXPECT_EQ(find(DType::kFloat64, DType::kBFloat16, 0xFFF8000000000000),
            0x7FC0);
}

// ---------------------------------------------------------------------------
// Our rule where PyTorch is undefined: NaN -> 0, saturate to int64, wrap.

template <typename T>
T ConvertOne(double value, DType dst) {
  T out;
  ConvertElements(&value, DType::kFloat64, &out, dst, 1);
  return out;
}

TEST(DTypeTest, FloatToIntOutsideTorchsDefinedRangeSaturatesThenWraps) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (double value : {nan, -nan}) {
    EXPECT_EQ(ConvertOne<int8_t>(value, DType::kInt8), 0);
    EXPECT_EQ(ConvertOne<int16_t>(value, DType::kInt16), 0);
    EXPECT_EQ(ConvertOne<int32_t>(value, DType::kInt32), 0);
    EXPECT_EQ(ConvertOne<int64_t>(value, DType::kInt64), 0);
    EXPECT_EQ(ConvertOne<uint8_t>(value, DType::kUInt8), 0);
  }
  // Above int64: INT64_MAX, whose low bits are all ones.
  for (double value : {inf, 1e20, 0x1p63}) {
    EXPECT_EQ(ConvertOne<int8_t>(value, DType::kInt8), -1);
    EXPECT_EQ(ConvertOne<int16_t>(value, DType::kInt16), -1);
    EXPECT_EQ(ConvertOne<int32_t>(value, DType::kInt32), -1);
    EXPECT_EQ(ConvertOne<int64_t>(value, DType::kInt64), kMax);
    EXPECT_EQ(ConvertOne<uint8_t>(value, DType::kUInt8), 255);
  }
  // Below int64: INT64_MIN, whose low bits are all zeros.
  for (double value : {-inf, -1e20, -0x1p64}) {
    EXPECT_EQ(ConvertOne<int8_t>(value, DType::kInt8), 0);
    EXPECT_EQ(ConvertOne<int32_t>(value, DType::kInt32), 0);
    EXPECT_EQ(ConvertOne<int64_t>(value, DType::kInt64), kMin);
    EXPECT_EQ(ConvertOne<uint8_t>(value, DType::kUInt8), 0);
  }
  // -2^63 itself is in range.
  EXPECT_EQ(ConvertOne<int64_t>(-0x1p63, DType::kInt64), kMin);
  // Inside int64 but outside the target: truncate, then wrap.
  EXPECT_EQ(ConvertOne<int8_t>(200.7, DType::kInt8), -56);
  EXPECT_EQ(ConvertOne<int8_t>(-129.9, DType::kInt8), 127);
  EXPECT_EQ(ConvertOne<int16_t>(65537.5, DType::kInt16), 1);
  EXPECT_EQ(ConvertOne<int32_t>(3e9, DType::kInt32), -1294967296);
  EXPECT_EQ(ConvertOne<int32_t>(0x1p32 + 5, DType::kInt32), 5);
  EXPECT_EQ(ConvertOne<int32_t>(-0x1p40 - 7.5, DType::kInt32), -7);

  // The same rule from float32, float16 and bfloat16 sources.
  const float float_values[] = {std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), 3e9f,
                                1e30f};
  int32_t ints[5];
  ConvertElements(float_values, DType::kFloat32, ints, DType::kInt32, 5);
  EXPECT_THAT(ints, ::testing::ElementsAre(0, -1, 0, -1294967296, -1));
  const uint16_t halves[] = {0x7E00, 0x7C00, 0xFC00, 0x7BFF};  // nan inf -inf
  int8_t small[4];
  ConvertElements(halves, DType::kFloat16, small, DType::kInt8, 4);
  EXPECT_THAT(small, ::testing::ElementsAre(0, -1, 0, -32));  // 65504 wraps
  const uint16_t bfloat16s[] = {0xFFC0, 0x7F80, 0x5F80, 0xDF00};
  uint8_t bytes[4];
  ConvertElements(bfloat16s, DType::kBFloat16, bytes, DType::kUInt8, 4);
  // NaN, inf, 2^64 (beyond int64), -2^63 (exactly INT64_MIN).
  EXPECT_THAT(bytes, ::testing::ElementsAre(0, 255, 255, 0));
}

TEST(DTypeTest, BoolBytesOtherThanZeroAndOneReadAsTrue) {
  const uint8_t bools[] = {0, 1, 2, 255};
  float floats[4];
  ConvertElements(bools, DType::kBool, floats, DType::kFloat32, 4);
  EXPECT_THAT(floats, ::testing::ElementsAre(0.0f, 1.0f, 1.0f, 1.0f));
  uint16_t halves[4];
  ConvertElements(bools, DType::kBool, halves, DType::kFloat16, 4);
  EXPECT_THAT(halves, ::testing::ElementsAre(0, 0x3C00, 0x3C00, 0x3C00));
  int64_t longs[4];
  ConvertElements(bools, DType::kBool, longs, DType::kInt64, 4);
  EXPECT_THAT(longs, ::testing::ElementsAre(0, 1, 1, 1));
}

TEST(DTypeTest, SameDTypeCopiesBitsUnchanged) {
  const uint32_t nan_bits[] = {0x7F800001, 0xFFC12345, 0x3F800000};
  uint32_t out[3] = {};
  ConvertElements(nan_bits, DType::kFloat32, out, DType::kFloat32, 3);
  EXPECT_THAT(out, ::testing::ElementsAreArray(nan_bits));
  const uint16_t half_nans[] = {0x7C01, 0xFD55};
  uint16_t half_out[2] = {};
  ConvertElements(half_nans, DType::kFloat16, half_out, DType::kFloat16, 2);
  EXPECT_THAT(half_out, ::testing::ElementsAreArray(half_nans));
  // Converting in place to the same dtype is a no-op.
  uint16_t in_place[] = {0x7C01, 0x1234};
  ConvertElements(in_place, DType::kBFloat16, in_place, DType::kBFloat16, 2);
  EXPECT_THAT(in_place, ::testing::ElementsAre(0x7C01, 0x1234));
}

TEST(DTypeTest, LongArraysOfEveryPairMatchElementByElementConversion) {
  // 1003 elements: several chunks of the vector kernels and a tail, and
  // crossing float16/bfloat16 pairs go through the float32 staging buffer
  // more than once at 3000 elements.
  std::mt19937_64 rng(99);
  for (int64_t count : {int64_t{1003}, int64_t{3000}}) {
    for (DType src_dtype : kAllDTypes) {
      const size_t src_size = ElementSize(src_dtype);
      std::vector<unsigned char> src(src_size * count);
      for (int64_t i = 0; i < count; ++i) {
        uint64_t bits = rng();
        if (src_dtype == DType::kBool) bits &= 1;
        // Keep floats within int64 range half the time so integer
        // destinations see ordinary values too.
        if (src_dtype == DType::kFloat64 && (bits & 1)) {
          bits = std::bit_cast<uint64_t>(
              static_cast<double>(static_cast<int32_t>(bits >> 32)) / 7.0);
        }
        StoreBits(&src[i * src_size], src_size, bits);
      }
      for (DType dst_dtype : kAllDTypes) {
        SCOPED_TRACE(absl::StrCat(DTypeName(src_dtype), " -> ",
                                  DTypeName(dst_dtype), " x", count));
        const size_t dst_size = ElementSize(dst_dtype);
        std::vector<unsigned char> bulk(dst_size * count);
        std::vector<unsigned char> single(dst_size * count);
        ConvertElements(src.data(), src_dtype, bulk.data(), dst_dtype, count);
        for (int64_t i = 0; i < count; ++i) {
          ConvertElements(&src[i * src_size], src_dtype, &single[i * dst_size],
                          dst_dtype, 1);
        }
        ASSERT_EQ(bulk, single);
      }
    }
  }
}

TEST(DTypeTest, ReadAndWriteElementAsDouble) {
  const float floats[] = {1.5f, -2.25f, std::numeric_limits<float>::infinity()};
  EXPECT_EQ(ReadElementAsDouble(floats, DType::kFloat32, 1), -2.25);
  EXPECT_TRUE(std::isinf(ReadElementAsDouble(floats, DType::kFloat32, 2)));
  const uint16_t halves[] = {0x3C00, 0x7E00, 0x0001};
  EXPECT_EQ(ReadElementAsDouble(halves, DType::kFloat16, 0), 1.0);
  EXPECT_TRUE(std::isnan(ReadElementAsDouble(halves, DType::kFloat16, 1)));
  EXPECT_EQ(ReadElementAsDouble(halves, DType::kFloat16, 2), 0x1p-24);
  const uint16_t bf16[] = {0x4049};  // 3.140625
  EXPECT_EQ(ReadElementAsDouble(bf16, DType::kBFloat16, 0), 3.140625);
  const int64_t longs[] = {0, std::numeric_limits<int64_t>::min()};
  EXPECT_EQ(ReadElementAsDouble(longs, DType::kInt64, 1), -0x1p63);
  const uint8_t bools[] = {0, 1};
  EXPECT_EQ(ReadElementAsDouble(bools, DType::kBool, 1), 1.0);

  uint16_t half_out[3] = {};
  WriteElementFromDouble(half_out, DType::kFloat16, 1, 1 + 0x1p-11 + 0x1p-40);
  EXPECT_THAT(half_out, ::testing::ElementsAre(0, 0x3C00, 0));  // via float32
  WriteElementFromDouble(half_out, DType::kFloat16, 2, -1e9);
  EXPECT_EQ(half_out[2], 0xFC00);
  int8_t bytes[2] = {};
  WriteElementFromDouble(bytes, DType::kInt8, 1, -2.9);
  EXPECT_THAT(bytes, ::testing::ElementsAre(0, -2));
  uint8_t flags[2] = {};
  WriteElementFromDouble(flags, DType::kBool, 0,
                         std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(flags, ::testing::ElementsAre(1, 0));
  double doubles[1];
  WriteElementFromDouble(doubles, DType::kFloat64, 0, 0.1);
  EXPECT_EQ(doubles[0], 0.1);
}

TEST(DTypeTest, ZeroCountTouchesNothing) {
  for (DType src : kAllDTypes) {
    for (DType dst : kAllDTypes) {
      // Null pointers are fine for an empty conversion.
      ConvertElements(nullptr, src, nullptr, dst, 0);
    }
  }
}

}  // namespace
}  // namespace modelstate
