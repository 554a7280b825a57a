// libFuzzer target for the safetensors reader: the input is a whole file.
//
// Besides "no crash, no sanitizer report", it checks that the three ways of
// reading agree (ParseSafetensorsHeader, ParseSafetensors in memory,
// ReadSafetensorsHeader / ReadSafetensorsFile from a file), that every
// accepted tensor holds exactly its byte range of the input, and that an
// accepted header written back by SerializeSafetensorsHeader reads back the
// same. A disagreement aborts, so libFuzzer keeps the input.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/safetensors.h"

namespace modelstate {
namespace {

[[noreturn]] void Broken(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzz: invariant broken: %s\n",
               what.c_str());
  std::abort();
}

// The message is only built when the check fails: it is on the hot path.
#define REQUIRE(cond, message)    \
  do {                            \
    if (!(cond)) Broken(message); \
  } while (0)

// The reader works on paths; a memfd gives it one without disk I/O, so
// the file path can run on every input. Reopened through /proc, it is a
// regular file to open() and fstat().
struct MemFile {
  int fd = -1;
  std::string path;
};

const MemFile& TheMemFile() {
  static const MemFile* file = [] {
    auto* f = new MemFile;
    f->fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
    if (f->fd >= 0) f->path = absl::StrCat("/proc/self/fd/", f->fd);
    return f;
  }();
  return *file;
}

bool WriteMemFile(const MemFile& file, absl::string_view bytes) {
  if (file.fd < 0 || ftruncate(file.fd, 0) != 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = pwrite(file.fd, bytes.data() + done, bytes.size() - done,
                       static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool SameEntries(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  if (a.entries.size() != b.entries.size()) return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const SafetensorsEntry& x = a.entries[i];
    const SafetensorsEntry& y = b.entries[i];
    if (x.key != y.key || x.dtype != y.dtype || x.shape != y.shape ||
        x.begin != y.begin || x.end != y.end) {
      return false;
    }
  }
  return a.data_bytes == b.data_bytes;
}

// `sd` must hold the header's tensors, in data order, each with exactly its
// range of `file`'s data section.
void CheckTensors(const SafetensorsHeader& header, const StateDict& sd,
                  absl::string_view file, absl::string_view how) {
  REQUIRE(sd.tensors.size() == header.entries.size(),
          absl::StrCat(how, ": tensor count differs from the header"));
  size_t i = 0;
  for (const auto& item : sd.tensors) {
    const SafetensorsEntry& e = header.entries[i++];
    REQUIRE(item.key == e.key, absl::StrCat(how, ": key order differs"));
    const Tensor& t = item.value;
    REQUIRE(t.dtype() == e.dtype && t.shape() == e.shape,
            absl::StrCat(how, ": dtype or shape of '", e.key, "' differs"));
    REQUIRE(t.nbytes() == e.end - e.begin,
            absl::StrCat(how, ": size of '", e.key, "' differs"));
    absl::string_view expected =
        file.substr(header.data_start + e.begin, e.end - e.begin);
    REQUIRE(t.nbytes() == 0 ||
                std::memcmp(t.raw_data(), expected.data(), t.nbytes()) == 0,
            absl::StrCat(how, ": bytes of '", e.key, "' differ"));
  }
}

void FuzzOne(absl::string_view file) {
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(file, file.size());
  // The file reader starts from an 8-byte prefix and reads more on
  // OUT_OF_RANGE; a short prefix must give the same verdict that way.
  absl::StatusOr<SafetensorsHeader> from_prefix = ParseSafetensorsHeader(
      file.substr(0, std::min<size_t>(file.size(), 8)), file.size());
  if (from_prefix.status().code() == absl::StatusCode::kOutOfRange) {
    REQUIRE(
        header.ok() || header.status().code() != absl::StatusCode::kOutOfRange,
        "a whole file cannot be too short for its own header");
  } else {
    REQUIRE(from_prefix.ok() == header.ok(),
            "an 8-byte prefix and the whole file disagree");
  }

  absl::StatusOr<StateDict> parsed = ParseSafetensors(file);
  REQUIRE(parsed.ok() == header.ok(),
          absl::StrCat("ParseSafetensors (", parsed.status().ToString(),
                       ") and ParseSafetensorsHeader (",
                       header.status().ToString(), ") disagree"));
  if (header.ok()) CheckTensors(*header, *parsed, file, "ParseSafetensors");

  const MemFile& mem = TheMemFile();
  if (WriteMemFile(mem, file)) {
    absl::StatusOr<SafetensorsHeader> read_header =
        ReadSafetensorsHeader(mem.path);
    REQUIRE(read_header.ok() == header.ok(),
            absl::StrCat("ReadSafetensorsHeader (",
                         read_header.status().ToString(), ") disagrees"));
    if (header.ok()) {
      REQUIRE(SameEntries(*header, *read_header),
              "ReadSafetensorsHeader gives other entries");
    }
    absl::StatusOr<StateDict> read = ReadSafetensorsFile(mem.path);
    REQUIRE(read.ok() == header.ok(),
            absl::StrCat("ReadSafetensorsFile (", read.status().ToString(),
                         ") disagrees"));
    if (header.ok()) CheckTensors(*header, *read, file, "ReadSafetensorsFile");
  }

  if (!header.ok()) return;
  // Written back, an accepted header must read back the same. The writer
  // may refuse what the reader takes (an empty key, say); that is no bug.
  absl::StatusOr<std::string> rewritten =
      SerializeSafetensorsHeader(header->entries, header->metadata);
  if (!rewritten.ok()) return;
  std::string copy = *rewritten;
  absl::StrAppend(&copy, file.substr(header->data_start));
  absl::StatusOr<SafetensorsHeader> again =
      ParseSafetensorsHeader(copy, copy.size());
  REQUIRE(again.ok(), absl::StrCat("a rewritten header does not parse: ",
                                   again.status().ToString()));
  REQUIRE(SameEntries(*header, *again), "a rewritten header differs");
  REQUIRE(again->metadata == header->metadata,
          "rewritten __metadata__ differs");
}

}  // namespace
}  // namespace modelstate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  modelstate::FuzzOne(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
