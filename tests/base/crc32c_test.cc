#include "base/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

// Bytes that are not a repeating pattern, so a stretch joined in the wrong
// place or order changes the result.
std::string NoisyBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

TEST(Crc32cTest, MatchesTheStandardCheckValueOnEveryPath) {
  // The CRC-32C check value (RFC 3720, B.4 lists more).
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  EXPECT_EQ(internal::Crc32cExtendOneStream(0, "123456789"), 0xe3069283u);
  EXPECT_EQ(internal::Crc32cExtendPortable(0, "123456789"), 0xe3069283u);
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(i * 7 + 3));
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    absl::string_view a = absl::string_view(text).substr(0, split);
    absl::string_view b = absl::string_view(text).substr(split);
    // Unaligned starts and odd lengths on both paths.
    EXPECT_EQ(Crc32cExtend(Crc32c(a), b), Crc32c(text)) << split;
    EXPECT_EQ(
        internal::Crc32cExtendPortable(internal::Crc32cExtendPortable(0, a), b),
        Crc32c(text))
        << split;
  }
}

// Large inputs run three chains at once and join them; the table, the one
// chain and the three must agree at every length around the joins, from
// every alignment and running value.
TEST(Crc32cTest, ThreeChainsAgreeWithOneAndWithTheTable) {
  const std::string bytes = NoisyBytes((3 << 12) * 3 + 64, 7);
  std::mt19937 rng(11);
  const size_t block = 3 * 4096;
  for (size_t length : {block - 1, block, block + 1, block + 8, 2 * block - 3,
                        2 * block, 2 * block + 13, 3 * block}) {
    for (size_t start : {0, 1, 3, 8, 13}) {
      const uint32_t previous = rng();
      absl::string_view piece = absl::string_view(bytes).substr(start, length);
      const uint32_t table = internal::Crc32cExtendPortable(previous, piece);
      EXPECT_EQ(Crc32cExtend(previous, piece), table)
          << "length " << length << " start " << start;
      EXPECT_EQ(internal::Crc32cExtendOneStream(previous, piece), table)
          << "length " << length << " start " << start;
    }
  }
}

TEST(Crc32cTest, ExtendingPieceByPieceEqualsTheWhole) {
  const std::string bytes = NoisyBytes(size_t{1} << 20, 3);
  const uint32_t whole = Crc32c(bytes);
  EXPECT_EQ(whole, internal::Crc32cExtendPortable(0, bytes));
  std::mt19937 rng(5);
  uint32_t crc = 0;
  for (size_t done = 0; done < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - done, rng() % 40000);
    crc = Crc32cExtend(crc, absl::string_view(bytes).substr(done, n));
    done += n;
  }
  EXPECT_EQ(crc, whole);
}

// A flipped bit anywhere in a large input, in any of the three chains,
// changes the result.
TEST(Crc32cTest, AFlippedBitInAnyChainIsSeen) {
  std::string bytes = NoisyBytes(3 * 4096 * 2, 9);
  const uint32_t clean = Crc32c(bytes);
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{8191},
                    size_t{8192}, size_t{12287}, bytes.size() - 1}) {
    bytes[at] ^= 0x10;
    EXPECT_NE(Crc32c(bytes), clean) << at;
    EXPECT_EQ(Crc32c(bytes), internal::Crc32cExtendPortable(0, bytes)) << at;
    bytes[at] ^= 0x10;
  }
}

}  // namespace
}  // namespace modelstate
