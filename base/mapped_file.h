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
//   uint32_t crc = 0;
//   if (!MappedFile::ReadCatchingBusErrors(
//           file->bytes(), [&] { crc = Crc32c(file->bytes()); })) {
//     // cut short under the mapping, or the disk failed to read a page
//   }
#ifndef MODELSTATE_BASE_MAPPED_FILE_H_
#define MODELSTATE_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// Thread-safe (immutable). The mapping stays valid after the file is
// unlinked or renamed; a file truncated under it by another program makes
// reads past the new end fault, as with any mapping (see
// ReadCatchingBusErrors).
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

  // Runs `read`, which reads `bytes` (of some mapping), and returns false
  // instead of letting the process die if reading them raises SIGBUS: the
  // file was cut short under the mapping, or the disk could not read a
  // page. A SIGBUS anywhere else goes to the handler that was there before
  // (or kills the process, as it would have). `read` may be abandoned
  // part-way, so it must take no lock and own nothing that needs
  // destroying (a checksum loop). Thread-safe; installs a SIGBUS handler
  // the first time.
  static bool ReadCatchingBusErrors(absl::string_view bytes,
                                    absl::FunctionRef<void()> read);

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  const std::string path_;
  const char* const data_;
  const size_t size_;
};

}  // namespace modelstate

#endif  // MODELSTATE_BASE_MAPPED_FILE_H_
