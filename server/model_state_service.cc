#include "server/model_state_service.h"

#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/staged_state_dict.h"
#include "core/state_stream.h"
#include "core/status_macros.h"
#include "proto/convert.h"

namespace modelstate::server {
namespace {

using convert::ToGrpcStatus;

// Returns the handler's status from an absl::Status expression.
#define RETURN_IF_ERROR_GRPC(expr)                                  \
  do {                                                              \
    ::absl::Status _st = (expr);                                    \
    if (!_st.ok()) return ::modelstate::convert::ToGrpcStatus(_st); \
  } while (0)

#define ASSIGN_OR_RETURN_GRPC(lhs, rexpr) \
  ASSIGN_OR_RETURN_GRPC_IMPL(             \
      MODELSTATE_INTERNAL_CONCAT(_grpc_so_, __COUNTER__), lhs, rexpr)
#define ASSIGN_OR_RETURN_GRPC_IMPL(so, lhs, rexpr)                       \
  auto so = (rexpr);                                                     \
  if (!so.ok()) return ::modelstate::convert::ToGrpcStatus(so.status()); \
  lhs = std::move(*so)

std::atomic<uint64_t> next_request_id{1};

// Request ids this process makes up are unique across restarts too: the
// audit log and the saved modules' change notes match on them.
const std::string& RequestIdPrefix() {
  static const std::string* prefix = [] {
    std::random_device random;
    return new std::string(absl::StrFormat("req-%08x-", random()));
  }();
  return *prefix;
}

}  // namespace

OperationContext ContextOf(const grpc::ServerContextBase* context) {
  OperationContext ctx;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("x-request-id");
  ctx.correlation_id =
      it != metadata.end()
          ? std::string(it->second.data(), it->second.size())
          : absl::StrCat(RequestIdPrefix(), next_request_id.fetch_add(1));
  ctx.identity = context->peer();
  return ctx;
}

ModelStateServiceImpl::ModelStateServiceImpl(ModelStore* store,
                                             SubscriberHub* hub,
                                             AuditLog* audit,
                                             std::string audit_path,
                                             ServiceOptions options)
    : store_(store),
      hub_(hub),
      audit_(audit),
      audit_path_(std::move(audit_path)),
      options_(options) {}

BuildLimits ModelStateServiceImpl::Limits() const {
  BuildLimits limits;
  limits.max_depth = options_.max_spec_depth;
  limits.max_entries = options_.max_entries;
  limits.max_tensor_bytes = options_.max_tensor_bytes;
  limits.max_total_bytes = options_.max_module_bytes;
  return limits;
}

grpc::Status ModelStateServiceImpl::BuildModule(
    grpc::ServerContext* context, const v1::BuildModuleRequest* request,
    v1::BuildModuleResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  ASSIGN_OR_RETURN_GRPC(ModuleSpec spec,
                        convert::SpecFromProto(request->spec()));
  BuildOptions options;
  options.seed = request->seed();
  options.limits = Limits();
  ASSIGN_OR_RETURN_GRPC(
      options.device,
      convert::ParseDeviceField(request->device(), "device", Device::Cpu()));
  ASSIGN_OR_RETURN_GRPC(
      options.dtype,
      convert::ParseDTypeField(request->dtype(), "dtype", DType::kFloat32));
  ASSIGN_OR_RETURN_GRPC(BuildOutcome outcome,
                        store_->Build(ContextOf(context), name, spec, options,
                                      request->all_or_nothing()));
  response->set_module(name.full());
  for (const RegistrationResult& r : outcome.registrations) {
    convert::ReportToProto(r, response->add_registrations());
  }
  return ToGrpcStatus(store_->Read(name, [&](const Module& root) {
    convert::ModuleInfoToProto(root, false, response->mutable_info());
    return absl::OkStatus();
  }));
}

grpc::Status ModelStateServiceImpl::Register(grpc::ServerContext* context,
                                             const ModuleName& name,
                                             RegistrationRequest request,
                                             v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(
      std::vector<RegistrationResult> results,
      store_->Register(ContextOf(context), name, std::move(request)));
  for (const RegistrationResult& result : results) {
    convert::ReportToProto(result, response->add_registrations());
  }
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::RegisterTensor(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    EntryKind kind, v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  RegistrationRequest r;
  r.path = request->path();
  r.name = request->name();
  r.kind = kind;
  r.value.persistent = request->has_persistent() ? request->persistent() : true;
  bool requires_grad =
      request->has_requires_grad() ? request->requires_grad() : true;
  Tensor tensor;
  switch (request->value_case()) {
    case v1::RegisterTensorRequest::kTensor: {
      v1::TensorProto proto = request->tensor();
      ASSIGN_OR_RETURN_GRPC(
          tensor, convert::TensorFromProto(&proto, "tensor",
                                           options_.max_tensor_bytes));
      break;
    }
    case v1::RegisterTensorRequest::kInit: {
      ASSIGN_OR_RETURN_GRPC(TensorSpec spec, convert::TensorSpecFromProto(
                                                 request->init(), "init"));
      ASSIGN_OR_RETURN_GRPC(tensor,
                            CreateTensor(spec, request->seed(), DType::kFloat32,
                                         Device::Cpu(), Limits()));
      break;
    }
    case v1::RegisterTensorRequest::kNone:
      break;
    case v1::RegisterTensorRequest::VALUE_NOT_SET:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "value: one of tensor, init or none is required");
  }
  if (tensor.defined() && kind == EntryKind::kParameter) {
    ASSIGN_OR_RETURN_GRPC(tensor, MakeParameter(tensor, requires_grad));
  }
  r.value.tensor = std::move(tensor);
  return Register(context, name, std::move(r), response);
}

grpc::Status ModelStateServiceImpl::RegisterParameter(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    v1::RegisterResponse* response) {
  return RegisterTensor(context, request, EntryKind::kParameter, response);
}

grpc::Status ModelStateServiceImpl::RegisterBuffer(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    v1::RegisterResponse* response) {
  return RegisterTensor(context, request, EntryKind::kBuffer, response);
}

grpc::Status ModelStateServiceImpl::RegisterSubmodule(
    grpc::ServerContext* context, const v1::RegisterSubmoduleRequest* request,
    v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  RegistrationRequest r;
  r.path = request->path();
  r.name = request->name();
  r.kind = EntryKind::kModule;
  switch (request->value_case()) {
    case v1::RegisterSubmoduleRequest::kSpec: {
      ASSIGN_OR_RETURN_GRPC(ModuleSpec spec,
                            convert::SpecFromProto(request->spec()));
      r.spec = std::move(spec);
      r.build_options.seed = request->seed();
      r.build_options.limits = Limits();
      ASSIGN_OR_RETURN_GRPC(r.build_options.device,
                            convert::ParseDeviceField(request->device(),
                                                      "device", Device::Cpu()));
      ASSIGN_OR_RETURN_GRPC(
          r.build_options.dtype,
          convert::ParseDTypeField(request->dtype(), "dtype", DType::kFloat32));
      break;
    }
    case v1::RegisterSubmoduleRequest::kExistingPath:
      r.existing_path = request->existing_path();
      break;
    case v1::RegisterSubmoduleRequest::kNone:
      break;
    case v1::RegisterSubmoduleRequest::VALUE_NOT_SET:
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          "value: one of spec, existing_path or none is required");
  }
  return Register(context, name, std::move(r), response);
}

grpc::Status ModelStateServiceImpl::RemoveEntry(
    grpc::ServerContext* context, const v1::RemoveEntryRequest* request,
    v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  RegistrationRequest r;
  r.path = request->path();
  r.name = request->name();
  r.removal = true;
  return Register(context, name, std::move(r), response);
}

grpc::Status ModelStateServiceImpl::GetModule(
    grpc::ServerContext*, const v1::GetModuleRequest* request,
    v1::GetModuleResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  RETURN_IF_ERROR_GRPC(
      store_->Read(name, [&](const Module& root) -> absl::Status {
        absl::StatusOr<std::shared_ptr<Module>> sub =
            root.GetSubmodule(request->path());
        if (!sub.ok()) {
          return absl::NotFoundError(
              absl::StrCat("path '", request->path(), "' in '", name.full(),
                           "': ", sub.status().message()));
        }
        convert::ModuleInfoToProto(**sub, request->with_hashes(),
                                   response->mutable_info());
        response->set_total_bytes((*sub)->TotalBytes());
        return absl::OkStatus();
      }));
  response->set_module(name.full());
  for (const Device& d : AvailableDevices())
    response->add_server_devices(d.ToString());
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::ListModules(
    grpc::ServerContext*, const v1::ListModulesRequest* request,
    v1::ListModulesResponse* response) {
  if (request->page_size() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "page_size: must not be negative");
  }
  size_t page =
      request->page_size() == 0
          ? 100
          : std::min<size_t>(static_cast<size_t>(request->page_size()), 1000);
  // The token is the last name of the previous page.
  std::vector<ModuleSummary> modules =
      store_->List(request->namespace_(), request->page_token(), page + 1);
  for (size_t i = 0; i < modules.size() && i < page; ++i) {
    v1::ModuleSummary* s = response->add_modules();
    s->set_module(modules[i].name.full());
    s->set_type(modules[i].type);
    s->set_num_parameters(modules[i].num_parameters);
    s->set_total_bytes(modules[i].total_bytes);
    for (const std::string& d : modules[i].devices) s->add_devices(d);
  }
  if (modules.size() > page)
    response->set_next_page_token(modules[page - 1].name.full());
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::DeleteModule(
    grpc::ServerContext* context, const v1::DeleteModuleRequest* request,
    v1::DeleteModuleResponse*) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  return ToGrpcStatus(store_->Delete(ContextOf(context), name));
}

grpc::Status ModelStateServiceImpl::GetStateDict(
    grpc::ServerContext* context, const v1::GetStateDictRequest* request,
    grpc::ServerWriter<v1::StateDictChunk>* writer) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  uint32_t chunk = request->chunk_bytes() == 0 ? options_.default_chunk_bytes
                                               : request->chunk_bytes();
  if (chunk > options_.max_chunk_bytes) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("chunk_bytes: ", chunk,
                     " exceeds the server's max_chunk_bytes of ",
                     options_.max_chunk_bytes));
  }
  std::optional<DType> target;
  if (request->target_dtype() != v1::DTYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN_GRPC(target, convert::DTypeFromProto(
                                      request->target_dtype(), "target_dtype"));
  }
  SnapshotFilter filter{request->key_prefix(), request->key_glob()};
  switch (request->selection()) {
    case v1::GetStateDictRequest::SELECTION_PARAMETERS:
      filter.selection = SnapshotFilter::Selection::kParameters;
      break;
    case v1::GetStateDictRequest::SELECTION_BUFFERS:
      filter.selection = SnapshotFilter::Selection::kBuffers;
      break;
    case v1::GetStateDictRequest::SELECTION_STATE_DICT:
      break;
    default:
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("selection: unknown value ", request->selection()));
  }
  ASSIGN_OR_RETURN_GRPC(StateDictSnapshot snapshot,
                        store_->Snapshot(name, filter));
  ASSIGN_OR_RETURN_GRPC(
      std::unique_ptr<StateDictReader> reader,
      StateDictReader::Create(std::move(snapshot.state), target,
                              std::move(snapshot.kinds)));
  v1::StateDictChunk message;
  convert::LayoutToHeader(reader->layout(), message.mutable_header());
  if (!writer->Write(message))
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  if (request->metadata_only()) return grpc::Status::OK;
  while (reader->remaining() > 0) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    }
    message.Clear();
    std::string* data = message.mutable_data();
    data->reserve(std::min<uint64_t>(chunk, reader->remaining()));
    ASSIGN_OR_RETURN_GRPC(size_t n, reader->Read(chunk, data));
    if (n == 0) break;
    if (!writer->Write(message)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
  }
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::LoadStateDict(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::LoadStateDictRequest>* reader,
    v1::LoadStateDictResponse* response) {
  v1::LoadStateDictRequest message;
  if (!reader->Read(&message)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "start: the stream ended before its start message");
  }
  if (message.payload_case() != v1::LoadStateDictRequest::kStart) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "start: the first message must be a start message");
  }
  const v1::LoadStart& start = message.start();
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(start.module()));
  ASSIGN_OR_RETURN_GRPC(StateDictLayout layout,
                        convert::HeaderToLayout(start.header()));
  StreamLimits limits;
  limits.max_tensor_bytes = options_.max_tensor_bytes;
  limits.max_total_bytes = options_.max_module_bytes;
  limits.max_entries = static_cast<uint64_t>(options_.max_entries);
  LoadOptions options = convert::LoadOptionsFromProto(start.options());
  // Nothing touches the module until the whole stream arrived intact. A
  // copying load stages the bytes on disk and reads each entry straight
  // into the module's tensor; assign installs new tensors, which must be in
  // memory anyway.
  const OperationContext ctx = ContextOf(context);
  std::unique_ptr<StagedStateDict> staged;
  std::unique_ptr<StateDictAssembler> assembler;
  if (!options.assign) {
    ASSIGN_OR_RETURN_GRPC(
        staged, store_->StageLoad(ctx, name, std::move(layout), limits, options,
                                  options_.staging_dir));
  } else {
    ASSIGN_OR_RETURN_GRPC(
        assembler, StateDictAssembler::Create(std::move(layout), limits));
  }
  while (reader->Read(&message)) {
    if (message.payload_case() != v1::LoadStateDictRequest::kData) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          "data: only data messages may follow the start message");
    }
    RETURN_IF_ERROR_GRPC(
        staged != nullptr ? staged->Append(std::move(*message.mutable_data()))
                          : assembler->Append(message.data()));
  }
  if (context->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "client cancelled; nothing loaded");
  }
  LoadResult result;
  if (staged != nullptr) {
    ASSIGN_OR_RETURN_GRPC(result,
                          store_->LoadStaged(ctx, name, *staged, options));
  } else {
    ASSIGN_OR_RETURN_GRPC(StateDict state_dict, assembler->Finish());
    ASSIGN_OR_RETURN_GRPC(result, store_->Load(ctx, name, state_dict, options));
  }
  convert::LoadResultToProto(result, response);
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::MoveModule(
    grpc::ServerContext* context, const v1::MoveModuleRequest* request,
    v1::MoveModuleResponse* response) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  std::optional<Device> device;
  std::optional<DType> dtype;
  if (!request->device().empty()) {
    ASSIGN_OR_RETURN_GRPC(
        device,
        convert::ParseDeviceField(request->device(), "device", std::nullopt));
  }
  if (!request->dtype().empty()) {
    ASSIGN_OR_RETURN_GRPC(dtype, convert::ParseDTypeField(
                                     request->dtype(), "dtype", std::nullopt));
  }
  RETURN_IF_ERROR_GRPC(store_->Move(ContextOf(context), name, device, dtype));
  return ToGrpcStatus(store_->Read(name, [&](const Module& root) {
    convert::ModuleInfoToProto(root, false, response->mutable_info());
    return absl::OkStatus();
  }));
}

grpc::Status ModelStateServiceImpl::SetTraining(
    grpc::ServerContext* context, const v1::SetTrainingRequest* request,
    v1::SetTrainingResponse*) {
  ASSIGN_OR_RETURN_GRPC(ModuleName name,
                        convert::ParseModuleField(request->module()));
  return ToGrpcStatus(
      store_->SetTraining(ContextOf(context), name, request->training()));
}

grpc::ServerBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse>*
ModelStateServiceImpl::Subscribe(grpc::CallbackServerContext* context) {
  SubscriptionLimits limits;
  limits.max_queued_events = options_.max_queued_events;
  limits.max_tensor_bytes = options_.max_tensor_bytes;
  return new SubscriptionReactor(hub_, ContextOf(context), limits);
}

grpc::Status ModelStateServiceImpl::ListSubscribers(
    grpc::ServerContext*, const v1::ListSubscribersRequest*,
    v1::ListSubscribersResponse* response) {
  for (const SubscriberInfo& info : hub_->List()) {
    v1::SubscriberInfoProto* out = response->add_subscribers();
    out->set_subscriber_id(info.id);
    convert::SubscriptionToProto(info.spec, out->mutable_subscription());
    out->set_order(info.order);
    out->set_pending_events(info.pending);
  }
  return grpc::Status::OK;
}

namespace {

grpc::Status NoAudit() {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "this server keeps no audit log");
}

}  // namespace

grpc::Status ModelStateServiceImpl::QueryAudit(
    grpc::ServerContext*, const v1::QueryAuditRequest* request,
    v1::QueryAuditResponse* response) {
  if (audit_ == nullptr) return NoAudit();
  ASSIGN_OR_RETURN_GRPC(
      AuditQuery query,
      convert::AuditQueryFromProto(request->filter(), request->after_seq(),
                                   request->limit()));
  ASSIGN_OR_RETURN_GRPC(std::vector<AuditRecord> records, audit_->Query(query));
  for (const AuditRecord& r : records)
    convert::AuditRecordToProto(r, response->add_records());
  if (records.size() == query.limit)
    response->set_next_after_seq(records.back().seq);
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::WatchAudit(
    grpc::ServerContext* context, const v1::WatchAuditRequest* request,
    grpc::ServerWriter<v1::AuditRecordProto>* writer) {
  if (audit_ == nullptr) return NoAudit();
  ASSIGN_OR_RETURN_GRPC(AuditQuery query,
                        convert::AuditQueryFromProto(
                            request->filter(), request->after_seq(), 1000));
  uint64_t after = request->after_seq();
  // Wakes up at least once a second to notice a cancelled call.
  while (!context->IsCancelled()) {
    ASSIGN_OR_RETURN_GRPC(
        std::vector<AuditRecord> records,
        audit_->WaitForRecords(after, absl::Now() + absl::Seconds(1), 1000));
    for (const AuditRecord& r : records) {
      after = r.seq;
      query.after_seq = 0;
      bool match = (query.ns.empty() || r.ns == query.ns) &&
                   (query.module.empty() || r.module == query.module) &&
                   (query.identity.empty() || r.identity == query.identity) &&
                   (query.outcome.empty() || r.outcome == query.outcome) &&
                   (query.type.empty() || r.type == query.type) &&
                   (!query.since.has_value() || r.time >= *query.since) &&
                   (!query.until.has_value() || r.time < *query.until);
      if (!match) continue;
      v1::AuditRecordProto out;
      convert::AuditRecordToProto(r, &out);
      if (!writer->Write(out)) return grpc::Status::CANCELLED;
    }
  }
  return grpc::Status::CANCELLED;
}

grpc::Status ModelStateServiceImpl::VerifyAudit(
    grpc::ServerContext*, const v1::VerifyAuditRequest*,
    v1::VerifyAuditResponse* response) {
  if (audit_ == nullptr) return NoAudit();
  ASSIGN_OR_RETURN_GRPC(AuditVerification v, AuditLog::Verify(audit_path_));
  response->set_records(v.records);
  response->set_ok(v.ok);
  response->set_broken_seq(v.broken_seq);
  response->set_broken_line(v.broken_line);
  response->set_problem(v.problem);
  return grpc::Status::OK;
}

}  // namespace modelstate::server
