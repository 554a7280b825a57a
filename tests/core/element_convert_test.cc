// The per-element conversion rules the CUDA kernels (and the emulated
// device) run, checked against ConvertElements, the CPU's vectorised
// conversion, for every dtype pair: every bit pattern of the 1- and 2-byte
// dtypes, and special plus random patterns of the 4- and 8-byte ones.
#include "core/internal/element_convert.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

// Every pattern for narrow dtypes; for wide ones, the edges (zeros,
// infinities, NaNs with payloads, integer limits, rounding boundaries of
// float16/bfloat16 and of int64) and random bytes.
std::string InputsFor(DType dtype) {
  const size_t size = ElementSize(dtype);
  std::string bytes;
  if (size <= 2) {
    const uint32_t patterns = 1u << (8 * size);
    bytes.resize(patterns * size);
    for (uint32_t i = 0; i < patterns; ++i) {
      std::memcpy(bytes.data() + i * size, &i, size);
    }
    return bytes;
  }
  auto add = [&](const auto& value) {
    static_assert(sizeof(value) == 4 || sizeof(value) == 8);
    if (sizeof(value) == size) {
      bytes.append(reinterpret_cast<const char*>(&value), size);
    }
  };
  for (float f :
       {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 65519.99f, 65520.0f, 5.96e-8f,
        2.98e-8f, 1e-45f, 3.4e38f, 9.2233715e18f, -9.2233715e18f, 2147483648.0f,
        0.5f, 2.5f, -2.5f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    add(f);
  }
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FA5A5A5u,
                       0xFF812345u, 0x7FFFFFFFu}) {
    add(nan);
  }
  for (double d :
       {0.0, -0.0, 1.0, -1.5, 65519.999999, 65520.0, 9223372036854775807.0,
        -9223372036854775808.0, 1e300, -1e300, 3.4028235677973366e38, 1.4e-45,
        1e-320, std::numeric_limits<double>::infinity()}) {
    add(d);
  }
  for (uint64_t nan : {0x7FF8000000000000ull, 0xFFF8000000000001ull,
                       0x7FF0000000000001ull, 0x7FF4A5A5A5A5A5A5ull}) {
    add(nan);
  }
  for (int64_t i : {int64_t{0}, int64_t{-1}, int64_t{16777217},
                    std::numeric_limits<int64_t>::max(),
                    std::numeric_limits<int64_t>::min()}) {
    add(i);
  }
  for (int32_t i : {0, -1, 16777217, std::numeric_limits<int32_t>::max(),
                    std::numeric_limits<int32_t>::min()}) {
    add(i);
  }
  std::mt19937_64 random(static_cast<uint64_t>(dtype) + 42);
  for (int i = 0; i < 200000; ++i) add(random());
  if (size == 4) {
    // Random values in float16's and bfloat16's ranges, where rounding
    // happens (random bits are mostly huge or tiny).
    std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
    for (int i = 0; i < 100000; ++i) add(near(random));
  }
  return bytes;
}

template <typename Dst, typename Src>
std::string ConvertOneByOne(const std::string& input) {
  const size_t count = input.size() / sizeof(Src);
  std::string out(count * sizeof(Dst), '\0');
  for (size_t i = 0; i < count; ++i) {
    Src value;
    std::memcpy(&value, input.data() + i * sizeof(Src), sizeof(Src));
    const Dst converted = internal::ConvertOne<Dst, Src>(value);
    std::memcpy(out.data() + i * sizeof(Dst), &converted, sizeof(Dst));
  }
  return out;
}

TEST(ElementConvertTest, ConvertOneMatchesConvertElementsForEveryPair) {
  for (DType src : kAllDTypes) {
    const std::string input = InputsFor(src);
    const int64_t count = static_cast<int64_t>(input.size() / ElementSize(src));
    for (DType dst : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(src), " -> ", DTypeName(dst)));
      std::string want(static_cast<size_t>(count) * ElementSize(dst), '\0');
      ConvertElements(input.data(), src, want.data(), dst, count);
      std::string got;
      internal::VisitElementType(static_cast<int>(src), [&](auto s) {
        internal::VisitElementType(static_cast<int>(dst), [&](auto d) {
          got = ConvertOneByOne<decltype(d), decltype(s)>(input);
        });
      });
      ASSERT_EQ(got.size(), want.size());
      const size_t dst_size = ElementSize(dst);
      for (int64_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(i) * dst_size;
        if (std::memcmp(got.data() + at, want.data() + at, dst_size) != 0) {
          ADD_FAILURE() << "element " << i << " differs";
          break;
        }
      }
    }
  }
}

// The device spells out float <-> double for NaNs (GPUs give a canonical
// NaN); the spelled-out forms must equal the CPU's run-time conversion.
TEST(ElementConvertTest, SpelledOutNaNConversionsMatchTheCpu) {
  for (uint32_t bits :
       {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFFA5A5A5u, 0x7FFFFFFFu}) {
    float f;
    std::memcpy(&f, &bits, 4);
    double widened;
    ConvertElements(&f, DType::kFloat32, &widened, DType::kFloat64, 1);
    EXPECT_EQ(internal::BitCast<uint64_t>(internal::FloatNaNToDouble(f)),
              internal::BitCast<uint64_t>(widened))
        << std::hex << bits;
  }
  for (uint64_t bits : {0x7FF8000000000000ull, 0xFFF0000000000001ull,
                        0x7FF4A5A5A5A5A5A5ull, 0xFFFFFFFFFFFFFFFFull}) {
    double d;
    std::memcpy(&d, &bits, 8);
    float narrowed;
    ConvertElements(&d, DType::kFloat64, &narrowed, DType::kFloat32, 1);
    EXPECT_EQ(internal::BitCast<uint32_t>(internal::DoubleNaNToFloat(d)),
              internal::BitCast<uint32_t>(narrowed))
        << std::hex << bits;
  }
}

TEST(ElementConvertTest, VisitElementTypeRejectsUnknownNumbers) {
  int visited = 0;
  EXPECT_FALSE(internal::VisitElementType(10, [&](auto) { ++visited; }));
  EXPECT_FALSE(internal::VisitElementType(-1, [&](auto) { ++visited; }));
  EXPECT_TRUE(internal::VisitElementType(9, [&](auto) { ++visited; }));
  EXPECT_EQ(visited, 1);
}

}  // namespace
}  // namespace modelstate
