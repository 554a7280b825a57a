// File: log.h
// MODELSTATE_CHECK / MODELSTATE_DCHECK for broken invariants (programming
// errors), never for request validation. A failed check prints file, line and
// the streamed message to stderr, then aborts.
//
// Example:
//   MODELSTATE_CHECK(index < size_) << "index " << index << " out of range";
#ifndef MODELSTATE_BASE_LOG_H_
#define MODELSTATE_BASE_LOG_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

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

// Writes one line to stderr: "[modelstate] <message>".
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
