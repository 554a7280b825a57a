#include "base/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace modelstate {

absl::Status ErrnoStatus(int error, const std::string& path,
                         absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

absl::Status PwriteAll(int fd, absl::string_view bytes, uint64_t offset,
                       const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n =
        pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, path, "write failed");
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ScopedFd::Close(const std::string& path) {
  int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && close(fd) != 0)
    return ErrnoStatus(errno, path, "close failed");
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path,
                      size_t* written) {
  size_t done = 0;
  absl::Status status;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoStatus(errno, path, "write failed");
      break;
    }
    if (n == 0) {
      status = absl::DataLossError(absl::StrCat(path, ": write wrote nothing"));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (written != nullptr) *written = done;
  return status;
}

absl::StatusOr<std::string> ReadToEnd(int fd, const std::string& path) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read failed");
    }
    if (n == 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

absl::Status Fdatasync(int fd, const std::string& path) {
  int rc;
  do {
    rc = fdatasync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoStatus(errno, path, "fdatasync failed");
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, char* out, uint64_t size, uint64_t offset,
                      const std::string& path) {
  while (size > 0) {
    size_t want = static_cast<size_t>(
        std::min<uint64_t>(size, std::numeric_limits<ssize_t>::max()));
    ssize_t got = pread(fd, out, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read failed");
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": the file ended early (it changed while being read)"));
    }
    out += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status FsyncParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string(".")
                          : slash == 0               ? std::string("/")
                                                     : path.substr(0, slash);
  int fd;
  do {
    fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    return ErrnoStatus(errno, path, "cannot open the directory to sync it");
  ScopedFd closer(fd);
  if (fsync(fd) != 0)
    return ErrnoStatus(errno, path, "fsync of the directory failed");
  return absl::OkStatus();
}

std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content) {
  std::string temp = TempPathFor(path);
  int fd;
  do {
    fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot create a temporary file");
  ScopedFd file(fd);
  absl::Status status = WriteAll(fd, content, path);
  if (status.ok() && fsync(fd) != 0)
    status = ErrnoStatus(errno, path, "fsync failed");
  if (status.ok()) status = file.Close(path);
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, path, "rename failed");
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  return FsyncParentDirectory(path);
}

namespace {

// The whole of `path`, open; `st` gets its fstat.
absl::StatusOr<std::string> ReadWhole(const std::string& path,
                                      struct stat* st) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return ErrnoStatus(errno, path, "cannot open");
  }
  ScopedFd file(fd);
  if (fstat(fd, st) != 0) return ErrnoStatus(errno, path, "cannot stat");
  std::string content(static_cast<size_t>(st->st_size), '\0');
  MODELSTATE_RETURN_IF_ERROR(
      PreadAll(fd, content.data(), content.size(), 0, path));
  return content;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st;
  return ReadWhole(path, &st);
}

absl::StatusOr<std::string> ReadGuardedFile(const std::string& path,
                                            uint32_t* mode) {
  struct stat st;
  MODELSTATE_ASSIGN_OR_RETURN(std::string content, ReadWhole(path, &st));
  const uint32_t bits = st.st_mode & 07777;
  if ((bits & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s is writable by %s (mode %04o): whoever can write it could "
        "change who may do what; chmod go-w it",
        path,
        (bits & S_IWGRP) && (bits & S_IWOTH) ? "its group and others"
        : (bits & S_IWGRP)                   ? "its group"
                                             : "others",
        bits));
  }
  if (mode != nullptr) *mode = bits;
  return content;
}

}  // namespace modelstate
