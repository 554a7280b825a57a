#include "server/model_state_service.h"

#include <algorithm>
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
#include "base/glob.h"
#include "base/status_macros.h"
#include "core/staged_state_dict.h"
#include "core/state_stream.h"
#include "nlohmann/json.hpp"
#include "proto/service_convert.h"

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

// ListModules' page size when the request leaves it 0, and its largest.
constexpr size_t kDefaultListPageSize = 100;
constexpr int32_t kMaxListPageSize = 1000;

// Everything wrong with a ListModules request, before any listing: a bad
// namespace, page size or page token is INVALID_ARGUMENT naming the field.
absl::Status CheckListModulesRequest(const v1::ListModulesRequest& request) {
  const std::string& ns = request.namespace_();
  if (!ns.empty() && !IsValidModuleNamePart(ns)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace: '", ns,
        "' is not a valid namespace (1-128 characters of [A-Za-z0-9_.-])"));
  }
  if (request.page_size() < 0 || request.page_size() > kMaxListPageSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: ", request.page_size(),
        " is out of range (0 for the default of ", kDefaultListPageSize,
        ", at most ", kMaxListPageSize, ")"));
  }
  // A token is the last module name of the previous page (of the same
  // namespace when one is asked for).
  const std::string& token = request.page_token();
  if (token.empty()) return absl::OkStatus();
  absl::StatusOr<ModuleName> last = ParseModuleName(token);
  if (!last.ok() || last->full() != token || (!ns.empty() && last->ns != ns)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: '", token,
                     "' is not a next_page_token of a ListModules response",
                     ns.empty() ? "" : " for this namespace"));
  }
  return absl::OkStatus();
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
      options_(options),
      streams_(options.max_streams_per_identity) {}

absl::StatusOr<ModelStateServiceImpl::Caller>
ModelStateServiceImpl::Authenticate(const grpc::ServerContextBase* context,
                                    absl::string_view rpc) {
  Caller caller;
  caller.ctx = ContextOf(context);
  caller.peer = context->peer();
  absl::StatusOr<Principal> principal =
      options_.auth != nullptr ? options_.auth->Authenticate(*context)
                               : AnonymousAdmin(caller.peer);
  if (!principal.ok()) {
    caller.ctx.identity = "";
    RecordDenial(caller.ctx, caller.peer, rpc, ModuleName{},
                 principal.status());
    return principal.status();
  }
  caller.principal = *std::move(principal);
  caller.ctx.identity = caller.principal.identity;
  return caller;
}

absl::StatusOr<ModelStateServiceImpl::Caller> ModelStateServiceImpl::CallerFor(
    const grpc::ServerContextBase* context, absl::string_view rpc,
    Permission permission, const std::string& module_field) {
  MODELSTATE_ASSIGN_OR_RETURN(Caller caller, Authenticate(context, rpc));
  MODELSTATE_ASSIGN_OR_RETURN(caller.module,
                              convert::ParseModuleField(module_field));
  MODELSTATE_RETURN_IF_ERROR(Allow(caller, rpc, permission, caller.module));
  return caller;
}

absl::Status ModelStateServiceImpl::Allow(const Caller& caller,
                                          absl::string_view rpc,
                                          Permission permission,
                                          const ModuleName& module) {
  if (caller.principal.Allows(permission, module.ns)) {
    return permission == Permission::kWrite ? AuditWritable()
                                            : absl::OkStatus();
  }
  absl::Status denied = absl::PermissionDeniedError(absl::StrCat(
      "'", caller.principal.identity, "' may not ", rpc, " in namespace '",
      module.ns, "' (needs ", PermissionName(permission), " permission)"));
  RecordDenial(caller.ctx, caller.peer, rpc, module, denied);
  return denied;
}

absl::Status ModelStateServiceImpl::AuditWritable() const {
  if (audit_ == nullptr) return absl::OkStatus();
  absl::Status health = audit_->health();
  if (health.ok()) return health;
  // A change must not go unrecorded; UNAVAILABLE, since an operator can
  // fix the log (disk space, permissions) and restart.
  return absl::UnavailableError(health.message());
}

absl::Status ModelStateServiceImpl::AllowSomewhere(const Caller& caller,
                                                   absl::string_view rpc,
                                                   Permission permission) {
  if (caller.principal.AllowsAnywhere(permission)) return absl::OkStatus();
  absl::Status denied = absl::PermissionDeniedError(absl::StrCat(
      "'", caller.principal.identity, "' may not ", rpc, " (needs ",
      PermissionName(permission), " permission in some namespace)"));
  RecordDenial(caller.ctx, caller.peer, rpc, ModuleName{}, denied);
  return denied;
}

void ModelStateServiceImpl::RecordDenial(const OperationContext& ctx,
                                         absl::string_view peer,
                                         absl::string_view rpc,
                                         const ModuleName& module,
                                         const absl::Status& status) {
  if (audit_ == nullptr) return;
  AuditRecord r;
  r.identity = ctx.identity;
  r.correlation_id = ctx.correlation_id;
  r.type = "denied";
  r.ns = module.ns;
  r.module = module.name;
  r.outcome = "error";
  r.details_json =
      nlohmann::json{{"rpc", std::string(rpc)},
                     {"peer", std::string(peer)},
                     {"error",
                      {{"code", absl::StatusCodeToString(status.code())},
                       {"message", std::string(status.message())}}}}
          .dump();
  // A denial that cannot be recorded is still a denial; the log's own
  // failure shows up on the next change it must record.
  (void)audit_->Append(std::move(r));
}

absl::Status ModelStateServiceImpl::AllowAudit(const Caller& caller,
                                               absl::string_view rpc,
                                               const std::string& ns) {
  if (ns.empty()) return AllowSomewhere(caller, rpc, Permission::kAudit);
  ModuleName in_namespace;
  in_namespace.ns = ns;
  return Allow(caller, rpc, Permission::kAudit, in_namespace);
}

bool ModelStateServiceImpl::Visible(const std::vector<std::string>& namespaces,
                                    const AuditRecord& r) {
  if (!namespaces.empty() && namespaces.front() == kAnyNamespace) return true;
  return !r.ns.empty() && std::find(namespaces.begin(), namespaces.end(),
                                    r.ns) != namespaces.end();
}

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
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "BuildModule", Permission::kWrite, request->module()));
  const ModuleName& name = caller.module;
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
                        store_->Build(caller.ctx, name, spec, options,
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

grpc::Status ModelStateServiceImpl::Register(const Caller& caller,
                                             const ModuleName& name,
                                             RegistrationRequest request,
                                             v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(std::vector<RegistrationResult> results,
                        store_->Register(caller.ctx, name, std::move(request)));
  for (const RegistrationResult& result : results) {
    convert::ReportToProto(result, response->add_registrations());
  }
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::RegisterTensor(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    EntryKind kind, v1::RegisterResponse* response) {
  const char* rpc =
      kind == EntryKind::kParameter ? "RegisterParameter" : "RegisterBuffer";
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, rpc, Permission::kWrite, request->module()));
  const ModuleName& name = caller.module;
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
  return Register(caller, name, std::move(r), response);
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
  ASSIGN_OR_RETURN_GRPC(
      Caller caller, CallerFor(context, "RegisterSubmodule", Permission::kWrite,
                               request->module()));
  const ModuleName& name = caller.module;
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
  return Register(caller, name, std::move(r), response);
}

grpc::Status ModelStateServiceImpl::RemoveEntry(
    grpc::ServerContext* context, const v1::RemoveEntryRequest* request,
    v1::RegisterResponse* response) {
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "RemoveEntry", Permission::kWrite, request->module()));
  const ModuleName& name = caller.module;
  RegistrationRequest r;
  r.path = request->path();
  r.name = request->name();
  r.removal = true;
  return Register(caller, name, std::move(r), response);
}

grpc::Status ModelStateServiceImpl::GetModule(
    grpc::ServerContext* context, const v1::GetModuleRequest* request,
    v1::GetModuleResponse* response) {
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "GetModule", Permission::kRead, request->module()));
  const ModuleName& name = caller.module;
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
    grpc::ServerContext* context, const v1::ListModulesRequest* request,
    v1::ListModulesResponse* response) {
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "ListModules"));
  RETURN_IF_ERROR_GRPC(CheckListModulesRequest(*request));
  const std::string& ns = request->namespace_();
  const std::vector<std::string> readable =
      caller.principal.NamespacesFor(Permission::kRead);
  const bool everything =
      !ns.empty() || (readable.size() == 1 && readable[0] == kAnyNamespace);
  if (!ns.empty()) {
    ModuleName in_namespace;
    in_namespace.ns = ns;
    RETURN_IF_ERROR_GRPC(
        Allow(caller, "ListModules", Permission::kRead, in_namespace));
  } else if (!everything) {
    RETURN_IF_ERROR_GRPC(
        AllowSomewhere(caller, "ListModules", Permission::kRead));
  }
  size_t page = request->page_size() == 0
                    ? kDefaultListPageSize
                    : static_cast<size_t>(request->page_size());
  // The token is the last name of the previous page. A caller who may read
  // some namespaces only sees those: listing goes on past the others.
  std::vector<ModuleSummary> modules;
  std::string after = request->page_token();
  while (modules.size() <= page) {
    std::vector<ModuleSummary> batch = store_->List(ns, after, page + 1);
    for (ModuleSummary& m : batch) {
      if (everything || std::find(readable.begin(), readable.end(),
                                  m.name.ns) != readable.end()) {
        modules.push_back(std::move(m));
      }
    }
    if (batch.size() < page + 1) break;
    after = batch.back().name.full();
  }
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
  ASSIGN_OR_RETURN_GRPC(Caller caller,
                        CallerFor(context, "DeleteModule", Permission::kWrite,
                                  request->module()));
  const ModuleName& name = caller.module;
  return ToGrpcStatus(store_->Delete(caller.ctx, name));
}

grpc::Status ModelStateServiceImpl::GetStateDict(
    grpc::ServerContext* context, const v1::GetStateDictRequest* request,
    grpc::ServerWriter<v1::StateDictChunk>* writer) {
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "GetStateDict", Permission::kRead, request->module()));
  const ModuleName& name = caller.module;
  ASSIGN_OR_RETURN_GRPC(std::unique_ptr<StreamLimiter::Slot> slot,
                        streams_.Acquire(caller.ctx.identity));
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
    if (!IsFloatingPoint(*target)) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("target_dtype: must be a floating point dtype, got ",
                       DTypeName(*target)));
    }
  }
  RETURN_IF_ERROR_GRPC(CheckGlob(request->key_glob(), "key_glob"));
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
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "LoadStateDict"));
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
  RETURN_IF_ERROR_GRPC(
      Allow(caller, "LoadStateDict", Permission::kWrite, name));
  ASSIGN_OR_RETURN_GRPC(std::unique_ptr<StreamLimiter::Slot> slot,
                        streams_.Acquire(caller.ctx.identity));
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
  const OperationContext& ctx = caller.ctx;
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
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "MoveModule", Permission::kWrite, request->module()));
  const ModuleName& name = caller.module;
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
  RETURN_IF_ERROR_GRPC(store_->Move(caller.ctx, name, device, dtype));
  return ToGrpcStatus(store_->Read(name, [&](const Module& root) {
    convert::ModuleInfoToProto(root, false, response->mutable_info());
    return absl::OkStatus();
  }));
}

grpc::Status ModelStateServiceImpl::SetTraining(
    grpc::ServerContext* context, const v1::SetTrainingRequest* request,
    v1::SetTrainingResponse*) {
  ASSIGN_OR_RETURN_GRPC(
      Caller caller,
      CallerFor(context, "SetTraining", Permission::kWrite, request->module()));
  const ModuleName& name = caller.module;
  return ToGrpcStatus(
      store_->SetTraining(caller.ctx, name, request->training()));
}

grpc::Status ModelStateServiceImpl::Forward(grpc::ServerContext* context,
                                            const v1::ForwardRequest* request,
                                            v1::ForwardResponse* response) {
  // Only an eval-mode call is sure to change nothing.
  const bool read_only = request->has_training() && !request->training();
  ASSIGN_OR_RETURN_GRPC(Caller caller, CallerFor(context, "Forward",
                                                 read_only ? Permission::kRead
                                                           : Permission::kWrite,
                                                 request->module()));
  const ModuleName& name = caller.module;
  std::vector<Tensor> inputs;
  for (int i = 0; i < request->inputs_size(); ++i) {
    v1::TensorProto proto = request->inputs(i);
    if (proto.dtype() == v1::DTYPE_UNSPECIFIED && proto.shape_size() == 0 &&
        proto.data().empty()) {
      inputs.emplace_back();  // None
      continue;
    }
    ASSIGN_OR_RETURN_GRPC(
        Tensor input,
        convert::TensorFromProto(&proto, absl::StrCat("inputs[", i, "]"),
                                 options_.max_tensor_bytes));
    inputs.push_back(std::move(input));
  }
  std::optional<bool> training;
  if (request->has_training()) training = request->training();
  ASSIGN_OR_RETURN_GRPC(
      std::vector<Tensor> outputs,
      store_->Forward(caller.ctx, name, request->path(), std::move(inputs),
                      training, request->seed()));
  for (const Tensor& out : outputs) {
    v1::TensorProto* proto = response->add_outputs();
    if (out.defined()) RETURN_IF_ERROR_GRPC(convert::TensorToProto(out, proto));
  }
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse>*
ModelStateServiceImpl::Subscribe(grpc::CallbackServerContext* context) {
  SubscriptionLimits limits;
  limits.max_queued_events = options_.max_queued_events;
  limits.max_tensor_bytes = options_.max_tensor_bytes;
  SubscriptionAccess access;
  absl::StatusOr<Caller> caller = Authenticate(context, "Subscribe");
  if (!caller.ok()) {
    access.denied = caller.status();
    return new SubscriptionReactor(hub_, ContextOf(context), limits,
                                   std::move(access));
  }
  access.denied = AllowSomewhere(*caller, "Subscribe", Permission::kSubscribe);
  if (access.denied.ok()) {
    absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> slot =
        streams_.Acquire(caller->ctx.identity);
    if (slot.ok()) {
      access.slot = *std::move(slot);
    } else {
      access.denied = slot.status();
    }
  }
  // A subscriber sees only the namespaces it may review, and may not ask
  // for one it may not.
  access.admit = [this, caller = *caller](SubscriptionSpec& spec) {
    // Events with data travel in one message each.
    const uint64_t max_data_bytes = options_.max_message_bytes > (1 << 20)
                                        ? options_.max_message_bytes - (1 << 20)
                                        : 0;
    MODELSTATE_RETURN_IF_ERROR(AuditWritable());
    if (spec.include_data && spec.max_data_bytes > max_data_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_data_bytes: ", spec.max_data_bytes,
          " is more than this server's largest message minus 1 MiB (",
          max_data_bytes, ")"));
    }
    // Only authenticated identities can own a name; without
    // authentication every caller is the same anonymous admin.
    if (options_.auth != nullptr && options_.auth->enabled()) {
      spec.owner_identity = caller.principal.identity;
    }
    for (const std::string& wanted : spec.filter.namespaces) {
      ModuleName module;
      module.ns = wanted;
      MODELSTATE_RETURN_IF_ERROR(
          Allow(caller, "Subscribe", Permission::kSubscribe, module));
    }
    std::vector<std::string> visible =
        caller.principal.NamespacesFor(Permission::kSubscribe);
    if (!(visible.size() == 1 && visible.front() == kAnyNamespace)) {
      spec.visible_namespaces = std::move(visible);
    }
    return absl::OkStatus();
  };
  return new SubscriptionReactor(hub_, caller->ctx, limits, std::move(access));
}

grpc::Status ModelStateServiceImpl::ListSubscribers(
    grpc::ServerContext* context, const v1::ListSubscribersRequest*,
    v1::ListSubscribersResponse* response) {
  ASSIGN_OR_RETURN_GRPC(Caller caller,
                        Authenticate(context, "ListSubscribers"));
  if (!caller.principal.AllowsAnywhere(Permission::kAudit)) {
    RETURN_IF_ERROR_GRPC(
        AllowSomewhere(caller, "ListSubscribers", Permission::kSubscribe));
  }
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
    grpc::ServerContext* context, const v1::QueryAuditRequest* request,
    v1::QueryAuditResponse* response) {
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "QueryAudit"));
  if (audit_ == nullptr) return NoAudit();
  ASSIGN_OR_RETURN_GRPC(
      AuditQuery query,
      convert::AuditQueryFromProto(request->filter(), request->after_seq(),
                                   request->limit()));
  RETURN_IF_ERROR_GRPC(AllowAudit(caller, "QueryAudit", query.ns));
  const std::vector<std::string> visible =
      caller.principal.NamespacesFor(Permission::kAudit);
  // Records of namespaces the auditor may not see are skipped, so a page
  // may take several queries.
  size_t found = 0;
  uint64_t last = query.after_seq;
  bool more = true;
  while (found < query.limit && more) {
    query.after_seq = last;
    ASSIGN_OR_RETURN_GRPC(std::vector<AuditRecord> records,
                          audit_->Query(query));
    more = records.size() == query.limit;
    for (const AuditRecord& r : records) {
      if (found == query.limit) {
        more = true;
        break;
      }
      last = r.seq;
      if (!Visible(visible, r)) continue;
      convert::AuditRecordToProto(r, response->add_records());
      ++found;
    }
  }
  if (more) response->set_next_after_seq(last);
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::WatchAudit(
    grpc::ServerContext* context, const v1::WatchAuditRequest* request,
    grpc::ServerWriter<v1::AuditRecordProto>* writer) {
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "WatchAudit"));
  if (audit_ == nullptr) return NoAudit();
  ASSIGN_OR_RETURN_GRPC(AuditQuery query,
                        convert::AuditQueryFromProto(
                            request->filter(), request->after_seq(), 1000));
  RETURN_IF_ERROR_GRPC(AllowAudit(caller, "WatchAudit", query.ns));
  ASSIGN_OR_RETURN_GRPC(std::unique_ptr<StreamLimiter::Slot> slot,
                        streams_.Acquire(caller.ctx.identity));
  const std::vector<std::string> visible =
      caller.principal.NamespacesFor(Permission::kAudit);
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
      if (!match || !Visible(visible, r)) continue;
      v1::AuditRecordProto out;
      convert::AuditRecordToProto(r, &out);
      if (!writer->Write(out)) return grpc::Status::CANCELLED;
    }
  }
  return grpc::Status::CANCELLED;
}

grpc::Status ModelStateServiceImpl::ListDevices(
    grpc::ServerContext* context, const v1::ListDevicesRequest*,
    v1::ListDevicesResponse* response) {
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "ListDevices"));
  static_cast<void>(caller);
  for (const DeviceDescription& d : DescribeDevices()) {
    v1::DeviceInfo* info = response->add_devices();
    info->set_device(d.device.ToString());
    info->set_description(d.description);
    info->set_total_bytes(d.total_bytes);
    info->set_free_bytes(d.free_bytes);
  }
  return grpc::Status::OK;
}

grpc::Status ModelStateServiceImpl::VerifyAudit(
    grpc::ServerContext* context, const v1::VerifyAuditRequest*,
    v1::VerifyAuditResponse* response) {
  ASSIGN_OR_RETURN_GRPC(Caller caller, Authenticate(context, "VerifyAudit"));
  RETURN_IF_ERROR_GRPC(
      AllowSomewhere(caller, "VerifyAudit", Permission::kAudit));
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
