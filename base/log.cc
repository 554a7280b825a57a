#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

std::atomic<LogFormat> log_format{LogFormat::kText};

absl::Mutex sink_mu(absl::kConstInit);
std::function<void(const std::string&)>* sink ABSL_GUARDED_BY(sink_mu) =
    nullptr;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// One JSON object; text that is not valid UTF-8 (a module name, a peer
// address) is replaced rather than make the line unparseable.
std::string JsonLine(LogLevel level, absl::string_view message,
                     const LogContext& context) {
  nlohmann::ordered_json line;
  line["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(),
                                  absl::UTCTimeZone());
  line["level"] = LevelName(level);
  line["message"] = std::string(message);
  if (!context.correlation_id.empty()) {
    line["correlation_id"] = context.correlation_id;
  }
  for (const auto& [key, value] : context.fields) line[key] = value;
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// "[modelstate] warning: message (correlation_id=req-7 code=NOT_FOUND)";
// info lines without context read as they always have.
std::string TextLine(LogLevel level, absl::string_view message,
                     const LogContext& context) {
  std::string line = "[modelstate] ";
  if (level != LogLevel::kInfo) absl::StrAppend(&line, LevelName(level), ": ");
  absl::StrAppend(&line, message);
  std::string extra;
  if (!context.correlation_id.empty()) {
    absl::StrAppend(&extra, "correlation_id=", context.correlation_id);
  }
  for (const auto& [key, value] : context.fields) {
    absl::StrAppend(&extra, extra.empty() ? "" : " ", key, "=", value);
  }
  if (!extra.empty()) absl::StrAppend(&line, " (", extra, ")");
  return line;
}

}  // namespace

void SetLogFormat(LogFormat format) { log_format.store(format); }

LogFormat GetLogFormat() { return log_format.load(); }

void Log(LogLevel level, absl::string_view message, const LogContext& context) {
  const std::string line = GetLogFormat() == LogFormat::kJson
                               ? JsonLine(level, message, context)
                               : TextLine(level, message, context);
  absl::MutexLock lock(&sink_mu);
  if (sink != nullptr) {
    (*sink)(line);
    return;
  }
  // One write per line, under the lock, so lines never interleave.
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

void SetLogSinkForTesting(std::function<void(const std::string& line)> s) {
  absl::MutexLock lock(&sink_mu);
  delete sink;
  sink =
      s ? new std::function<void(const std::string&)>(std::move(s)) : nullptr;
}

namespace internal {

void LogLine(const std::string& message) { Log(LogLevel::kInfo, message); }

}  // namespace internal
}  // namespace modelstate
