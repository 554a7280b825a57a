// File: convert.h
// Conversions between the wire format (modelstate.v1 protos) and the model's
// types that clients and the server share: status codes, dtypes, devices,
// tensors and state_dict stream headers. The server's conversions of
// service and layer-library types are in proto/service_convert.h. Every
// parser validates and names the offending field in its INVALID_ARGUMENT
// message ("tensor.shape: ..."), so that the server and the client stay thin.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor t, convert::TensorFromProto(&proto, "tensor", max_bytes));
//   MODELSTATE_RETURN_IF_ERROR(convert::TensorToProto(t, &reply));
#ifndef MODELSTATE_PROTO_CONVERT_H_
#define MODELSTATE_PROTO_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/registration.h"
#include "core/state_stream.h"
#include "core/tensor.h"
#include "grpcpp/support/status.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "modelstate/v1/tensor.pb.h"

namespace modelstate::convert {

// INVALID_ARGUMENT "<field>: <message>".
absl::Status FieldError(absl::string_view field, absl::string_view message);
// Prefixes `status`'s message with `field` (OK stays OK).
absl::Status InField(const absl::Status& status, absl::string_view field);

// absl and gRPC share google.rpc.Code numbering. The message is cut
// (FitStatusMessage) so that any client receives it: gRPC clients refuse
// trailers over 8 KiB, and PyTorch's load errors list every key (a
// checkpoint saved with a "module." prefix gives one line per entry).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// `message` unchanged when it takes at most kMaxStatusMessageBytes in the
// trailers (percent-encoded), else its start and " ... [N more bytes]".
inline constexpr size_t kMaxStatusMessageBytes = 4096;
std::string FitStatusMessage(absl::string_view message);

// The trailing metadata naming the audit records a call wrote: ascending
// runs as "FIRST-LAST", single seqs as "N", comma-separated ("12-14,20").
// The text is at most kMaxAuditSeqsTrailerBytes (gRPC refuses large
// metadata): runs that do not fit are left out and it ends in ",more"; a
// mutating RPC's response field audit_seqs always has them all.
inline constexpr char kAuditSeqsKey[] = "modelstate-audit-seqs";
inline constexpr size_t kMaxAuditSeqsTrailerBytes = 1024;
std::string AuditSeqsTrailer(absl::Span<const uint64_t> seqs,
                             size_t max_bytes = kMaxAuditSeqsTrailerBytes);
// The seqs a trailer names; *truncated says whether it ended in "more".
// Malformed parts, and runs longer than a million, are skipped.
std::vector<uint64_t> ParseAuditSeqsTrailer(absl::string_view text,
                                            bool* truncated = nullptr);

v1::DType DTypeToProto(DType dtype);
// INVALID_ARGUMENT naming `field` for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field);
// A dtype in any spelling; `fallback` when `text` is empty.
absl::StatusOr<DType> ParseDTypeField(absl::string_view text,
                                      absl::string_view field,
                                      std::optional<DType> fallback);
// A device string; `fallback` when empty.
absl::StatusOr<Device> ParseDeviceField(absl::string_view text,
                                        absl::string_view field,
                                        std::optional<Device> fallback);
// Takes the bytes out of `proto` (no copy). Checks the size against the
// shape and `max_tensor_bytes` (RESOURCE_EXHAUSTED), and moves the tensor to
// the proto's device.
absl::StatusOr<Tensor> TensorFromProto(v1::TensorProto* proto,
                                       absl::string_view field,
                                       uint64_t max_tensor_bytes);
// Copies the tensor's bytes into `proto` (tensors on accelerators via the
// host).
absl::Status TensorToProto(const Tensor& tensor, v1::TensorProto* proto);
void TensorInfoToProto(const Tensor& tensor, bool persistent, bool with_hash,
                       v1::TensorInfo* info);

v1::EntryKind EntryKindToProto(EntryKind kind);

void LayoutToHeader(const StateDictLayout& layout, v1::StateDictHeader* header);
absl::StatusOr<StateDictLayout> HeaderToLayout(
    const v1::StateDictHeader& header);

}  // namespace modelstate::convert

#endif  // MODELSTATE_PROTO_CONVERT_H_
