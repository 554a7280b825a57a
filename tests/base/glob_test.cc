#include "base/glob.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(GlobTest, LiteralsMatchThemselvesOnly) {
  EXPECT_TRUE(GlobMatch("fc.weight", "fc.weight"));
  EXPECT_FALSE(GlobMatch("fc.weight", "fc.weights"));
  EXPECT_FALSE(GlobMatch("fc.weight", "fc.weigh"));
  EXPECT_TRUE(GlobMatch("", ""));
  EXPECT_FALSE(GlobMatch("", "a"));
}

TEST(GlobTest, StarMatchesAnyRunIncludingNone) {
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("*.weight", "layer1.0.conv1.weight"));
  EXPECT_TRUE(GlobMatch("layer*weight", "layerweight"));
  EXPECT_FALSE(GlobMatch("*.bias", "fc.weight"));
  // Backtracking past an earlier partial match of the suffix.
  EXPECT_TRUE(GlobMatch("*ab", "aab"));
  EXPECT_TRUE(GlobMatch("a*b*c", "a_b_b_c"));
  EXPECT_FALSE(GlobMatch("a*b*c", "a_b_b_"));
}

TEST(GlobTest, QuestionMarkMatchesExactlyOneCharacter) {
  EXPECT_TRUE(GlobMatch("layer?.weight", "layer1.weight"));
  EXPECT_FALSE(GlobMatch("layer?.weight", "layer.weight"));
  EXPECT_FALSE(GlobMatch("layer?.weight", "layer12.weight"));
}

TEST(GlobTest, CheckGlobRefusesCharacterClassesAndEscapesNamingTheField) {
  EXPECT_TRUE(CheckGlob("*.weight?", "key_glob").ok());
  EXPECT_THAT(CheckGlob("layer[12]", "key_glob"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key_glob: 'layer[12]' uses '['")));
  EXPECT_THAT(CheckGlob("a\\*", "filter.name_glob"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("filter.name_glob")));
}

}  // namespace
}  // namespace modelstate
