#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/file_util.h"

namespace modelstate {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(
    const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, path, "open failed");
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, path, "stat failed");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));
  }
  // Shared, not private: the pages are the page cache's own, so nothing is
  // copied and nothing counts against the process's data limit.
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, path, "mmap failed");
  return std::shared_ptr<const MappedFile>(
      new MappedFile(path, static_cast<const char*>(p), size));
}

MappedFile::~MappedFile() {
  if (size_ > 0) munmap(const_cast<char*>(data_), size_);
}

}  // namespace modelstate
