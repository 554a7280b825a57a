#include "proto/convert.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

namespace modelstate::convert {

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

absl::Status InField(const absl::Status& status, absl::string_view field) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(field, ": ", status.message()));
}

std::string FitStatusMessage(absl::string_view message) {
  // gRPC sends the message percent-encoded in the trailers: a byte outside
  // printable ASCII, or '%', takes three.
  auto cost = [&](size_t i) -> size_t {
    const unsigned char c = static_cast<unsigned char>(message[i]);
    return (c < 0x20 || c > 0x7e || c == '%') ? 3 : 1;
  };
  size_t encoded = 0, fits = 0;
  for (; fits < message.size(); ++fits) {
    if (encoded + cost(fits) > kMaxStatusMessageBytes) break;
    encoded += cost(fits);
  }
  if (fits == message.size()) return std::string(message);
  // A note of at most 64 bytes follows; cut at a character's start.
  while (fits > 0 && encoded + 64 > kMaxStatusMessageBytes) {
    encoded -= cost(--fits);
  }
  while (fits > 0 &&
         (static_cast<unsigned char>(message[fits]) & 0xc0) == 0x80) {
    --fits;
  }
  return absl::StrCat(message.substr(0, fits), " ... [", message.size() - fits,
                      " more bytes]");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      FitStatusMessage(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

v1::DType DTypeToProto(DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype) + 1);
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  int value = static_cast<int>(dtype);
  if (value < 1 || value > kNumDTypes) {
    return FieldError(field, absl::StrCat("dtype ",
                                          v1::DType_Name(dtype).empty()
                                              ? absl::StrCat(value)
                                              : v1::DType_Name(dtype),
                                          " is not a tensor dtype"));
  }
  return static_cast<DType>(value - 1);
}

absl::StatusOr<DType> ParseDTypeField(absl::string_view text,
                                      absl::string_view field,
                                      std::optional<DType> fallback) {
  if (text.empty()) {
    if (fallback.has_value()) return *fallback;
    return FieldError(field, "a dtype is required");
  }
  absl::StatusOr<DType> dtype = ParseDType(text);
  if (!dtype.ok()) return InField(dtype.status(), field);
  return dtype;
}

absl::StatusOr<Device> ParseDeviceField(absl::string_view text,
                                        absl::string_view field,
                                        std::optional<Device> fallback) {
  if (text.empty()) {
    if (fallback.has_value()) return *fallback;
    return FieldError(field, "a device is required");
  }
  absl::StatusOr<Device> device = ParseDevice(text);
  if (!device.ok()) return InField(device.status(), field);
  return device;
}

absl::StatusOr<Tensor> TensorFromProto(v1::TensorProto* proto,
                                       absl::string_view field,
                                       uint64_t max_tensor_bytes) {
  MODELSTATE_ASSIGN_OR_RETURN(
      DType dtype,
      DTypeFromProto(proto->dtype(), absl::StrCat(field, ".dtype")));
  Shape shape(proto->shape().begin(), proto->shape().end());
  absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  if (!numel.ok())
    return InField(numel.status(), absl::StrCat(field, ".shape"));
  absl::StatusOr<uint64_t> nbytes = CheckedNumBytes(*numel, dtype);
  if (!nbytes.ok())
    return InField(nbytes.status(), absl::StrCat(field, ".shape"));
  if (*nbytes > max_tensor_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": ", *nbytes, " bytes exceed the max_tensor_bytes limit of ",
        max_tensor_bytes));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      Device device,
      ParseDeviceField(proto->device(), absl::StrCat(field, ".device"),
                       Device::Cpu()));
  if (device.is_meta()) {
    if (!proto->data().empty()) {
      return FieldError(absl::StrCat(field, ".data"),
                        "a meta tensor carries no data");
    }
    return Tensor::Empty(dtype, std::move(shape), device);
  }
  if (proto->data().size() != *nbytes) {
    return FieldError(absl::StrCat(field, ".data"),
                      absl::StrCat("has ", proto->data().size(), " bytes but ",
                                   DTypeName(dtype), ShapeToString(shape),
                                   " needs ", *nbytes));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor t, Tensor::FromBytes(dtype, std::move(shape),
                                  std::move(*proto->mutable_data())));
  if (!device.is_cpu()) {
    absl::StatusOr<Tensor> moved = t.To(device, dtype);
    if (!moved.ok())
      return InField(moved.status(), absl::StrCat(field, ".device"));
    return moved;
  }
  return t;
}

absl::Status TensorToProto(const Tensor& tensor, v1::TensorProto* proto) {
  proto->set_dtype(DTypeToProto(tensor.dtype()));
  for (int64_t d : tensor.shape()) proto->add_shape(d);
  proto->set_device(tensor.device().ToString());
  proto->set_requires_grad(tensor.requires_grad());
  if (!tensor.device().has_storage()) return absl::OkStatus();
  std::string* data = proto->mutable_data();
  data->resize(tensor.nbytes());
  return CopyBytes(Device::Cpu(), data->data(), tensor.device(),
                   tensor.raw_data(), tensor.nbytes());
}

void TensorInfoToProto(const Tensor& tensor, bool persistent, bool with_hash,
                       v1::TensorInfo* info) {
  info->set_dtype(DTypeToProto(tensor.dtype()));
  for (int64_t d : tensor.shape()) info->add_shape(d);
  info->set_device(tensor.device().ToString());
  info->set_nbytes(tensor.nbytes());
  info->set_requires_grad(tensor.requires_grad());
  info->set_persistent(persistent);
  if (with_hash) info->set_sha256(ContentHash(tensor));
}

v1::EntryKind EntryKindToProto(EntryKind kind) {
  return static_cast<v1::EntryKind>(static_cast<int>(kind) + 1);
}

void LayoutToHeader(const StateDictLayout& layout,
                    v1::StateDictHeader* header) {
  for (const StateDictLayoutEntry& e : layout.entries) {
    v1::StateDictEntry* out = header->add_entries();
    out->set_key(e.key);
    out->set_dtype(DTypeToProto(e.dtype));
    for (int64_t d : e.shape) out->add_shape(d);
    out->set_byte_length(e.nbytes);
    out->set_kind(EntryKindToProto(e.kind));
    out->set_requires_grad(e.requires_grad);
  }
  if (layout.metadata.has_value()) {
    for (const auto& [path, version] : *layout.metadata) {
      v1::ModuleVersion* m = header->add_metadata();
      m->set_path(path);
      m->set_version(version);
    }
  }
  header->set_total_bytes(layout.total_bytes);
}

absl::StatusOr<StateDictLayout> HeaderToLayout(
    const v1::StateDictHeader& header) {
  StateDictLayout layout;
  for (int i = 0; i < header.entries_size(); ++i) {
    const v1::StateDictEntry& in = header.entries(i);
    StateDictLayoutEntry e;
    e.key = in.key();
    MODELSTATE_ASSIGN_OR_RETURN(
        e.dtype, DTypeFromProto(in.dtype(),
                                absl::StrCat("header.entries[", i, "].dtype")));
    e.shape.assign(in.shape().begin(), in.shape().end());
    e.nbytes = in.byte_length();
    e.kind = in.kind() == v1::ENTRY_KIND_BUFFER ? EntryKind::kBuffer
                                                : EntryKind::kParameter;
    e.requires_grad = in.requires_grad();
    layout.entries.push_back(std::move(e));
  }
  if (header.metadata_size() > 0) {
    layout.metadata.emplace();
    for (const v1::ModuleVersion& m : header.metadata()) {
      layout.metadata->emplace_back(m.path(), m.version());
    }
  }
  layout.total_bytes = header.total_bytes();
  return layout;
}

std::string AuditSeqsTrailer(absl::Span<const uint64_t> seqs,
                             size_t max_bytes) {
  constexpr absl::string_view kMore = ",more";
  std::string text;
  for (size_t i = 0; i < seqs.size();) {
    size_t j = i;
    while (j + 1 < seqs.size() && seqs[j + 1] == seqs[j] + 1) ++j;
    // The run as it would be appended, with its separating comma.
    std::string run = text.empty() ? "" : ",";
    if (j == i) {
      absl::StrAppend(&run, seqs[i]);
    } else {
      absl::StrAppend(&run, seqs[i], "-", seqs[j]);
    }
    const bool last = j + 1 == seqs.size();
    if (text.size() + run.size() + (last ? 0 : kMore.size()) > max_bytes) {
      absl::StrAppend(&text, text.empty() ? "more" : kMore);
      return text;
    }
    text += run;
    i = j + 1;
  }
  return text;
}

std::vector<uint64_t> ParseAuditSeqsTrailer(absl::string_view text,
                                            bool* truncated) {
  // A trailer names one call's records: bound what a hostile server's text
  // can make this client hold.
  constexpr uint64_t kMaxRun = 1'000'000;
  constexpr size_t kMaxSeqs = 1'000'000;
  std::vector<uint64_t> seqs;
  if (truncated != nullptr) *truncated = false;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (part == "more") {
      if (truncated != nullptr) *truncated = true;
      continue;
    }
    std::pair<absl::string_view, absl::string_view> ends =
        absl::StrSplit(part, absl::MaxSplits('-', 1));
    uint64_t first = 0, last = 0;
    if (!absl::SimpleAtoi(ends.first, &first)) continue;
    if (ends.second.empty() && !absl::StrContains(part, '-')) {
      last = first;
    } else if (!absl::SimpleAtoi(ends.second, &last) || last < first ||
               last - first >= kMaxRun) {
      continue;
    }
    if (seqs.size() + (last - first) >= kMaxSeqs) {
      if (truncated != nullptr) *truncated = true;
      break;
    }
    for (uint64_t seq = first;; ++seq) {
      seqs.push_back(seq);
      if (seq == last) break;
    }
  }
  return seqs;
}

}  // namespace modelstate::convert
