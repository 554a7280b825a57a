// File: log.h
// The server's log lines on stderr, and MODELSTATE_CHECK / MODELSTATE_DCHECK
// for broken invariants (programming errors), never for request validation.
// A failed check prints file, line and the streamed message to stderr, then
// aborts.
//
// Log lines are text ("[modelstate] message") or, after
// SetLogFormat(LogFormat::kJson) (modelstate-server --log_format=json), one
// JSON object per line for log collectors:
//   {"time":"2026-11-26T13:05:35.123456Z","level":"warning",
//    "message":"GetModule failed","correlation_id":"req-7",
//    "method":"GetModule","code":"NOT_FOUND"}
// "correlation_id" and the extra fields appear only when given.
//
// Example:
//   MODELSTATE_CHECK(index < size_) << "index " << index << " out of range";
//   Log(LogLevel::kWarning, "GetModule failed",
//       {.correlation_id = "req-7", .fields = {{"code", "NOT_FOUND"}}});
#ifndef MODELSTATE_BASE_LOG_H_
#define MODELSTATE_BASE_LOG_H_

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace modelstate {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// What a line is about besides its message: the request it belongs to and
// more named values (strings, in this order).
struct LogContext {
  std::string correlation_id;
  std::vector<std::pair<std::string, std::string>> fields;
};

// Process-wide; set once at start-up (the default is kText).
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();

// Writes one line to stderr in the current format. Thread-safe; lines from
// different threads never interleave.
void Log(LogLevel level, absl::string_view message,
         const LogContext& context = {});

// Tests: lines go to `sink` instead of stderr (nullptr: back to stderr).
void SetLogSinkForTesting(std::function<void(const std::string& line)> sink);

}  // namespace modelstate

namespace modelstate::internal {

// Collects a failure message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

// Log(LogLevel::kInfo, message): "[modelstate] <message>" in text.
void LogLine(const std::string& message);

}  // namespace modelstate::internal

#define MODELSTATE_CHECK(cond)                                                 \
  (cond) ? (void)0                                                             \
         : ::modelstate::internal::Voidify() &                                 \
               ::modelstate::internal::CheckFailure(__FILE__, __LINE__, #cond) \
                   .stream()

#ifdef NDEBUG
#define MODELSTATE_DCHECK(cond) \
  while (false) MODELSTATE_CHECK(cond)
#else
#define MODELSTATE_DCHECK(cond) MODELSTATE_CHECK(cond)
#endif

#endif  // MODELSTATE_BASE_LOG_H_
