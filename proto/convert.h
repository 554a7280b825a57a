// File: convert.h
// Conversions between the wire format (modelstate.v1 protos) and core
// types. Every parser validates and names the offending field in its
// INVALID_ARGUMENT message ("spec.children[1].args[0]: ..."), so that the
// server and the client stay thin.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(ModuleSpec spec,
//   convert::SpecFromProto(request.spec())); convert::ModuleInfoToProto(*root,
//   /*with_hashes=*/false, response.mutable_info());
#ifndef MODELSTATE_PROTO_CONVERT_H_
#define MODELSTATE_PROTO_CONVERT_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/audit_log.h"
#include "core/model_store.h"
#include "core/module.h"
#include "core/module_spec.h"
#include "core/state_stream.h"
#include "core/subscriber_hub.h"
#include "core/tensor.h"
#include "google/protobuf/struct.pb.h"
#include "grpcpp/support/status.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "modelstate/v1/module.pb.h"
#include "modelstate/v1/tensor.pb.h"

namespace modelstate::convert {

// absl and gRPC share google.rpc.Code numbering.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

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
absl::StatusOr<ModuleName> ParseModuleField(absl::string_view text);

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

absl::StatusOr<ModuleSpec> SpecFromProto(const v1::ModuleSpec& proto,
                                         absl::string_view field = "spec");
absl::StatusOr<TensorSpec> TensorSpecFromProto(const v1::TensorSpec& proto,
                                               absl::string_view field);
absl::StatusOr<InitSpec> InitFromProto(const v1::InitSpec& proto,
                                       absl::string_view field);
absl::StatusOr<SpecValue> SpecValueFromProto(
    const google::protobuf::Value& value, absl::string_view field);

// The module tree; a child that is the same object as one described earlier
// is marked same_as (its path) instead of described again.
void ModuleInfoToProto(const Module& module, bool with_hashes,
                       v1::ModuleInfo* info);
google::protobuf::Value AttrToValue(const AttrValue& value);

v1::EntryKind EntryKindToProto(EntryKind kind);
void ReportToProto(const RegistrationResult& result,
                   v1::RegistrationReport* report);

void LayoutToHeader(const StateDictLayout& layout, v1::StateDictHeader* header);
absl::StatusOr<StateDictLayout> HeaderToLayout(
    const v1::StateDictHeader& header);

LoadOptions LoadOptionsFromProto(const v1::LoadOptions& proto);
void LoadResultToProto(const LoadResult& result,
                       v1::LoadStateDictResponse* response);

// Subscriptions. INVALID_ARGUMENT naming the field.
absl::StatusOr<SubscriptionSpec> SubscriptionFromProto(
    const v1::Subscription& proto);
void SubscriptionToProto(const SubscriptionSpec& spec, v1::Subscription* proto);
// `data_included` events carry the tensor's values.
absl::Status EventToProto(const HookEvent& event, v1::HookEventProto* proto);
// Never fails: a malformed answer comes back with `invalid` set.
SubscriberAnswer AnswerFromProto(v1::HookAnswer* proto,
                                 uint64_t max_tensor_bytes);

void AuditRecordToProto(const AuditRecord& record, v1::AuditRecordProto* proto);
AuditRecord AuditRecordFromProto(const v1::AuditRecordProto& proto);
absl::StatusOr<AuditQuery> AuditQueryFromProto(const v1::AuditFilter& filter,
                                               uint64_t after_seq,
                                               int32_t limit);

}  // namespace modelstate::convert

#endif  // MODELSTATE_PROTO_CONVERT_H_
