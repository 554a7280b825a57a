#include "base/log.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

using ::testing::ElementsAre;
using ::testing::MatchesRegex;

// Captures the lines logged during one test, in the format it sets.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSinkForTesting(
        [this](const std::string& line) { lines_.push_back(line); });
  }
  void TearDown() override {
    SetLogSinkForTesting(nullptr);
    SetLogFormat(LogFormat::kText);
  }
  std::vector<std::string> lines_;
};

TEST_F(LogTest, TextLinesReadAsBefore) {
  internal::LogLine("listening on 127.0.0.1:1");
  Log(LogLevel::kWarning, "GetModule failed",
      {.correlation_id = "req-7", .fields = {{"code", "NOT_FOUND"}}});
  EXPECT_THAT(lines_, ElementsAre("[modelstate] listening on 127.0.0.1:1",
                                  "[modelstate] warning: GetModule failed "
                                  "(correlation_id=req-7 code=NOT_FOUND)"));
}

TEST_F(LogTest, JsonLinesAreOneObjectEach) {
  SetLogFormat(LogFormat::kJson);
  internal::LogLine("restored 0 modules");
  Log(LogLevel::kError, "Build failed: \"x\"\nsecond line",
      {.correlation_id = "req-7",
       .fields = {{"method", "BuildModule"}, {"code", "INTERNAL"}}});
  ASSERT_EQ(lines_.size(), 2u);
  for (const std::string& line : lines_) {
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  }
  nlohmann::ordered_json first = nlohmann::ordered_json::parse(lines_[0]);
  EXPECT_EQ(first.size(), 3u) << first;  // no correlation id to give
  EXPECT_THAT(first["time"].get<std::string>(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:"
                           "[0-9]{2}\\.[0-9]{6}Z"));
  EXPECT_EQ(first["level"], "info");
  EXPECT_EQ(first["message"], "restored 0 modules");

  nlohmann::ordered_json second = nlohmann::ordered_json::parse(lines_[1]);
  std::vector<std::string> keys;
  for (const auto& [key, value] : second.items()) keys.push_back(key);
  EXPECT_THAT(keys, ElementsAre("time", "level", "message", "correlation_id",
                                "method", "code"));
  EXPECT_EQ(second["level"], "error");
  EXPECT_EQ(second["message"], "Build failed: \"x\"\nsecond line");
  EXPECT_EQ(second["correlation_id"], "req-7");
  EXPECT_EQ(second["code"], "INTERNAL");
}

TEST_F(LogTest, JsonSurvivesInvalidUtf8) {
  SetLogFormat(LogFormat::kJson);
  Log(LogLevel::kWarning, std::string("bad \xff byte"),
      {.correlation_id = std::string("id\xfe"), .fields = {}});
  ASSERT_EQ(lines_.size(), 1u);
  nlohmann::json line = nlohmann::json::parse(lines_[0]);
  EXPECT_EQ(line["message"], "bad \xEF\xBF\xBD byte");
  EXPECT_EQ(line["correlation_id"], "id\xEF\xBF\xBD");
}

}  // namespace
}  // namespace modelstate
