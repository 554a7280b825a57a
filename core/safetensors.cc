#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

// Tensor bytes go between memory and disk unchanged, and safetensors stores
// them little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

constexpr absl::string_view kMetadataKey = "__metadata__";

// Accelerator tensors reach the file through a host buffer of this size, so
// writing never needs a host copy of a whole (possibly huge) tensor.
constexpr size_t kHostChunkBytes = size_t{16} << 20;
// SafetensorsFileWriter starts writeback after this many new bytes.
constexpr uint64_t kWritebackBytes = uint64_t{32} << 20;

// safetensors dtypes that modelstate has no DType for; named separately so
// that the error says "unsupported" rather than "unknown".
constexpr absl::string_view kUnsupportedDTypes[] = {
    "U16",     "U32",         "U64",         "C64",     "F8_E4M3", "F8_E5M2",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4"};

std::string Quoted(absl::string_view text) {
  return absl::StrCat("'", text, "'");
}

std::string SupportedDTypeList() {
  std::vector<absl::string_view> names;
  for (DType dtype : kAllDTypes) names.push_back(SafetensorsDTypeName(dtype));
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view key,
                                               absl::string_view name) {
  // Only safetensors' own spellings: ParseDType would also take "float32",
  // which no safetensors reader accepts.
  for (DType dtype : kAllDTypes) {
    if (SafetensorsDTypeName(dtype) == name) return dtype;
  }
  for (absl::string_view unsupported : kUnsupportedDTypes) {
    if (unsupported == name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(key), ": unsupported dtype ", Quoted(name),
          " (modelstate supports ", SupportedDTypeList(), ")"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", Quoted(key), ": unknown dtype ", Quoted(name)));
}

// Prefixes a status message with the file it is about.
absl::Status WithPath(const std::string& path, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(path, ": ", status.message()));
}

uint64_t DecodeLittleEndian64(absl::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

void AppendLittleEndian64(uint64_t value, std::string& out) {
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

// One tensor entry as the JSON spells it, before semantic checks.
struct RawEntry {
  std::string key;
  std::string dtype;
  Shape shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false;
  bool has_shape = false;
  bool has_offsets = false;
};

// Streams the header JSON through nlohmann's SAX interface and checks its
// schema on the fly. A DOM would silently keep only the last of duplicate
// keys, would lose the key order (nlohmann::json sorts keys), and would let a
// hostile header nest arrays millions deep; here any unexpected event ends
// the parse at once, so memory stays proportional to the well-formed part.
class HeaderSaxHandler {
 public:
  using json = nlohmann::json;

  std::vector<RawEntry>& entries() { return entries_; }
  std::vector<std::pair<std::string, std::string>>& metadata() {
    return metadata_;
  }
  const std::string& error() const { return error_; }
  bool done() const { return state_ == State::kDone; }

  bool null() { return Unexpected("null"); }
  bool boolean(bool /*value*/) { return Unexpected("a boolean"); }
  bool number_integer(json::number_integer_t value) {
    if (value < 0) {
      if (state_ == State::kShapeElement) {
        return Fail(absl::StrCat(EntryPrefix(),
                                 "shape has a negative dimension ", value));
      }
      if (state_ == State::kOffsetsElement) {
        return Fail(absl::StrCat(EntryPrefix(),
                                 "data_offsets has a negative offset ", value));
      }
      return Unexpected("a number");
    }
    return number_unsigned(static_cast<json::number_unsigned_t>(value));
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (state_ == State::kShapeElement) {
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Fail(absl::StrCat(EntryPrefix(), "shape dimension ", value,
                                 " is too large"));
      }
      entries_.back().shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (state_ == State::kOffsetsElement) {
      if (entries_.back().offsets.size() == 2) {
        return Fail(absl::StrCat(EntryPrefix(),
                                 "data_offsets must have exactly 2 elements"));
      }
      entries_.back().offsets.push_back(value);
      return true;
    }
    return Unexpected("a number");
  }
  bool number_float(json::number_float_t /*value*/,
                    const json::string_t& text) {
    if (state_ == State::kShapeElement || state_ == State::kOffsetsElement) {
      return Fail(absl::StrCat(EntryPrefix(), ShortText(text),
                               " is not a non-negative integer"));
    }
    return Unexpected("a number");
  }
  bool string(json::string_t& value) {
    switch (state_) {
      case State::kMetadataValue:
        metadata_.emplace_back(std::move(current_metadata_key_),
                               std::move(value));
        state_ = State::kMetadataKey;
        return true;
      case State::kDType:
        entries_.back().dtype = std::move(value);
        state_ = State::kEntryKey;
        return true;
      default:
        return Unexpected("a string");
    }
  }
  bool binary(json::binary_t& /*value*/) { return Unexpected("binary data"); }

  bool start_object(std::size_t /*elements*/) {
    switch (state_) {
      case State::kRoot:
        state_ = State::kRootKey;
        return true;
      case State::kMetadataObject:
        state_ = State::kMetadataKey;
        return true;
      case State::kEntryObject:
        state_ = State::kEntryKey;
        return true;
      default:
        return Unexpected("an object");
    }
  }
  bool key(json::string_t& key) {
    switch (state_) {
      case State::kRootKey:
        if (!root_keys_.insert(key).second) {
          return Fail(absl::StrCat("duplicate key ", Quoted(key)));
        }
        if (key == kMetadataKey) {
          state_ = State::kMetadataObject;
        } else {
          entries_.emplace_back();
          entries_.back().key = std::move(key);
          state_ = State::kEntryObject;
        }
        return true;
      case State::kMetadataKey:
        if (!metadata_keys_.insert(key).second) {
          return Fail(
              absl::StrCat("__metadata__ has a duplicate key ", Quoted(key)));
        }
        current_metadata_key_ = std::move(key);
        state_ = State::kMetadataValue;
        return true;
      case State::kEntryKey:
        return EntryField(key);
      default:
        return Unexpected("a key");
    }
  }
  bool end_object() {
    switch (state_) {
      case State::kRootKey:
        state_ = State::kDone;
        return true;
      case State::kMetadataKey:
        state_ = State::kRootKey;
        return true;
      case State::kEntryKey: {
        const RawEntry& entry = entries_.back();
        const char* missing = !entry.has_dtype     ? "dtype"
                              : !entry.has_shape   ? "shape"
                              : !entry.has_offsets ? "data_offsets"
                                                   : nullptr;
        if (missing != nullptr) {
          return Fail(
              absl::StrCat(EntryPrefix(), "missing field '", missing, "'"));
        }
        state_ = State::kRootKey;
        return true;
      }
      default:
        return Unexpected("the end of an object");
    }
  }
  bool start_array(std::size_t /*elements*/) {
    switch (state_) {
      case State::kShapeArray:
        state_ = State::kShapeElement;
        return true;
      case State::kOffsetsArray:
        state_ = State::kOffsetsElement;
        return true;
      default:
        return Unexpected("an array");
    }
  }
  bool end_array() {
    switch (state_) {
      case State::kShapeElement:
        state_ = State::kEntryKey;
        return true;
      case State::kOffsetsElement:
        if (entries_.back().offsets.size() != 2) {
          return Fail(absl::StrCat(
              EntryPrefix(), "data_offsets must have exactly 2 elements"));
        }
        state_ = State::kEntryKey;
        return true;
      default:
        return Unexpected("the end of an array");
    }
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::json::exception& ex) {
    // ex.what() quotes the offending token, which can be as long as the
    // header; keep the message short.
    return Fail(absl::StrCat("header is not valid JSON (at byte ", position,
                             "): ", ShortText(ex.what())));
  }

 private:
  enum class State {
    kRoot,            // Before the top-level value.
    kRootKey,         // In the top-level object, between members.
    kMetadataObject,  // After "__metadata__":
    kMetadataKey,     // In __metadata__, between members.
    kMetadataValue,   // After a __metadata__ key.
    kEntryObject,     // After a tensor key.
    kEntryKey,        // In a tensor's object, between members.
    kDType,           // After "dtype":
    kShapeArray,      // After "shape":
    kShapeElement,    // In the shape array.
    kOffsetsArray,    // After "data_offsets":
    kOffsetsElement,  // In the data_offsets array.
    kDone,            // After the top-level object.
  };

  // Bytes outside printable ASCII as \xNN: the text can quote a damaged
  // header's bytes, and a status message ends up in JSON and in gRPC
  // trailers.
  static std::string ShortText(absl::string_view text) {
    constexpr size_t kMax = 160;
    std::string out;
    for (char c : text.substr(0, kMax)) {
      const unsigned char b = static_cast<unsigned char>(c);
      if (b >= 0x20 && b < 0x7f) {
        out.push_back(c);
      } else {
        absl::StrAppend(&out, "\\x", absl::Hex(b, absl::kZeroPad2));
      }
    }
    if (text.size() > kMax) out += "...";
    return out;
  }

  std::string EntryPrefix() const {
    return absl::StrCat("tensor ", Quoted(entries_.back().key), ": ");
  }

  bool EntryField(const std::string& field) {
    RawEntry& entry = entries_.back();
    bool* seen = nullptr;
    State next = State::kDType;
    if (field == "dtype") {
      seen = &entry.has_dtype;
      next = State::kDType;
    } else if (field == "shape") {
      seen = &entry.has_shape;
      next = State::kShapeArray;
    } else if (field == "data_offsets") {
      seen = &entry.has_offsets;
      next = State::kOffsetsArray;
    } else {
      return Fail(absl::StrCat(EntryPrefix(), "unknown field ",
                               Quoted(ShortText(field)),
                               " (expected dtype, shape and data_offsets)"));
    }
    if (*seen) {
      return Fail(
          absl::StrCat(EntryPrefix(), "duplicate field ", Quoted(field)));
    }
    *seen = true;
    state_ = next;
    return true;
  }

  // Names what the current position required when `what` arrived instead.
  bool Unexpected(absl::string_view what) {
    switch (state_) {
      case State::kRoot:
        return Fail(absl::StrCat("header must be a JSON object, not ", what));
      case State::kMetadataObject:
        return Fail(absl::StrCat(
            "__metadata__ must be an object of strings, not ", what));
      case State::kMetadataValue:
        return Fail(absl::StrCat("__metadata__ value of ",
                                 Quoted(current_metadata_key_),
                                 " must be a string, not ", what));
      case State::kEntryObject:
        return Fail(absl::StrCat(EntryPrefix(),
                                 "must be an object with dtype, shape and "
                                 "data_offsets, not ",
                                 what));
      case State::kDType:
        return Fail(
            absl::StrCat(EntryPrefix(), "dtype must be a string, not ", what));
      case State::kShapeArray:
      case State::kShapeElement:
        return Fail(absl::StrCat(
            EntryPrefix(),
            "shape must be an array of non-negative integers, not ", what));
      case State::kOffsetsArray:
      case State::kOffsetsElement:
        return Fail(absl::StrCat(EntryPrefix(),
                                 "data_offsets must be an array of two "
                                 "non-negative integers, not ",
                                 what));
      default:
        // The parser only reports keys and ends where JSON allows them, so
        // these states see nothing else; kept as a safe answer anyway.
        return Fail(absl::StrCat("unexpected ", what, " in the header"));
    }
  }

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  State state_ = State::kRoot;
  std::vector<RawEntry> entries_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  absl::flat_hash_set<std::string> root_keys_;
  absl::flat_hash_set<std::string> metadata_keys_;
  std::string current_metadata_key_;
  std::string error_;
};

// Checks one entry's dtype, shape and byte range against each other and
// against the data section.
absl::StatusOr<SafetensorsEntry> ValidateEntry(RawEntry& raw,
                                               uint64_t data_bytes) {
  SafetensorsEntry entry;
  MODELSTATE_ASSIGN_OR_RETURN(entry.dtype,
                              DTypeFromSafetensorsName(raw.key, raw.dtype));
  entry.begin = raw.offsets[0];
  entry.end = raw.offsets[1];
  const std::string prefix = absl::StrCat("tensor ", Quoted(raw.key), ": ");
  const std::string range =
      absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
  if (entry.begin > entry.end) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, range, " end before they begin"));
  }
  absl::StatusOr<int64_t> numel = CheckedNumElements(raw.shape);
  absl::StatusOr<uint64_t> nbytes =
      numel.ok() ? CheckedNumBytes(*numel, entry.dtype)
                 : absl::StatusOr<uint64_t>(numel.status());
  if (!nbytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "shape ", ShapeToString(raw.shape), " is too large"));
  }
  if (entry.end - entry.begin != *nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, range, " span ", entry.end - entry.begin, " bytes but shape ",
        ShapeToString(raw.shape), " of ", raw.dtype, " needs ", *nbytes));
  }
  if (entry.end > data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, range, " run past the end of the data section (",
                     data_bytes, " bytes)"));
  }
  entry.key = std::move(raw.key);
  entry.shape = std::move(raw.shape);
  return entry;
}

// Sorts `entries` into data order and checks that their ranges tile the data
// section exactly: no gap, no overlap, nothing left over.
absl::Status OrderAndCheckCoverage(std::vector<SafetensorsEntry>& entries,
                                   uint64_t data_bytes) {
  // Stable, so zero-byte tensors sharing an offset keep their key order.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin
                                               : a.end < b.end;
                   });
  uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.begin != expected) {
      std::string range =
          absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
      if (entry.begin < expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", Quoted(entry.key), ": ", range, " overlap tensor ",
            Quoted(previous->key), " (which ends at ", expected, ")"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(entry.key), ": ", range, " leave a gap of ",
          entry.begin - expected, " bytes after ",
          previous == nullptr
              ? std::string("the start of the data section")
              : absl::StrCat("tensor ", Quoted(previous->key))));
    }
    expected = entry.end;
    previous = &entry;
  }
  if (expected != data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data section has ", data_bytes,
                     " bytes but the tensors cover only ", expected));
  }
  return absl::OkStatus();
}

// Header and data size for tensors laid out in `entries` order.
struct SerializedHeader {
  std::string bytes;  // Length prefix + padded JSON.
  uint64_t data_bytes = 0;
};

// `text` as a JSON string literal. nlohmann does the escaping and refuses
// text that is not valid UTF-8 (which no reader could decode).
absl::StatusOr<std::string> JsonString(absl::string_view text,
                                       absl::string_view what) {
  try {
    return nlohmann::json(std::string(text)).dump();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " cannot be written as JSON: ", e.what()));
  }
}

absl::StatusOr<SerializedHeader> Serialize(
    const std::vector<SafetensorsEntry>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  // The JSON is composed here rather than built as an nlohmann::ordered_json:
  // ordered_json finds keys by linear search, which makes a header of n
  // tensors cost O(n^2). The output is what ordered_json::dump() would give:
  // compact, keys in layout order, "__metadata__" first.
  SerializedHeader out;
  out.bytes.assign(8, '\0');  // The length, filled in at the end.
  out.bytes += '{';
  bool first = true;
  if (!metadata.empty()) {
    absl::flat_hash_set<absl::string_view> keys;
    out.bytes += R"("__metadata__":{)";
    for (const auto& [key, value] : metadata) {
      if (!keys.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate metadata key ", Quoted(key)));
      }
      MODELSTATE_ASSIGN_OR_RETURN(
          std::string key_json,
          JsonString(key, absl::StrCat("metadata key ", Quoted(key))));
      MODELSTATE_ASSIGN_OR_RETURN(
          std::string value_json,
          JsonString(value, absl::StrCat("metadata value of ", Quoted(key))));
      if (keys.size() > 1) out.bytes += ',';
      absl::StrAppend(&out.bytes, key_json, ":", value_json);
    }
    out.bytes += '}';
    first = false;
  }
  absl::flat_hash_set<absl::string_view> keys;
  uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    // "" is a name like any other (the reference library writes and reads
    // it); a load stages a state_dict with torch's unexpected key "" here.
    if (entry.key == kMetadataKey) {
      return absl::InvalidArgumentError(
          "a tensor cannot be named '__metadata__' (safetensors reserves it)");
    }
    if (!keys.insert(entry.key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor key ", Quoted(entry.key)));
    }
    absl::StatusOr<int64_t> numel = CheckedNumElements(entry.shape);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(entry.key), ": ", numel.status().message()));
    }
    absl::StatusOr<uint64_t> nbytes = CheckedNumBytes(*numel, entry.dtype);
    if (!nbytes.ok() ||
        *nbytes > std::numeric_limits<uint64_t>::max() - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(entry.key), ": shape ",
                       ShapeToString(entry.shape), " is too large"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        std::string key_json,
        JsonString(entry.key, absl::StrCat("tensor key ", Quoted(entry.key))));
    if (!first) out.bytes += ',';
    first = false;
    absl::StrAppend(&out.bytes, key_json, R"(:{"dtype":")",
                    SafetensorsDTypeName(entry.dtype), R"(","shape":[)",
                    absl::StrJoin(entry.shape, ","), R"(],"data_offsets":[)",
                    offset, ",", offset + *nbytes, "]}");
    offset += *nbytes;
  }
  out.bytes += '}';
  // Padding to a multiple of 8 keeps every tensor's bytes 8-aligned in the
  // file (the data section starts at 8 + N), as the reference writer does.
  out.bytes.append((8 - out.bytes.size() % 8) % 8, ' ');
  const uint64_t n = out.bytes.size() - 8;
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the safetensors header would be ", n,
        " bytes, more than the limit of ", kMaxSafetensorsHeaderBytes));
  }
  std::string length;
  AppendLittleEndian64(n, length);
  out.bytes.replace(0, 8, length);
  out.data_bytes = offset;
  return out;
}

struct OpenFile {
  std::unique_ptr<ScopedFd> fd;
  uint64_t size = 0;
};

absl::StatusOr<OpenFile> OpenForReading(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot open");
  OpenFile file;
  file.fd = std::make_unique<ScopedFd>(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  file.size = static_cast<uint64_t>(st.st_size);
  return file;
}

// A CPU tensor to read `entry`'s bytes into. Its size was checked against
// the data section, so a hostile header cannot make us allocate more than
// the file holds.
absl::StatusOr<Tensor> EmptyTensorFor(const SafetensorsEntry& entry) {
  absl::StatusOr<Tensor> tensor = Tensor::Empty(entry.dtype, entry.shape);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat("tensor ", Quoted(entry.key), ": ",
                                     tensor.status().message()));
  }
  return tensor;
}

// Reads the header with bounded reads: the 8-byte length first, then exactly
// the header, never more than the (already validated) length says.
absl::StatusOr<SafetensorsHeader> ReadHeaderFrom(const OpenFile& file,
                                                 const std::string& path) {
  std::string prefix(static_cast<size_t>(std::min<uint64_t>(file.size, 8)),
                     '\0');
  MODELSTATE_RETURN_IF_ERROR(
      PreadAll(file.fd->get(), prefix.data(), prefix.size(), 0, path));
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(prefix, file.size);
  if (header.ok()) return header;
  if (header.status().code() != absl::StatusCode::kOutOfRange) {
    return WithPath(path, header.status());
  }
  // The length passed its checks (it fits the file and the limit), so this
  // allocation is bounded by both.
  const uint64_t n = DecodeLittleEndian64(prefix);
  prefix.resize(static_cast<size_t>(8 + n));
  MODELSTATE_RETURN_IF_ERROR(
      PreadAll(file.fd->get(), prefix.data() + 8, n, 8, path));
  header = ParseSafetensorsHeader(prefix, file.size);
  if (!header.ok()) return WithPath(path, header.status());
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view prefix, uint64_t file_size) {
  if (prefix.size() > file_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prefix (", prefix.size(), " bytes) is longer than the file (",
        file_size, " bytes)"));
  }
  if (file_size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("the file is ", file_size,
                     " bytes, too short for the 8-byte header length"));
  }
  if (prefix.size() < 8) {
    return absl::OutOfRangeError(absl::StrCat(
        "need 8 bytes for the header length, have ", prefix.size()));
  }
  const uint64_t n = DecodeLittleEndian64(prefix);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", n, " exceeds the limit of ",
                     kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", n, " exceeds the ", file_size - 8,
                     " bytes that follow it in the file"));
  }
  if (n == 0) {
    return absl::InvalidArgumentError(
        "header length is 0 (an empty header is at least '{}')");
  }
  if (prefix.size() < 8 + n) {
    return absl::OutOfRangeError(absl::StrCat(
        "need ", 8 + n, " bytes for the header, have ", prefix.size()));
  }

  SafetensorsHeader header;
  header.data_start = 8 + n;
  header.data_bytes = file_size - 8 - n;
  const char* json_begin = prefix.data() + 8;
  // nlohmann's lexer takes a NUL byte for the end of the input and would
  // accept "{}\0<anything>". Valid JSON never holds a raw NUL (strings must
  // escape control characters), so refuse it up front.
  if (const void* nul = std::memchr(json_begin, '\0', n); nul != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is not valid JSON: NUL byte at byte ",
                     static_cast<const char*>(nul) - json_begin));
  }
  HeaderSaxHandler handler;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(json_begin, json_begin + n, &handler,
                                       nlohmann::json::input_format_t::json,
                                       /*strict=*/true);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory while parsing the safetensors header");
  } catch (const std::exception& e) {
    // Not expected (SAX reports errors through parse_error), but a hostile
    // header must never take the process down.
    return absl::InvalidArgumentError(
        absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!parsed || !handler.done()) {
    return absl::InvalidArgumentError(
        handler.error().empty() ? std::string("header is not valid JSON")
                                : handler.error());
  }

  header.entries.reserve(handler.entries().size());
  for (RawEntry& raw : handler.entries()) {
    MODELSTATE_ASSIGN_OR_RETURN(SafetensorsEntry entry,
                                ValidateEntry(raw, header.data_bytes));
    header.entries.push_back(std::move(entry));
  }
  MODELSTATE_RETURN_IF_ERROR(
      OrderAndCheckCoverage(header.entries, header.data_bytes));
  header.metadata = std::move(handler.metadata());
  return header;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(OpenFile file, OpenForReading(path));
  return ReadHeaderFrom(file, path);
}

absl::StatusOr<StateDict> ReadSafetensorsFile(const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(OpenFile file, OpenForReading(path));
  MODELSTATE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                              ReadHeaderFrom(file, path));
  StateDict state_dict;
  for (SafetensorsEntry& entry : header.entries) {
    absl::StatusOr<Tensor> tensor = EmptyTensorFor(entry);
    if (!tensor.ok()) return WithPath(path, tensor.status());
    MODELSTATE_ASSIGN_OR_RETURN(void* data, tensor->MutableDataForOverwrite());
    MODELSTATE_RETURN_IF_ERROR(PreadAll(
        file.fd->get(), static_cast<char*>(data), entry.end - entry.begin,
        header.data_start + entry.begin, path));
    state_dict.tensors.Set(std::move(entry.key), *std::move(tensor));
  }
  return state_dict;
}

absl::StatusOr<StateDict> ParseSafetensors(absl::string_view bytes) {
  MODELSTATE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                              ParseSafetensorsHeader(bytes, bytes.size()));
  StateDict state_dict;
  for (SafetensorsEntry& entry : header.entries) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor tensor, EmptyTensorFor(entry));
    MODELSTATE_ASSIGN_OR_RETURN(void* data, tensor.MutableDataForOverwrite());
    const size_t size = static_cast<size_t>(entry.end - entry.begin);
    if (size > 0) {
      std::memcpy(data, bytes.data() + header.data_start + entry.begin, size);
    }
    state_dict.tensors.Set(std::move(entry.key), std::move(tensor));
  }
  return state_dict;
}

absl::StatusOr<std::string> SerializeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  MODELSTATE_ASSIGN_OR_RETURN(SerializedHeader header,
                              Serialize(entries, metadata));
  return std::move(header.bytes);
}

absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>>
SafetensorsFileWriter::Open(
    const std::string& path, const std::vector<SafetensorsEntry>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  absl::StatusOr<SerializedHeader> header = Serialize(entries, metadata);
  if (!header.ok()) return WithPath(path, header.status());

  // Same directory as `path`, so the final rename stays on one file system
  // and is atomic; pid and counter keep concurrent writers apart.
  std::unique_ptr<SafetensorsFileWriter> writer(new SafetensorsFileWriter());
  writer->path_ = path;
  writer->temp_path_ = TempPathFor(path);
  writer->expected_ = header->data_bytes;
  int fd;
  do {
    fd = open(writer->temp_path_.c_str(),
              O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    writer->temp_path_.clear();  // Nothing for the destructor to remove.
    return ErrnoStatus(error, path, "cannot create the temporary file");
  }
  writer->fd_ = fd;
  writer->data_start_ = header->bytes.size();
  MODELSTATE_RETURN_IF_ERROR(WriteAll(fd, header->bytes, path));
  return writer;
}

SafetensorsFileWriter::~SafetensorsFileWriter() {
  if (fd_ >= 0) close(fd_);
  if (!finished_ && !temp_path_.empty()) unlink(temp_path_.c_str());
}

absl::Status SafetensorsFileWriter::Append(absl::string_view bytes) {
  if (finished_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": the writer is finished or failed"));
  }
  if (bytes.size() > expected_ - written_) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": appending ", bytes.size(), " bytes would exceed the ",
        expected_, " data bytes the header declares (", written_,
        " already written)"));
  }
  absl::Status status = WriteAll(fd_, bytes, path_);
  if (!status.ok()) {
    // How much of `bytes` reached the file is unknown: the writer cannot go
    // on, and the temporary file is useless.
    close(fd_);
    fd_ = -1;
    unlink(temp_path_.c_str());
    return status;
  }
  written_ += bytes.size();
  if (written_ - written_back_ >= kWritebackBytes) {
    // Start (not wait for) writing the new bytes back; errors surface in
    // Finish's fsync.
    sync_file_range(fd_, static_cast<off64_t>(data_start_ + written_back_),
                    static_cast<off64_t>(written_ - written_back_),
                    SYNC_FILE_RANGE_WRITE);
    written_back_ = written_;
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFileWriter::Finish() {
  if (finished_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": the writer is finished or failed"));
  }
  if (written_ != expected_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": only ", written_, " of the ", expected_,
                     " data bytes the header declares were written"));
  }
  // Any failure from here on leaves no usable temporary file.
  auto fail = [this](absl::Status status) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    unlink(temp_path_.c_str());
    return status;
  };
  if (fsync(fd_) != 0) return fail(ErrnoStatus(errno, path_, "fsync failed"));
  const int fd = fd_;
  fd_ = -1;
  // close() can report a delayed write error (e.g. on NFS).
  if (close(fd) != 0) return fail(ErrnoStatus(errno, path_, "close failed"));
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return fail(ErrnoStatus(errno, path_, "rename failed"));
  }
  finished_ = true;
  // The rename itself is durable only once the directory is synced.
  return FsyncParentDirectory(path_);
}

absl::Status WriteSafetensorsFile(
    const std::string& path, const StateDict& state_dict,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(state_dict.tensors.size());
  for (const auto& item : state_dict.tensors) {
    if (!item.value.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", Quoted(item.key), " is undefined (None)"));
    }
    if (!item.value.device().has_storage()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", Quoted(item.key), " is on ",
                       item.value.device().ToString(), " and has no data"));
    }
    SafetensorsEntry entry;
    entry.key = item.key;
    entry.dtype = item.value.dtype();
    entry.shape = item.value.shape();
    entries.push_back(std::move(entry));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsFileWriter> writer,
      SafetensorsFileWriter::Open(path, entries, metadata));
  std::string host_buffer;
  for (const auto& item : state_dict.tensors) {
    const Tensor& tensor = item.value;
    const char* data = static_cast<const char*>(tensor.raw_data());
    const size_t nbytes = tensor.nbytes();
    if (tensor.device().is_cpu()) {
      MODELSTATE_RETURN_IF_ERROR(
          writer->Append(absl::string_view(data, nbytes)));
      continue;
    }
    // Accelerator memory: stage through a bounded host buffer.
    if (host_buffer.empty() && nbytes > 0) {
      host_buffer.resize(kHostChunkBytes);
    }
    for (size_t done = 0; done < nbytes;) {
      const size_t piece = std::min(kHostChunkBytes, nbytes - done);
      absl::Status copied = CopyBytes(Device::Cpu(), host_buffer.data(),
                                      tensor.device(), data + done, piece);
      if (!copied.ok()) {
        return absl::Status(copied.code(),
                            absl::StrCat(path, ": tensor ", Quoted(item.key),
                                         ": ", copied.message()));
      }
      MODELSTATE_RETURN_IF_ERROR(
          writer->Append(absl::string_view(host_buffer.data(), piece)));
      done += piece;
    }
  }
  return writer->Finish();
}

}  // namespace modelstate
