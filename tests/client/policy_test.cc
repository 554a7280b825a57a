#include "client/policy.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate::client {
namespace {

using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

v1::HookEventProto Event(v1::EntryKind kind, const std::string& type,
                         const std::string& name,
                         v1::DType dtype = v1::DTYPE_FLOAT32,
                         std::vector<int64_t> shape = {2}) {
  v1::HookEventProto e;
  e.set_event_id(7);
  e.set_namespace_("team");
  e.set_module("mlp");
  e.set_path("encoder.0");
  e.set_module_type(type);
  e.set_kind(kind);
  e.set_action(v1::REGISTRATION_ACTION_REGISTER);
  e.set_name(name);
  e.mutable_value()->set_dtype(dtype);
  for (int64_t d : shape) e.mutable_value()->add_shape(d);
  return e;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PolicyTest, FirstMatchingRuleDecidesAndTheDefaultCoversTheRest) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Policy p, Policy::FromJson(R"({
      "rules": [
        {"match": {"kind": "buffer", "name": "temp_*"}, "action": "reject", "reason": "no temps"},
        {"match": {"dtype": ["float64", "half"], "shape": [2]}, "action": "modify",
         "transform": {"cast": "float32"}},
        {"match": {"type": "Lin*", "path": "encoder.*", "module": "team/*"}, "action": "reject"}
      ],
      "default": "approve"})"));
  v1::HookAnswer a = p.Decide(Event(v1::ENTRY_KIND_BUFFER, "X", "temp_buffer"));
  EXPECT_EQ(a.event_id(), 7u);
  EXPECT_EQ(a.verdict(), v1::HookAnswer::REJECT);
  EXPECT_EQ(a.reason(), "no temps");
  a = p.Decide(Event(v1::ENTRY_KIND_PARAMETER, "X", "w", v1::DTYPE_FLOAT16));
  EXPECT_EQ(a.verdict(), v1::HookAnswer::MODIFY);
  EXPECT_EQ(a.transform().cast(), v1::DTYPE_FLOAT32);
  a = p.Decide(
      Event(v1::ENTRY_KIND_PARAMETER, "X", "w", v1::DTYPE_FLOAT16, {3}));
  EXPECT_EQ(a.verdict(), v1::HookAnswer::APPROVE);  // shape differs
  a = p.Decide(Event(v1::ENTRY_KIND_PARAMETER, "Linear", "weight"));
  EXPECT_EQ(a.verdict(), v1::HookAnswer::REJECT);
  a = p.Decide(Event(v1::ENTRY_KIND_PARAMETER, "Conv2d", "weight"));
  EXPECT_EQ(a.verdict(), v1::HookAnswer::APPROVE);
}

TEST(PolicyTest, MalformedPoliciesNameTheField) {
  EXPECT_THAT(Policy::FromJson("[1]"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Policy::FromJson(R"({"rules": [{"match": {"kind": "tensor"}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rules[0].match.kind")));
  EXPECT_THAT(Policy::FromJson(R"({"rules": [{"action": "modify"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs a transform")));
  EXPECT_THAT(
      Policy::FromJson(R"({"rules": [{"match": {"dtype": "float17"}}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rules[0].match.dtype")));
  EXPECT_THAT(Policy::FromJson(R"({"rules": [{"colour": "red"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rules[0].colour")));
  EXPECT_THAT(
      Policy::FromJson(R"({"subscription": {"nmae": "x"}})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("subscription")));
  EXPECT_THAT(
      Policy::FromJson(R"({"rules": [{"action": "modify",
      "transform": {"reinit": {"kind": "kaiming"}}}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reinit.kind")));
}

TEST(PolicyTest, TheShippedExamplePoliciesParse) {
  std::filesystem::path dir =
      std::filesystem::path(MODELSTATE_SOURCE_DIR) / "deploy/policies";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<Policy> p =
        Policy::FromJson(ReadFile(entry.path().string()));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(p->subscription().name().empty());
    ++count;
  }
  EXPECT_GE(count, 5);
}

TEST(PolicyTest, LoggingRulesDescribeTheEvent) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Policy p, Policy::FromJson(R"({"rules": [
      {"match": {"kind": "buffer"}, "action": "approve", "log": true}]})"));
  std::string line;
  p.Decide(Event(v1::ENTRY_KIND_BUFFER, "BatchNorm1d", "running_mean"), &line);
  EXPECT_EQ(line,
            "encoder.0.running_mean: buffer float32[2] in BatchNorm1d "
            "(team/mlp) -> APPROVE");
}

}  // namespace
}  // namespace modelstate::client
