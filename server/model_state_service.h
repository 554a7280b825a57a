// File: model_state_service.h
// The gRPC service: each handler converts its request (proto/convert.h),
// calls ModelStore, and converts the result back. No business logic lives
// here.
//
// Example:
//   ModelStore store;
//   ModelStateServiceImpl service(&store, ServiceOptions{});
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
#ifndef MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_
#define MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_

#include <cstdint>

#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "nn/module_spec.h"
#include "server/auth.h"
#include "server/subscription_reactor.h"
#include "service/access_policy.h"
#include "service/audit_log.h"
#include "service/model_store.h"
#include "service/subscriber_hub.h"

namespace modelstate::server {

struct ServiceOptions {
  // Default and maximum bytes per GetStateDict data message.
  uint32_t default_chunk_bytes = 1 << 20;
  uint32_t max_chunk_bytes = 16 << 20;
  // Largest single tensor accepted or built.
  uint64_t max_tensor_bytes = uint64_t{16} << 30;
  // Largest state_dict accepted by LoadStateDict, and per built module.
  uint64_t max_module_bytes = uint64_t{64} << 30;
  // Spec nesting and entry counts.
  int max_spec_depth = 64;
  int64_t max_entries = 1'000'000;
  // Events waiting for a subscriber before it is dropped.
  size_t max_queued_events = 10000;
  // The server's largest gRPC message (caps a subscription's
  // max_data_bytes, leaving 1 MiB for the rest of the event).
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // Where LoadStateDict stages incoming bytes (an existing directory), so a
  // load never holds the state twice in memory; empty: in memory.
  std::string staging_dir;
  // Who may call what (not owned; null: every caller is an admin, which
  // server_main allows on loopback addresses only).
  const Authenticator* auth = nullptr;
  // Streams (state_dict transfers, audit watches, subscriptions) one
  // identity may have open at once; 0: unlimited.
  int max_streams_per_identity = 0;
};

// Thread-safe (handlers run concurrently on gRPC's threads). Subscribe is a
// callback reactor (a subscriber must not tie up a thread); the other
// methods are synchronous, since they may wait for subscribers' decisions.
class ModelStateServiceImpl final
    : public v1::ModelStateService::WithCallbackMethod_Subscribe<
          v1::ModelStateService::Service> {
 public:
  // Nothing is owned; all must outlive the service. `audit` may be null
  // (no audit log); `audit_path` is the log's file, for VerifyAudit.
  ModelStateServiceImpl(ModelStore* store, SubscriberHub* hub, AuditLog* audit,
                        std::string audit_path, ServiceOptions options);

  grpc::Status BuildModule(grpc::ServerContext* context,
                           const v1::BuildModuleRequest* request,
                           v1::BuildModuleResponse* response) override;
  grpc::Status RegisterParameter(grpc::ServerContext* context,
                                 const v1::RegisterTensorRequest* request,
                                 v1::RegisterResponse* response) override;
  grpc::Status RegisterBuffer(grpc::ServerContext* context,
                              const v1::RegisterTensorRequest* request,
                              v1::RegisterResponse* response) override;
  grpc::Status RegisterSubmodule(grpc::ServerContext* context,
                                 const v1::RegisterSubmoduleRequest* request,
                                 v1::RegisterResponse* response) override;
  grpc::Status RemoveEntry(grpc::ServerContext* context,
                           const v1::RemoveEntryRequest* request,
                           v1::RegisterResponse* response) override;
  grpc::Status GetModule(grpc::ServerContext* context,
                         const v1::GetModuleRequest* request,
                         v1::GetModuleResponse* response) override;
  grpc::Status ListModules(grpc::ServerContext* context,
                           const v1::ListModulesRequest* request,
                           v1::ListModulesResponse* response) override;
  grpc::Status DeleteModule(grpc::ServerContext* context,
                            const v1::DeleteModuleRequest* request,
                            v1::DeleteModuleResponse* response) override;
  grpc::Status GetStateDict(
      grpc::ServerContext* context, const v1::GetStateDictRequest* request,
      grpc::ServerWriter<v1::StateDictChunk>* writer) override;
  grpc::Status LoadStateDict(
      grpc::ServerContext* context,
      grpc::ServerReader<v1::LoadStateDictRequest>* reader,
      v1::LoadStateDictResponse* response) override;
  grpc::Status MoveModule(grpc::ServerContext* context,
                          const v1::MoveModuleRequest* request,
                          v1::MoveModuleResponse* response) override;
  grpc::Status SetTraining(grpc::ServerContext* context,
                           const v1::SetTrainingRequest* request,
                           v1::SetTrainingResponse* response) override;
  grpc::Status Forward(grpc::ServerContext* context,
                       const v1::ForwardRequest* request,
                       v1::ForwardResponse* response) override;
  grpc::ServerBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse>*
  Subscribe(grpc::CallbackServerContext* context) override;
  grpc::Status ListSubscribers(grpc::ServerContext* context,
                               const v1::ListSubscribersRequest* request,
                               v1::ListSubscribersResponse* response) override;
  grpc::Status QueryAudit(grpc::ServerContext* context,
                          const v1::QueryAuditRequest* request,
                          v1::QueryAuditResponse* response) override;
  grpc::Status WatchAudit(
      grpc::ServerContext* context, const v1::WatchAuditRequest* request,
      grpc::ServerWriter<v1::AuditRecordProto>* writer) override;
  grpc::Status VerifyAudit(grpc::ServerContext* context,
                           const v1::VerifyAuditRequest* request,
                           v1::VerifyAuditResponse* response) override;
  grpc::Status ListDevices(grpc::ServerContext* context,
                           const v1::ListDevicesRequest* request,
                           v1::ListDevicesResponse* response) override;

 private:
  // An authenticated caller and the context its changes are recorded with.
  struct Caller {
    OperationContext ctx;
    Principal principal;
    std::string peer;
    ModuleName module;  // set by CallerFor
  };

  // Runs one registration request and reports every event it fired.
  grpc::Status Register(const Caller& caller, const ModuleName& name,
                        RegistrationRequest request,
                        v1::RegisterResponse* response);
  grpc::Status RegisterTensor(grpc::ServerContext* context,
                              const v1::RegisterTensorRequest* request,
                              EntryKind kind, v1::RegisterResponse* response);
  BuildLimits Limits() const;

  // The caller, or UNAUTHENTICATED / PERMISSION_DENIED (recorded in the
  // audit log as "denied").
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase* context,
                                      absl::string_view rpc);
  // Authenticate, then the module named by `module_field` (INVALID_ARGUMENT
  // if malformed) into Caller::module, then Allow.
  absl::StatusOr<Caller> CallerFor(const grpc::ServerContextBase* context,
                                   absl::string_view rpc, Permission permission,
                                   const std::string& module_field);
  // OK if the caller holds `permission` in `module`'s namespace; otherwise
  // PERMISSION_DENIED, recorded.
  absl::Status Allow(const Caller& caller, absl::string_view rpc,
                     Permission permission, const ModuleName& module);
  // OK if the caller holds `permission` in some namespace (calls that
  // then show only what those namespaces allow).
  // UNAVAILABLE naming the audit log once an append or sync of it failed:
  // every change is refused rather than made unaudited.
  absl::Status AuditWritable() const;
  absl::Status AllowSomewhere(const Caller& caller, absl::string_view rpc,
                              Permission permission);
  // Audit reading: in namespace `ns`, or ("" ) in some namespace.
  absl::Status AllowAudit(const Caller& caller, absl::string_view rpc,
                          const std::string& ns);
  // An audit record of type "denied" for a refused call.
  void RecordDenial(const OperationContext& ctx, absl::string_view peer,
                    absl::string_view rpc, const ModuleName& module,
                    const absl::Status& status);
  // Whether an auditor limited to `namespaces` ({"*"}: all) may see `r`.
  static bool Visible(const std::vector<std::string>& namespaces,
                      const AuditRecord& r);

  // Constant after construction.
  ModelStore* const store_;
  SubscriberHub* const hub_;
  AuditLog* const audit_;
  const std::string audit_path_;
  const ServiceOptions options_;
  StreamLimiter streams_;
};

// The caller's identity and request id (from metadata "x-request-id", or a
// fresh one) for hooks and the audit log.
OperationContext ContextOf(const grpc::ServerContextBase* context);

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_
