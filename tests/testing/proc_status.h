// File: proc_status.h
// A process's memory figures from /proc/<pid>/status (VmRSS, VmHWM, ...),
// for the tests and benchmarks that bound or report memory.
//
// Example:
//   uint64_t rss = ProcStatusBytes(server.pid(), "VmRSS");
//   uint64_t peak = ProcStatusBytes(0, "VmHWM");  // this process
#ifndef MODELSTATE_TESTS_TESTING_PROC_STATUS_H_
#define MODELSTATE_TESTS_TESTING_PROC_STATUS_H_

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace modelstate::testing {

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

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_PROC_STATUS_H_
