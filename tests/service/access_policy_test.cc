// AccessPolicy::Parse: the token file's errors name the field, and the
// unknown-role error lists every role the parser accepts.
#include "service/access_policy.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

using ::testing::HasSubstr;

std::string OneRole(const std::string& role) {
  return absl::StrCat(R"({"principals": [{"identity": "a", "roles": {")", role,
                      R"(": ["*"]}}]})");
}

TEST(AccessPolicyTest, UnknownRoleListsEveryRoleThatParses) {
  absl::StatusOr<AccessPolicy> bad = AccessPolicy::Parse(OneRole("superuser"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(bad.status().message());
  EXPECT_THAT(message,
              HasSubstr("principals[0].roles.superuser: unknown role"));
  // The README's roles table: each one parses and the error names it, so
  // that the list a user is shown is the list they may use.
  for (const std::string role :
       {"admin", "builder", "reviewer", "auditor", "witness", "reader"}) {
    SCOPED_TRACE(role);
    EXPECT_TRUE(AccessPolicy::Parse(OneRole(role)).ok());
    EXPECT_THAT(message, HasSubstr(role));
  }
}

}  // namespace
}  // namespace modelstate
