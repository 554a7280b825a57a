// File: service_convert.h
// The server's conversions between the wire format and the service and
// layer-library types: module names, specs, module descriptions,
// registration reports, load options and results, subscriptions, hook
// events and answers, audit records and queries. Like proto/convert.h,
// every parser names the offending field in its INVALID_ARGUMENT message
// ("spec.children[1].args[0]: ...").
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(ModuleSpec spec,
//                               convert::SpecFromProto(request.spec()));
//   convert::ModuleInfoToProto(*root, /*with_hashes=*/false,
//                              response.mutable_info());
#ifndef MODELSTATE_PROTO_SERVICE_CONVERT_H_
#define MODELSTATE_PROTO_SERVICE_CONVERT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "google/protobuf/struct.pb.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "modelstate/v1/module.pb.h"
#include "nn/module_spec.h"
#include "proto/convert.h"
#include "service/audit_log.h"
#include "service/model_service.h"
#include "service/model_store.h"
#include "service/subscriber_hub.h"

namespace modelstate::convert {

absl::StatusOr<ModuleName> ParseModuleField(absl::string_view text);

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

void ReportToProto(const RegistrationResult& result,
                   v1::RegistrationReport* report);

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

// The requests of the service's RPCs, as ModelService takes them (every
// field checked and named in errors), and its results as responses.
absl::StatusOr<BuildModuleArgs> BuildModuleArgsFromProto(
    const v1::BuildModuleRequest& request);
void BuildOutcomeToProto(const ModuleName& module, const BuildOutcome& outcome,
                         v1::BuildModuleResponse* response);
void ReportsToProto(const std::vector<RegistrationResult>& results,
                    v1::RegisterResponse* response);
// `kind` is a parameter or a buffer; tensors above `max_tensor_bytes` are
// RESOURCE_EXHAUSTED.
absl::StatusOr<RegisterTensorArgs> RegisterTensorArgsFromProto(
    const v1::RegisterTensorRequest& request, EntryKind kind,
    uint64_t max_tensor_bytes);
absl::StatusOr<RegisterSubmoduleArgs> RegisterSubmoduleArgsFromProto(
    const v1::RegisterSubmoduleRequest& request);
absl::StatusOr<RemoveEntryArgs> RemoveEntryArgsFromProto(
    const v1::RemoveEntryRequest& request);
ListModulesArgs ListModulesArgsFromProto(const v1::ListModulesRequest& request);
void ModulePageToProto(const ModulePage& page,
                       v1::ListModulesResponse* response);
// The module (name and devices the server has) of a GetModule response;
// the description comes from ModuleInfoToProto.
void ModuleLocationToProto(const ModuleName& module,
                           const std::vector<Device>& server_devices,
                           v1::GetModuleResponse* response);
absl::StatusOr<GetStateDictArgs> GetStateDictArgsFromProto(
    const v1::GetStateDictRequest& request);
absl::StatusOr<LoadStateDictArgs> LoadStateDictArgsFromProto(
    const v1::LoadStart& start);
absl::StatusOr<MoveModuleArgs> MoveModuleArgsFromProto(
    const v1::MoveModuleRequest& request);
// An input with no dtype, shape or data is None.
absl::StatusOr<ForwardArgs> ForwardArgsFromProto(
    const v1::ForwardRequest& request, uint64_t max_tensor_bytes);
// Undefined outputs (None) are empty tensors.
absl::Status ForwardOutputsToProto(const std::vector<Tensor>& outputs,
                                   v1::ForwardResponse* response);
void SubscribersToProto(const std::vector<SubscriberInfo>& subscribers,
                        v1::ListSubscribersResponse* response);
void AuditPageToProto(const AuditPage& page, v1::QueryAuditResponse* response);
void VerificationToProto(const AuditVerification& verification,
                         v1::VerifyAuditResponse* response);
void DevicesToProto(const std::vector<DeviceDescription>& devices,
                    v1::ListDevicesResponse* response);
void InclusionToProto(const AuditInclusion& inclusion,
                      v1::GetInclusionProofResponse* response);
void HashesToProto(const std::vector<MerkleHash>& hashes,
                   google::protobuf::RepeatedPtrField<std::string>* out);

}  // namespace modelstate::convert

#endif  // MODELSTATE_PROTO_SERVICE_CONVERT_H_
