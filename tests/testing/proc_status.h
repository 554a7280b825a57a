// File: proc_status.h
// A process's memory figures from /proc/<pid>/status (VmRSS, VmHWM, ...)
// and the CPU time it used (/proc/<pid>/stat), for the tests and
// benchmarks that bound or report memory and CPU.
//
// Example:
//   uint64_t rss = ProcStatusBytes(server.pid(), "VmRSS");
//   uint64_t peak = ProcStatusBytes(0, "VmHWM");  // this process
//   double before = ProcessCpuSeconds(server.pid());
//   ...;  // the work
//   double used = ProcessCpuSeconds(server.pid()) - before;
#ifndef MODELSTATE_TESTS_TESTING_PROC_STATUS_H_
#define MODELSTATE_TESTS_TESTING_PROC_STATUS_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace modelstate::testing {

// False under AddressSanitizer, where a process's RSS measures the
// sanitizer, not the program: freed blocks wait in a 256 MiB quarantine
// and shadow memory grows with every address touched. Tests that bound
// memory then check everything else and print the figures; the plain
// build asserts the bounds.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsTheProgram = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssIsTheProgram = false;
#else
constexpr bool kRssIsTheProgram = true;
#endif
#else
constexpr bool kRssIsTheProgram = true;
#endif

// The field of process `pid` (0: this process) in bytes (the file gives
// KiB); 0 when the process or the field is not there.
inline uint64_t ProcStatusBytes(pid_t pid, absl::string_view field) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status")
                            : absl::StrCat("/proc/", pid, "/status"));
  const std::string prefix = absl::StrCat(field, ":");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    rest = absl::StripAsciiWhitespace(
        absl::StripSuffix(absl::StripAsciiWhitespace(rest), "kB"));
    uint64_t kib = 0;
    return absl::SimpleAtoi(rest, &kib) ? kib * 1024 : 0;
  }
  return 0;
}

// User plus system CPU time of process `pid` (0: this process), all its
// threads, in seconds (in clock ticks: 10 ms here); 0 when it is not there.
inline double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/stat")
                            : absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // The command name may hold spaces and parentheses: fields count from
  // after its closing one, where field 3 (the state) begins.
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos) return 0;
  const std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(line).substr(name_end + 1), ' ', absl::SkipEmpty());
  uint64_t user = 0;
  uint64_t system = 0;
  // Fields 14 and 15: utime and stime.
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return 0;
  }
  return static_cast<double>(user + system) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_PROC_STATUS_H_
