// File: state_stream.h
// A state_dict as a stream: a layout (ordered entries with dtype, shape and
// byte length, plus the _metadata versions) followed by the entries' bytes
// concatenated in layout order. The service sends and receives state_dicts
// this way in chunks of any size; safetensors files hold the same bytes.
//
// StateDictReader turns a snapshot into the stream without ever copying the
// whole state (optionally converting floating entries to another dtype on the
// fly); StateDictAssembler rebuilds and validates a StateDict from a layout
// and the bytes as they arrive, allocating each tensor only when its first
// byte arrives, or writes them into tensors the caller already has
// (CreateInto: refreshing a replica's weights in place).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto reader, StateDictReader::Create(snapshot,
//   {})); MODELSTATE_ASSIGN_OR_RETURN(auto assembler,
//   StateDictAssembler::Create(
//       reader->layout(), StreamLimits{}));
//   std::string chunk;
//   while (true) {
//     chunk.clear();
//     MODELSTATE_ASSIGN_OR_RETURN(size_t n, reader->Read(1 << 20, &chunk));
//     if (n == 0) break;
//     MODELSTATE_RETURN_IF_ERROR(assembler->Append(chunk));
//   }
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict copy, assembler->Finish());
#ifndef MODELSTATE_CORE_STATE_STREAM_H_
#define MODELSTATE_CORE_STATE_STREAM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/device_reader.h"
#include "core/hooks.h"
#include "core/module.h"
#include "core/tensor.h"

namespace modelstate {

struct StateDictLayoutEntry {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t nbytes = 0;  // numel * ElementSize(dtype)
  // What the entry is in its module (informational; parameter by default).
  EntryKind kind = EntryKind::kParameter;
  bool requires_grad = false;
};

struct StateDictLayout {
  std::vector<StateDictLayoutEntry> entries;
  // PyTorch's _metadata (module path -> version), when the state_dict has
  // it.
  std::optional<std::vector<std::pair<std::string, int>>> metadata;
  uint64_t total_bytes = 0;
};

// Limits on what an assembler accepts (RESOURCE_EXHAUSTED names the one
// exceeded).
struct StreamLimits {
  uint64_t max_tensor_bytes = UINT64_MAX;
  uint64_t max_total_bytes = UINT64_MAX;
  uint64_t max_entries = 1'000'000;
};

// Serves a snapshot's bytes in order. Thread-compatible.
class StateDictReader {
 public:
  // `snapshot`'s tensors must stay unchanged while reading (a
  // Module::GetStateDict() snapshot does: writers copy on write).
  // `target_dtype` (floating point) converts floating entries on the fly.
  // `kinds` (optional, same order) labels entries as parameters or buffers.
  // INVALID_ARGUMENT for a non-floating target dtype.
  static absl::StatusOr<std::unique_ptr<StateDictReader>> Create(
      StateDict snapshot, std::optional<DType> target_dtype,
      std::vector<EntryKind> kinds = {});

  const StateDictLayout& layout() const { return layout_; }

  // Appends up to `max_bytes` of the stream to `out`; returns how many
  // (0 once everything was read). FAILED_PRECONDITION for an entry on meta
  // (it has no bytes).
  absl::StatusOr<size_t> Read(size_t max_bytes, std::string* out);
  // Like Read, into `out`, which has room for `max_bytes`.
  absl::StatusOr<size_t> ReadInto(size_t max_bytes, char* out);
  // Like Read, handing each piece to `take` instead (never across entries;
  // valid only during the call). A piece `take` fails is not read: its
  // error is returned.
  absl::StatusOr<size_t> ReadTo(
      size_t max_bytes,
      absl::FunctionRef<absl::Status(absl::string_view piece)> take);
  // The entry the next byte belongs to, and how far into it (skipping
  // entries with no bytes); meaningless once remaining() is 0.
  std::pair<size_t, uint64_t> NextByte() const;

  // Bytes still to come.
  uint64_t remaining() const { return layout_.total_bytes - position_; }

 private:
  StateDictReader() = default;
  // Read's work; `emit(bytes, n)` takes each piece in order.
  template <typename Emit>
  absl::StatusOr<size_t> ReadWith(size_t max_bytes, Emit emit);

  // Starts downloading the next entry on an accelerator, if any, while the
  // caller sends what was read.
  void PrefetchNextDeviceEntry();

  StateDictLayout layout_;
  std::vector<Tensor> tensors_;
  // Entries on accelerators are read through it (declared after tensors_:
  // it is destroyed first, waiting for a download of one of them).
  DeviceReader device_reader_;
  size_t entry_ = 0;           // current entry
  uint64_t entry_offset_ = 0;  // bytes of the current entry already read
  uint64_t position_ = 0;
};

// Checks a layout a client sent: keys non-empty and unique, shapes
// non-negative without overflow, nbytes == numel * element size, total ==
// sum, within `limits`. INVALID_ARGUMENT / RESOURCE_EXHAUSTED naming the
// entry.
absl::Status ValidateLayout(const StateDictLayout& layout,
                            const StreamLimits& limits);

// Rebuilds a StateDict from a layout and its bytes. Thread-compatible.
class StateDictAssembler {
 public:
  // Validates the layout (ValidateLayout).
  static absl::StatusOr<std::unique_ptr<StateDictAssembler>> Create(
      StateDictLayout layout, const StreamLimits& limits);
  // Like Create, but each entry's bytes overwrite `into`'s tensor of the same
  // key in place (the same tensor objects; `into`'s other keys are left
  // alone), and Finish returns those tensors. INVALID_ARGUMENT naming the key
  // when `into` lacks an entry or has it with another dtype or shape, or not
  // on cpu. A tensor whose storage another tensor shares gets storage of its
  // own first (copy on write). After a failed stream a target's bytes are
  // unspecified.
  static absl::StatusOr<std::unique_ptr<StateDictAssembler>> CreateInto(
      StateDictLayout layout, const StreamLimits& limits,
      const StateDict& into);

  const StateDictLayout& layout() const { return layout_; }

  // Consumes the next bytes of the stream. INVALID_ARGUMENT when more bytes
  // arrive than the layout declares.
  absl::Status Append(absl::string_view bytes);
  // Before the first Append: makes every entry's tensor now and says where
  // each one's bytes go, in layout order, for a writer that puts them there
  // itself (see Placed). FAILED_PRECONDITION once bytes arrived.
  absl::StatusOr<std::vector<absl::Span<char>>> PlaceAll();
  // The next `n` bytes of the stream were written where PlaceAll said.
  // FAILED_PRECONDITION without PlaceAll; INVALID_ARGUMENT as Append.
  absl::Status Placed(uint64_t n);
  // The StateDict, once exactly total_bytes arrived; INVALID_ARGUMENT saying
  // how many bytes are missing otherwise.
  absl::StatusOr<StateDict> Finish();

  uint64_t received() const { return received_; }

 private:
  StateDictAssembler() = default;
  absl::Status StartEntry();
  // The tensor entry `i`'s bytes go into: the caller's (CreateInto) or new.
  absl::StatusOr<Tensor> TargetFor(size_t i) const;
  // Append's and Placed's work: `bytes` copied in, or taken as written when
  // null.
  absl::Status Consume(const char* bytes, uint64_t n);

  StateDictLayout layout_;
  StateDict result_;
  size_t entry_ = 0;
  uint64_t entry_offset_ = 0;
  uint64_t received_ = 0;
  Tensor current_;
  char* current_data_ = nullptr;
  // PlaceAll's tensors, taken in turn by StartEntry.
  std::vector<Tensor> placed_;
  // CreateInto's targets, in layout order; empty for Create.
  std::vector<Tensor> into_;
};

// The layout of a snapshot (no target dtype).
StateDictLayout LayoutOf(const StateDict& state_dict);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STATE_STREAM_H_
