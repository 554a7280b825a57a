// libFuzzer target for state_dict stream reassembly: a header message and
// data chunks, turned back into tensors.
//
// Input: one mode byte, then frames, each a varint length and a serialized
// modelstate.v1.StateDictChunk (the last frame may be cut short: it takes
// what is left; the varint framing is protobuf's delimited format). The frames
// are consumed as the client's GetStateDict consumes the server's stream: a
// header first, data after it, anything else ends the stream. The mode byte
// picks the sink, as the two ends of the service pick it:
//   % 3 == 0: StateDictAssembler with no limits (the client's MemorySink,
//             and the server's assign loads);
//   % 3 == 1: StagedStateDict in an anonymous file (a server without a data
//             directory), with the server's default limits;
//   % 3 == 2: StagedStateDict as a safetensors file (a durable server).
// The staged modes also read every entry back (Read, and CopyInto a tensor
// of the dtype that mode / 3 picks), and the safetensors file with the
// safetensors reader. Every accepted stream must give exactly the bytes
// that were sent, in layout order; a difference aborts.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "core/staged_state_dict.h"
#include "core/state_stream.h"
#include "core/tensor.h"
#include "google/protobuf/stubs/logging.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "proto/convert.h"
#include "tests/fuzz/fuzz_support.h"

namespace modelstate {
namespace {

[[noreturn]] void Broken(const std::string& what) {
  std::fprintf(stderr, "stream_fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

// The message is only built when the check fails: it is on the hot path.
#define REQUIRE(cond, message)    \
  do {                            \
    if (!(cond)) Broken(message); \
  } while (0)

using fuzz::DiscardProtobufLog;
using fuzz::Passed;
using fuzz::Verbose;

// A private directory for staging files, on tmpfs when there is one (the
// durable mode fsyncs every file), removed at exit.
const std::string& StagingDir() {
  static const std::string* dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if (const char* tmp = getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
      base = tmp;
    }
    std::string pattern = base + "/stream_fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("stream_fuzz: mkdtemp");
      std::abort();
    }
    auto* path = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(StagingDir(), ignored);
    });
    return path;
  }();
  return *dir;
}

// Splits the input into frames: a varint length, then that many bytes, or
// what is left when fewer remain.
class FrameReader {
 public:
  explicit FrameReader(absl::string_view input) : rest_(input) {}

  // The next frame; nullopt once the input is used up.
  std::optional<absl::string_view> Next() {
    if (rest_.empty()) return std::nullopt;
    uint64_t length = 0;
    size_t used = 0;
    for (int shift = 0; used < rest_.size() && shift < 64; shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(rest_[used++]);
      length |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) break;
    }
    rest_.remove_prefix(used);
    absl::string_view frame = rest_.substr(
        0, static_cast<size_t>(std::min<uint64_t>(length, rest_.size())));
    rest_.remove_prefix(frame.size());
    return frame;
  }

 private:
  absl::string_view rest_;
};

// Entry i's bytes are sent[offset_i, offset_i + nbytes_i).
void CheckTensor(const StateDictLayoutEntry& e, const Tensor& t,
                 absl::string_view bytes, absl::string_view how) {
  REQUIRE(t.dtype() == e.dtype && t.shape() == e.shape,
          absl::StrCat(how, ": dtype or shape of '", e.key, "' differs"));
  REQUIRE(t.nbytes() == e.nbytes,
          absl::StrCat(how, ": size of '", e.key, "' differs"));
  REQUIRE(e.nbytes == 0 || std::memcmp(t.raw_data(), bytes.data(),
                                       static_cast<size_t>(e.nbytes)) == 0,
          absl::StrCat(how, ": bytes of '", e.key, "' differ"));
}

void CheckKeys(const StateDictLayout& layout, const StateDict& sd,
               absl::string_view how) {
  REQUIRE(sd.tensors.size() == layout.entries.size(),
          absl::StrCat(how, ": entry count differs"));
  size_t i = 0;
  for (const auto& item : sd.tensors) {
    REQUIRE(item.key == layout.entries[i++].key,
            absl::StrCat(how, ": key order differs"));
  }
  REQUIRE(sd.metadata.has_value() == layout.metadata.has_value(),
          absl::StrCat(how, ": _metadata appeared or vanished"));
}

void CheckInMemory(const StateDictLayout& layout, const StateDict& sd,
                   absl::string_view sent) {
  CheckKeys(layout, sd, "assembler");
  uint64_t offset = 0;
  for (const StateDictLayoutEntry& e : layout.entries) {
    CheckTensor(e, *sd.tensors.Find(e.key), sent.substr(offset, e.nbytes),
                "assembler");
    offset += e.nbytes;
  }
}

void CheckStaged(const StateDictLayout& layout, StagedStateDict& staged,
                 const StateDict& described, absl::string_view sent,
                 DType copy_dtype) {
  CheckKeys(layout, described, "staged");
  uint64_t offset = 0;
  for (const StateDictLayoutEntry& e : layout.entries) {
    absl::string_view bytes = sent.substr(offset, e.nbytes);
    offset += e.nbytes;
    absl::StatusOr<Tensor> read = staged.Read(e.key);
    REQUIRE(read.ok(), absl::StrCat("staged Read('", e.key,
                                    "'): ", read.status().ToString()));
    CheckTensor(e, *read, bytes, "staged Read");
    // The load path: into a module tensor of maybe another dtype, which
    // must hold what converting the entry gives.
    absl::StatusOr<Tensor> target = Tensor::Empty(copy_dtype, e.shape);
    if (!target.ok()) continue;
    absl::Status copied = staged.CopyInto(e.key, *target);
    REQUIRE(copied.ok(), absl::StrCat("staged CopyInto('", e.key,
                                      "'): ", copied.ToString()));
    absl::StatusOr<Tensor> converted = read->To(Device::Cpu(), copy_dtype);
    REQUIRE(converted.ok(), "Tensor::To failed on a cpu tensor");
    REQUIRE(
        target->nbytes() == 0 ||
            std::memcmp(target->raw_data(), converted->raw_data(),
                        target->nbytes()) == 0,
        absl::StrCat("staged CopyInto('", e.key, "') differs from Tensor::To"));
  }
  if (staged.path().empty()) return;
  absl::StatusOr<StateDict> file = ReadSafetensorsFile(staged.path());
  REQUIRE(file.ok(), absl::StrCat("the staged safetensors file: ",
                                  file.status().ToString()));
  REQUIRE(file->tensors.size() == layout.entries.size(),
          "the staged safetensors file has other entries");
  offset = 0;
  for (const StateDictLayoutEntry& e : layout.entries) {
    const Tensor* t = file->tensors.Find(e.key);
    REQUIRE(t != nullptr, absl::StrCat("the staged file lacks '", e.key, "'"));
    CheckTensor(e, *t, sent.substr(offset, e.nbytes), "staged file");
    offset += e.nbytes;
  }
}

// What the service accepts by default (server/model_state_service.h).
StreamLimits ServerLimits() {
  StreamLimits limits;
  limits.max_tensor_bytes = uint64_t{16} << 30;
  limits.max_total_bytes = uint64_t{64} << 30;
  limits.max_entries = 1'000'000;
  return limits;
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const int mode = data[0] % 3;
  const DType copy_dtype = kAllDTypes[(data[0] / 3) % kNumDTypes];
  FrameReader frames(
      absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  v1::StateDictChunk chunk;
  std::optional<StateDictLayout> layout;
  std::unique_ptr<StateDictAssembler> assembler;
  std::unique_ptr<StagedStateDict> staged;
  std::string sent;  // every data byte accepted, in order
  while (std::optional<absl::string_view> frame = frames.Next()) {
    if (!chunk.ParseFromArray(frame->data(), static_cast<int>(frame->size()))) {
      Passed("frame", absl::InvalidArgumentError("not a StateDictChunk"));
      return;
    }
    if (chunk.payload_case() == v1::StateDictChunk::kHeader && !layout) {
      absl::StatusOr<StateDictLayout> parsed =
          convert::HeaderToLayout(chunk.header());
      if (!Passed("header", parsed.status())) return;
      layout = *parsed;
      if (mode == 0) {
        absl::StatusOr<std::unique_ptr<StateDictAssembler>> created =
            StateDictAssembler::Create(*parsed, StreamLimits{});
        if (!Passed("assembler", created.status())) return;
        assembler = *std::move(created);
      } else {
        absl::StatusOr<std::unique_ptr<StagedStateDict>> created =
            mode == 1 ? StagedStateDict::CreateAnonymous(
                            *parsed, ServerLimits(), StagingDir())
                      : StagedStateDict::CreateFile(
                            *parsed, ServerLimits(),
                            StagingDir() + "/staged.safetensors");
        if (!Passed("staged", created.status())) return;
        staged = *std::move(created);
      }
    } else if (chunk.payload_case() == v1::StateDictChunk::kData && layout) {
      std::string* bytes = chunk.mutable_data();
      absl::Status appended;
      if (assembler != nullptr) {
        appended = assembler->Append(*bytes);
        if (appended.ok()) sent += *bytes;
      } else {
        std::string copy = *bytes;
        appended = staged->Append(std::move(*bytes));
        if (appended.ok()) sent += copy;
      }
      if (!Passed("append", appended)) return;
    } else {
      // The client's "malformed state_dict stream".
      Passed("order", absl::InvalidArgumentError("header, then data"));
      return;
    }
  }
  if (!layout) return;
  if (assembler != nullptr) {
    absl::StatusOr<StateDict> result = assembler->Finish();
    if (Passed("finish", result.status())) {
      CheckInMemory(*layout, *result, sent);
    }
  } else {
    absl::StatusOr<StateDict> described = staged->Finish();
    if (Passed("finish", described.status())) {
      CheckStaged(*layout, *staged, *described, sent, copy_dtype);
    }
  }
  if (Verbose()) {
    std::fprintf(stderr, "stream_fuzz: mode %d done, %zu entries, %zu bytes\n",
                 mode, layout->entries.size(), sent.size());
  }
}

}  // namespace
}  // namespace modelstate

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(&modelstate::DiscardProtobufLog);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  modelstate::FuzzOne(data, size);
  return 0;
}
