// File: mapped_file.h
// A whole file mapped read-only into memory and shared by whoever views
// parts of it: the pages come from the page cache on first touch and go
// back to it under memory pressure, so what a process maps is bounded by
// the disk, not by its memory, and mapping costs nothing per byte.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
//                               MappedFile::Open("data-1.safetensors"));
//   absl::string_view header = file->bytes().substr(0, 8);
#ifndef MODELSTATE_BASE_MAPPED_FILE_H_
#define MODELSTATE_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// Thread-safe (immutable). The mapping stays valid after the file is
// unlinked or renamed; a file truncated under it by another program makes
// reads past the new end fault, as with any mapping.
class MappedFile {
 public:
  // Maps all of `path` read-only. An empty file maps to no bytes. Errors
  // name the path.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  const std::string path_;
  const char* const data_;
  const size_t size_;
};

}  // namespace modelstate

#endif  // MODELSTATE_BASE_MAPPED_FILE_H_
