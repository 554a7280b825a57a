#include "core/state_stream.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace modelstate {

StateDictLayout LayoutOf(const StateDict& state_dict) {
  StateDictLayout layout;
  for (const auto& item : state_dict.tensors) {
    StateDictLayoutEntry e;
    e.key = item.key;
    if (item.value.defined()) {
      e.dtype = item.value.dtype();
      e.shape = item.value.shape();
      e.nbytes = item.value.nbytes();
      e.requires_grad = item.value.requires_grad();
      e.kind = item.value.is_parameter() ? EntryKind::kParameter
                                         : EntryKind::kBuffer;
    }
    layout.total_bytes += e.nbytes;
    layout.entries.push_back(std::move(e));
  }
  if (state_dict.metadata.has_value()) {
    layout.metadata.emplace();
    for (const auto& item : *state_dict.metadata) {
      layout.metadata->emplace_back(item.key, item.value);
    }
  }
  return layout;
}

absl::StatusOr<std::unique_ptr<StateDictReader>> StateDictReader::Create(
    StateDict snapshot, std::optional<DType> target_dtype,
    std::vector<EntryKind> kinds) {
  if (target_dtype.has_value() && !IsFloatingPoint(*target_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_dtype must be a floating point dtype, got ",
                     DTypeName(*target_dtype)));
  }
  std::unique_ptr<StateDictReader> reader(new StateDictReader());
  reader->layout_ = LayoutOf(snapshot);
  reader->layout_.total_bytes = 0;
  size_t i = 0;
  for (auto& item : snapshot.tensors) {
    StateDictLayoutEntry& e = reader->layout_.entries[i];
    if (!item.value.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state_dict entry '", item.key, "' is None"));
    }
    if (target_dtype.has_value() && IsFloatingPoint(e.dtype)) {
      e.dtype = *target_dtype;
      e.nbytes =
          static_cast<uint64_t>(item.value.numel()) * ElementSize(e.dtype);
    }
    if (i < kinds.size()) e.kind = kinds[i];
    reader->layout_.total_bytes += e.nbytes;
    reader->tensors_.push_back(std::move(item.value));
    ++i;
  }
  return reader;
}

void StateDictReader::PrefetchNextDeviceEntry() {
  for (size_t i = entry_ + 1; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.nbytes() == 0) continue;
    if (t.device().has_storage() && !t.device().is_cpu()) {
      device_reader_.Prefetch(t, 0);
    }
    return;
  }
}

absl::StatusOr<size_t> StateDictReader::Read(size_t max_bytes,
                                             std::string* out) {
  return ReadWith(max_bytes, [out](const char* bytes, size_t n) {
    out->append(bytes, n);
    return absl::OkStatus();
  });
}

absl::StatusOr<size_t> StateDictReader::ReadInto(size_t max_bytes, char* out) {
  return ReadWith(max_bytes, [&out](const char* bytes, size_t n) {
    std::memcpy(out, bytes, n);
    out += n;
    return absl::OkStatus();
  });
}

absl::StatusOr<size_t> StateDictReader::ReadTo(
    size_t max_bytes,
    absl::FunctionRef<absl::Status(absl::string_view piece)> take) {
  return ReadWith(max_bytes, [take](const char* bytes, size_t n) {
    return take(absl::string_view(bytes, n));
  });
}

std::pair<size_t, uint64_t> StateDictReader::NextByte() const {
  size_t entry = entry_;
  uint64_t offset = entry_offset_;
  while (entry < layout_.entries.size() &&
         offset == layout_.entries[entry].nbytes) {
    ++entry;
    offset = 0;
  }
  return {entry, offset};
}

template <typename Emit>
absl::StatusOr<size_t> StateDictReader::ReadWith(size_t max_bytes, Emit emit) {
  size_t produced = 0;
  while (produced < max_bytes && entry_ < tensors_.size()) {
    const StateDictLayoutEntry& e = layout_.entries[entry_];
    const Tensor& t = tensors_[entry_];
    if (entry_offset_ == e.nbytes) {
      ++entry_;
      entry_offset_ = 0;
      continue;
    }
    if (!t.device().has_storage()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state_dict entry '", e.key,
          "' is on the meta device and has no data; ask for metadata only"));
    }
    if (entry_offset_ == 0) {
      // A file's bytes are checked before the first of them is served.
      MODELSTATE_RETURN_IF_ERROR(CheckTensorBytes(e.key, t));
    }
    const bool on_host = t.device().is_cpu();
    const char* data = static_cast<const char*>(t.raw_data());
    size_t n = static_cast<size_t>(
        std::min<uint64_t>(max_bytes - produced, e.nbytes - entry_offset_));
    if (e.dtype == t.dtype()) {
      const char* src = data + entry_offset_;
      if (!on_host) {
        MODELSTATE_ASSIGN_OR_RETURN(absl::string_view bytes,
                                    device_reader_.Read(t, entry_offset_, n));
        src = bytes.data();
        n = bytes.size();
      }
      MODELSTATE_RETURN_IF_ERROR(emit(src, n));
    } else {
      // Convert the whole elements covering [entry_offset_, +n) through a
      // small buffer, so that a chunk may end in the middle of an element.
      const size_t out_es = ElementSize(e.dtype);
      const size_t in_es = ElementSize(t.dtype());
      const uint64_t first = entry_offset_ / out_es;
      uint64_t last = (entry_offset_ + n + out_es - 1) / out_es;  // exclusive
      const char* src = data + first * in_es;
      if (!on_host) {
        // The device window may end sooner; it holds whole elements.
        MODELSTATE_ASSIGN_OR_RETURN(
            absl::string_view bytes,
            device_reader_.Read(t, first * in_es, (last - first) * in_es));
        src = bytes.data();
        last = first + bytes.size() / in_es;
        n = static_cast<size_t>(
            std::min<uint64_t>(n, last * out_es - entry_offset_));
      }
      std::string converted((last - first) * out_es, '\0');
      ConvertElements(src, t.dtype(), converted.data(), e.dtype,
                      static_cast<int64_t>(last - first));
      MODELSTATE_RETURN_IF_ERROR(
          emit(converted.data() + (entry_offset_ - first * out_es), n));
    }
    entry_offset_ += n;
    produced += n;
    position_ += n;
    if (entry_offset_ == e.nbytes) PrefetchNextDeviceEntry();
  }
  return produced;
}

absl::Status ValidateLayout(const StateDictLayout& layout,
                            const StreamLimits& limits) {
  if (layout.entries.size() > limits.max_entries) {
    return absl::ResourceExhaustedError(
        absl::StrCat("header: ", layout.entries.size(),
                     " entries exceed the limit of ", limits.max_entries));
  }
  absl::flat_hash_set<std::string> seen;
  uint64_t total = 0;
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const StateDictLayoutEntry& e = layout.entries[i];
    std::string where = absl::StrCat("header.entries[", i, "]");
    // An empty key is allowed: torch's load_state_dict lists "" among the
    // unexpected keys (strict: "Unexpected key(s) in state_dict: \"\".").
    if (!seen.insert(e.key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".key '", e.key, "' appears twice"));
    }
    absl::StatusOr<int64_t> numel = CheckedNumElements(e.shape);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".shape of '", e.key, "': ", numel.status().message()));
    }
    absl::StatusOr<uint64_t> nbytes = CheckedNumBytes(*numel, e.dtype);
    if (!nbytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " '", e.key, "': ", nbytes.status().message()));
    }
    if (*nbytes != e.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".byte_length of '", e.key, "' is ", e.nbytes, " but ",
          DTypeName(e.dtype), ShapeToString(e.shape), " needs ", *nbytes));
    }
    if (e.nbytes > limits.max_tensor_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(where, " '", e.key, "' has ", e.nbytes,
                       " bytes, over the max_tensor_bytes limit of ",
                       limits.max_tensor_bytes));
    }
    if (e.nbytes > UINT64_MAX - total) {
      return absl::InvalidArgumentError("header: total size overflows");
    }
    total += e.nbytes;
  }
  if (total != layout.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.total_bytes is ", layout.total_bytes,
                     " but the entries add up to ", total));
  }
  if (total > limits.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "header: ", total, " bytes exceed the max_total_bytes limit of ",
        limits.max_total_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StateDictAssembler>> StateDictAssembler::Create(
    StateDictLayout layout, const StreamLimits& limits) {
  MODELSTATE_RETURN_IF_ERROR(ValidateLayout(layout, limits));
  std::unique_ptr<StateDictAssembler> a(new StateDictAssembler());
  a->layout_ = std::move(layout);
  if (a->layout_.metadata.has_value()) {
    a->result_.metadata.emplace();
    for (const auto& [path, version] : *a->layout_.metadata) {
      a->result_.metadata->Set(path, version);
    }
  }
  return a;
}

absl::StatusOr<std::unique_ptr<StateDictAssembler>>
StateDictAssembler::CreateInto(StateDictLayout layout,
                               const StreamLimits& limits,
                               const StateDict& into) {
  std::vector<Tensor> targets;
  targets.reserve(layout.entries.size());
  for (const StateDictLayoutEntry& e : layout.entries) {
    const Tensor* t = into.tensors.Find(e.key);
    if (t == nullptr || !t->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("into: no tensor for '", e.key,
                       "', which the fetched state_dict has"));
    }
    if (t->dtype() != e.dtype || t->shape() != e.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("into['", e.key, "']: ", DTypeName(t->dtype()), " ",
                       ShapeToString(t->shape()), ", but the fetched entry is ",
                       DTypeName(e.dtype), " ", ShapeToString(e.shape)));
    }
    if (!t->device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("into['", e.key, "']: on ", t->device().ToString(),
                       "; only cpu tensors can be written in place"));
    }
    targets.push_back(*t);
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<StateDictAssembler> a,
                              Create(std::move(layout), limits));
  a->into_ = std::move(targets);
  return a;
}

absl::StatusOr<Tensor> StateDictAssembler::TargetFor(size_t i) const {
  if (!into_.empty()) return into_[i];
  const StateDictLayoutEntry& e = layout_.entries[i];
  return Tensor::Empty(e.dtype, e.shape);
}

absl::Status StateDictAssembler::StartEntry() {
  if (placed_.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(current_, TargetFor(entry_));
  } else {
    current_ = std::move(placed_[entry_]);
  }
  MODELSTATE_ASSIGN_OR_RETURN(void* data, current_.MutableDataForOverwrite());
  current_data_ = static_cast<char*>(data);
  entry_offset_ = 0;
  return absl::OkStatus();
}

absl::Status StateDictAssembler::Append(absl::string_view bytes) {
  return Consume(bytes.data(), bytes.size());
}

absl::StatusOr<std::vector<absl::Span<char>>> StateDictAssembler::PlaceAll() {
  if (received_ > 0 || current_.defined() || !placed_.empty()) {
    return absl::FailedPreconditionError(
        "PlaceAll: bytes were received already");
  }
  std::vector<absl::Span<char>> where;
  where.reserve(layout_.entries.size());
  // Kept only when every entry has its tensor: on failure, Append still
  // makes them one at a time.
  std::vector<Tensor> placed;
  placed.reserve(layout_.entries.size());
  const ScopedBatchedPrefault batch;
  for (size_t i = 0; i < layout_.entries.size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor t, TargetFor(i));
    MODELSTATE_ASSIGN_OR_RETURN(void* data, t.MutableDataForOverwrite());
    where.emplace_back(static_cast<char*>(data), layout_.entries[i].nbytes);
    placed.push_back(std::move(t));
  }
  placed_ = std::move(placed);
  return where;
}

absl::Status StateDictAssembler::Placed(uint64_t n) {
  if (placed_.empty() && n > 0) {
    return absl::FailedPreconditionError(
        "Placed: no entry's memory was handed out (PlaceAll)");
  }
  return Consume(nullptr, n);
}

absl::Status StateDictAssembler::Consume(const char* bytes, uint64_t size) {
  if (size > layout_.total_bytes - received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: received more than the ", layout_.total_bytes,
                     " bytes the header declares"));
  }
  while (size > 0 ||
         (entry_ < layout_.entries.size() &&
          layout_.entries[entry_].nbytes == 0 && !current_.defined())) {
    if (!current_.defined()) MODELSTATE_RETURN_IF_ERROR(StartEntry());
    const StateDictLayoutEntry& e = layout_.entries[entry_];
    size_t n =
        static_cast<size_t>(std::min<uint64_t>(size, e.nbytes - entry_offset_));
    if (n > 0 && bytes != nullptr) {
      std::memcpy(current_data_ + entry_offset_, bytes, n);
      bytes += n;
    }
    entry_offset_ += n;
    received_ += n;
    size -= n;
    if (entry_offset_ == e.nbytes) {
      result_.tensors.Set(e.key, std::move(current_));
      current_ = Tensor();
      current_data_ = nullptr;
      ++entry_;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateDict> StateDictAssembler::Finish() {
  if (received_ != layout_.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stream ended after ", received_, " of ",
                     layout_.total_bytes, " data bytes"));
  }
  // Zero-byte entries at the end have not been visited by Append.
  MODELSTATE_RETURN_IF_ERROR(Append(""));
  return std::move(result_);
}

}  // namespace modelstate
