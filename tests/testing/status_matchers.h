// File: status_matchers.h
// gMock matchers for absl::Status and absl::StatusOr, named like Abseil's
// status_matchers.h (absent from Debian's Abseil 20220623).
//
// Example:
//   EXPECT_THAT(m->RegisterParameter("a.b", {}),
//               StatusIs(absl::StatusCode::kInvalidArgument,
//                        HasSubstr("can't contain")));
//   MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Zeros(DType::kFloat32,
//   {2}));
#ifndef MODELSTATE_TESTS_TESTING_STATUS_MATCHERS_H_
#define MODELSTATE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has status code " + ::testing::PrintToString(code) +
               " and a matching message") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(
             message_matcher, std::string(s.message()), result_listener);
}

MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

}  // namespace modelstate::testing

#define MODELSTATE_ASSERT_OK(expr) \
  ASSERT_THAT((expr), ::modelstate::testing::IsOk())
#define MODELSTATE_EXPECT_OK(expr) \
  EXPECT_THAT((expr), ::modelstate::testing::IsOk())

#define MODELSTATE_TESTING_CONCAT_IMPL(a, b) a##b
#define MODELSTATE_TESTING_CONCAT(a, b) MODELSTATE_TESTING_CONCAT_IMPL(a, b)
// Asserts that `rexpr` (a StatusOr) is OK and moves its value into `lhs`.
#define MODELSTATE_ASSERT_OK_AND_ASSIGN(lhs, rexpr)                      \
  MODELSTATE_TESTING_ASSIGN_IMPL(                                        \
      MODELSTATE_TESTING_CONCAT(modelstate_statusor_, __COUNTER__), lhs, \
      rexpr)
#define MODELSTATE_TESTING_ASSIGN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  ASSERT_TRUE(statusor.ok()) << statusor.status();           \
  lhs = std::move(*statusor)

#endif  // MODELSTATE_TESTS_TESTING_STATUS_MATCHERS_H_
