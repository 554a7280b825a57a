// File: file_size_limit.h
// A full disk in miniature for tests of failed saves: sets the file size
// limit (RLIMIT_FSIZE, "ulimit -f") of a running child process such as the
// server, so that its next write past `bytes` in any file fails with EFBIG
// (the server ignores SIGXFSZ, which would otherwise kill it). Only the soft
// limit changes, so the limit can be lifted again.
//
// Example:
//   ASSERT_TRUE(LimitFileSize(server.pid(), 256 << 10).ok());
//   ... a save that writes more than 256 KiB fails ...
//   ASSERT_TRUE(LiftFileSizeLimit(server.pid()).ok());
#ifndef MODELSTATE_TESTS_TESTING_FILE_SIZE_LIMIT_H_
#define MODELSTATE_TESTS_TESTING_FILE_SIZE_LIMIT_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace modelstate::testing {

// Sets the soft RLIMIT_FSIZE of process `pid` (0: this process) to `bytes`.
inline absl::Status SetFileSizeLimit(pid_t pid, rlim_t bytes) {
  struct rlimit current;
  if (prlimit(pid, RLIMIT_FSIZE, nullptr, &current) != 0) {
    return absl::InternalError(
        absl::StrCat("prlimit(", pid, ") read: ", std::strerror(errno)));
  }
  struct rlimit wanted = current;
  wanted.rlim_cur = bytes < current.rlim_max ? bytes : current.rlim_max;
  if (prlimit(pid, RLIMIT_FSIZE, &wanted, nullptr) != 0) {
    return absl::InternalError(
        absl::StrCat("prlimit(", pid, ") set: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

inline absl::Status LimitFileSize(pid_t pid, rlim_t bytes) {
  return SetFileSizeLimit(pid, bytes);
}

// Back to the hard limit (normally unlimited).
inline absl::Status LiftFileSizeLimit(pid_t pid) {
  return SetFileSizeLimit(pid, RLIM_INFINITY);
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_FILE_SIZE_LIMIT_H_
