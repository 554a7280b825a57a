#include "base/quote.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

TEST(QuoteTest, ShortValuesAreQuotedWhole) {
  EXPECT_EQ(Quote("team/m!"), "'team/m!'");
  EXPECT_EQ(Quote(""), "''");
  EXPECT_EQ(Quote("x", '"'), "\"x\"");
  const std::string fits(kMaxQuotedBytes, 'a');
  EXPECT_EQ(Quote(fits), "'" + fits + "'");
}

TEST(QuoteTest, LongValuesAreCutAndSized) {
  const std::string big(200 << 10, 'a');
  EXPECT_EQ(Quote(big),
            "'" + std::string(kMaxQuotedBytes, 'a') + "\u2026' (204800 bytes)");
}

TEST(QuoteTest, CutNeverSplitsAUtf8Character) {
  // 127 ASCII bytes, then a 2-byte character straddling the cut.
  const std::string value =
      std::string(kMaxQuotedBytes - 1, 'a') + "\u00e9" + std::string(100, 'b');
  EXPECT_EQ(Quote(value), "'" + std::string(kMaxQuotedBytes - 1, 'a') +
                              "\u2026' (" + std::to_string(value.size()) +
                              " bytes)");
}

}  // namespace
}  // namespace modelstate
