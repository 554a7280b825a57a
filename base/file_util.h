// File: file_util.h
// Small POSIX file helpers for durable writes: full writes and reads that
// retry interrupted and short calls, fsync of the directory holding a path
// (a rename is durable only then), and an atomic "write whole file" (a
// temporary file in the same directory, fsync, rename, directory fsync).
// Errors name the path.
//
// Example:
//   MODELSTATE_RETURN_IF_ERROR(WriteFileAtomically("data/manifest.json",
//   text));
#ifndef MODELSTATE_BASE_FILE_UTIL_H_
#define MODELSTATE_BASE_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// An absl::Status for errno `error` ("<path>: <what>: <strerror>").
absl::Status ErrnoStatus(int error, const std::string& path,
                         absl::string_view what);

// Writes all of `bytes` to `fd`. `written` (may be null) receives how many
// bytes were written, also when it fails part way (a caller may undo them).
absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path,
                      size_t* written = nullptr);

// Reads from `fd`'s offset to the end of the file.
absl::StatusOr<std::string> ReadToEnd(int fd, const std::string& path);

// fdatasync, retried when interrupted.
absl::Status Fdatasync(int fd, const std::string& path);

// Writes all of `bytes` at `offset`, retrying interrupted and short writes.
absl::Status PwriteAll(int fd, absl::string_view bytes, uint64_t offset,
                       const std::string& path);

// Reads exactly `size` bytes at `offset`; DATA_LOSS if the file is shorter.
absl::Status PreadAll(int fd, char* out, uint64_t size, uint64_t offset,
                      const std::string& path);

// fsyncs the directory that contains `path`.
absl::Status FsyncParentDirectory(const std::string& path);

// Replaces `path` with `content` atomically and durably.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content);

// The whole file. NOT_FOUND if it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// ReadFile for a file that decides who may do what (a token file, quotas,
// a private key or a client CA): PERMISSION_DENIED if its group or others
// may write it, as sshd's StrictModes refuses such files, since whoever can
// write it can grant themselves anything. Only the mode is checked, not the
// owner: a bind-mounted file keeps its host owner, which means nothing in
// the container. The mode is that of the file opened (fstat), after every
// symlink (a Kubernetes Secret's file is a link into "..data", a link to
// a timestamped directory), so a file swapped in between check and read is
// checked itself. The directories on the way are not checked. `mode`, when
// not null, gets its permission bits.
absl::StatusOr<std::string> ReadGuardedFile(const std::string& path,
                                            uint32_t* mode = nullptr);

// A temporary file name next to `path`, unique within this process.
std::string TempPathFor(const std::string& path);

// Closes a file descriptor on destruction.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  int get() const { return fd_; }
  // Closes now and reports close()'s error (delayed write errors).
  absl::Status Close(const std::string& path);

 private:
  int fd_;
};

}  // namespace modelstate

#endif  // MODELSTATE_BASE_FILE_UTIL_H_
