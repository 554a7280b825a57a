// File: safetensors.h
// The safetensors file format (huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON header, then the tensors'
// bytes. The header maps each key to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the data section) and may hold a
// "__metadata__" object of string to string.
//
// Reading validates everything a hostile file could get wrong and names the
// problem: a header larger than the file or than kMaxSafetensorsHeaderBytes,
// invalid JSON, unknown dtypes, negative or overflowing shapes, a byte range
// that does not match shape x dtype, ranges that overlap, leave gaps, or run
// past the end of the file, duplicate keys.
//
// Writing is streaming-friendly: the header is written from a layout first,
// then the data in layout order, so a state_dict of any size can go to disk
// chunk by chunk. Key order and dtypes are preserved: the JSON keys and the
// data follow the layout order, and readers that order by offset see it too.
//
// Example:
//   MODELSTATE_RETURN_IF_ERROR(WriteSafetensorsFile("model.safetensors", sd));
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict back,
//   ReadSafetensorsFile("model.safetensors"));
#ifndef MODELSTATE_CORE_SAFETENSORS_H_
#define MODELSTATE_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/tensor.h"

namespace modelstate {

// Headers above this size are rejected (the reference implementation's
// limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor of a safetensors file.
struct SafetensorsEntry {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0;  // Offsets into the data section.
  uint64_t end = 0;
};

// A parsed header: entries in data order (ascending offsets), the metadata,
// and where the data section starts in the file.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::vector<std::pair<std::string, std::string>> metadata;
  uint64_t data_start = 0;  // 8 + header length.
  uint64_t data_bytes = 0;  // Size of the data section.
};

// Parses and validates the header of a safetensors file whose first bytes
// are `prefix` (at least 8 + header length bytes of it) and whose total size
// is `file_size`. INVALID_ARGUMENT (or OUT_OF_RANGE when `prefix` is too short
// to hold the header; the caller then reads more) naming the problem.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view prefix, uint64_t file_size);

// Reads and validates the header of the file at `path`. NOT_FOUND if it does
// not exist; INVALID_ARGUMENT naming the file and the problem otherwise.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path);

// Reads a whole file into a StateDict (CPU tensors, in data order, each
// tensor's bytes read straight into its own storage).
absl::StatusOr<StateDict> ReadSafetensorsFile(const std::string& path);

// Parses a whole file held in memory (used by fuzzing and tests).
absl::StatusOr<StateDict> ParseSafetensors(absl::string_view bytes);

// The serialized header (8-byte length + JSON, padded with spaces to a
// multiple of 8 bytes as the reference writer does) for tensors laid out in
// `entries` order; begin/end of the entries are ignored and recomputed as
// consecutive ranges. INVALID_ARGUMENT for duplicate or empty keys.
absl::StatusOr<std::string> SerializeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata);

// Writes a safetensors file incrementally: Open() writes the header for the
// layout, Append() the data bytes in layout order, Finish() checks that
// exactly the declared number of bytes arrived, fsyncs, and renames the
// temporary file to `path` (then fsyncs the directory), so `path` is either
// absent/old or complete. Destroying an unfinished writer removes the
// temporary file. Thread-compatible.
class SafetensorsFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> Open(
      const std::string& path, const std::vector<SafetensorsEntry>& entries,
      const std::vector<std::pair<std::string, std::string>>& metadata = {});
  ~SafetensorsFileWriter();

  // INVALID_ARGUMENT if more bytes arrive than the layout declares. Starts
  // writing back every few tens of MiB, so that Finish's fsync has little
  // left to wait for.
  absl::Status Append(absl::string_view bytes);
  absl::Status Finish();

  // Where the data section starts in the file (8 + header length).
  uint64_t data_start() const { return data_start_; }

 private:
  SafetensorsFileWriter() = default;
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  uint64_t expected_ = 0;
  uint64_t written_ = 0;
  uint64_t written_back_ = 0;  // data bytes whose writeback was started
  bool finished_ = false;
};

// Writes `state_dict` (CPU or accelerator tensors; meta tensors are an
// error) to `path` with the writer above. `metadata` goes to __metadata__.
absl::Status WriteSafetensorsFile(
    const std::string& path, const StateDict& state_dict,
    const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace modelstate

#endif  // MODELSTATE_CORE_SAFETENSORS_H_
