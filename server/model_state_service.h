// File: model_state_service.h
// The gRPC handlers. Each one authenticates the call, converts its request
// (proto/service_convert.h), calls one ModelService method and converts the
// result back; every error is an absl::Status mapped once by
// convert::ToGrpcStatus. Streams are pumped by small helpers. Authorisation,
// limits and the rest of the service's rules live in ModelService.
//
// Example:
//   ModelService service(&store, &hub, audit, auth, options);
//   ModelStateServiceImpl handlers(&service);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&handlers);
#ifndef MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_
#define MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_

#include <atomic>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/async_calls.h"
#include "server/cluster_audit_watch.h"
#include "server/cluster_router.h"
#include "server/metrics.h"
#include "server/shared_memory_exchange.h"
#include "service/access_gate.h"
#include "service/authenticator.h"
#include "service/model_service.h"

namespace modelstate::server {

// Thread-safe (handlers run concurrently on gRPC's threads). Subscribe is
// served by reactors on an AsyncCallQueue (a subscriber must not tie up a
// thread; server/async_calls.h says why not gRPC's callback API); the other
// methods are synchronous, since they may wait for subscribers' decisions.
class ModelStateServiceImpl final
    : public v1::ModelStateService::WithAsyncMethod_Subscribe<
          v1::ModelStateService::Service> {
 public:
  // None is owned; all must outlive the handlers. `router` (null for a
  // server on its own) sends calls about modules owned by other replicas
  // to them and merges listings across the cluster; `metrics` (optional)
  // counts the bytes each Subscribe stream has queued.
  // `shared_memory` (optional) is where same-host clients exchange memfds
  // with GetStateDict and LoadStateDict.
  explicit ModelStateServiceImpl(ModelService* service,
                                 ClusterRouter* router = nullptr,
                                 ServerMetrics* metrics = nullptr,
                                 SharedMemoryExchange* shared_memory = nullptr)
      : service_(service),
        router_(router),
        metrics_(metrics),
        shared_memory_(shared_memory) {}

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
  // Once the server is built: Subscribe calls are served on `queue` from
  // now.
  void ServeSubscriptions(AsyncCallQueue* queue);
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
  grpc::Status GetSharedMemoryInfo(
      grpc::ServerContext* context,
      const v1::GetSharedMemoryInfoRequest* request,
      v1::GetSharedMemoryInfoResponse* response) override;
  grpc::Status ListDevices(grpc::ServerContext* context,
                           const v1::ListDevicesRequest* request,
                           v1::ListDevicesResponse* response) override;
  grpc::Status ReleaseSubscriberName(
      grpc::ServerContext* context,
      const v1::ReleaseSubscriberNameRequest* request,
      v1::ReleaseSubscriberNameResponse* response) override;
  grpc::Status AttestModule(grpc::ServerContext* context,
                            const v1::AttestModuleRequest* request,
                            v1::AttestModuleResponse* response) override;
  grpc::Status SignStateFile(grpc::ServerContext* context,
                             const v1::SignStateFileRequest* request,
                             v1::SignStateFileResponse* response) override;
  grpc::Status GetCheckpoint(grpc::ServerContext* context,
                             const v1::GetCheckpointRequest* request,
                             v1::GetCheckpointResponse* response) override;
  grpc::Status GetInclusionProof(
      grpc::ServerContext* context, const v1::GetInclusionProofRequest* request,
      v1::GetInclusionProofResponse* response) override;
  grpc::Status GetConsistencyProof(
      grpc::ServerContext* context,
      const v1::GetConsistencyProofRequest* request,
      v1::GetConsistencyProofResponse* response) override;
  grpc::Status AddCosignature(grpc::ServerContext* context,
                              const v1::AddCosignatureRequest* request,
                              v1::AddCosignatureResponse* response) override;

 private:
  // Authenticates the call as `rpc`, runs `body` with the caller and maps
  // what either returns to the call's status.
  // The response's trailing metadata names the audit records the call
  // wrote (convert::kAuditSeqsKey: "12-14,20", bounded in size), and so
  // does `response`'s audit_seqs field, completely, when a mutating RPC
  // passes its response.
  template <typename Body>
  grpc::Status Serve(grpc::ServerContextBase* context, absl::string_view rpc,
                     Body body, google::protobuf::Message* response = nullptr);
  grpc::Status RegisterTensor(grpc::ServerContext* context,
                              const v1::RegisterTensorRequest* request,
                              EntryKind kind, v1::RegisterResponse* response);

  // The ring registered under `token` (shared memory), lent to this call.
  absl::StatusOr<SharedMemoryExchange::Lease> LendRing(absl::string_view token,
                                                       absl::string_view field);
  // modelstate_shared_memory_bytes_total.
  void CountSharedBytes(absl::string_view direction, uint64_t bytes);

  // The caller, as the call's credentials (or a replica's forwarded
  // identity) say.
  // Authenticate as a check to run before a call is routed to its owner
  // (the owner authenticates it again).
  std::function<absl::Status()> AuthenticatesAs(
      grpc::ServerContextBase* context, absl::string_view rpc);
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context,
                                      absl::string_view rpc);
  // This replica's modules.
  grpc::Status ListLocalModules(grpc::ServerContext* context,
                                const v1::ListModulesRequest* request,
                                v1::ListModulesResponse* response);
  // ListModules of a cluster member asked by a client: every replica's.
  grpc::Status ListClusterModules(grpc::ServerContext* context,
                                  const v1::ListModulesRequest* request,
                                  v1::ListModulesResponse* response);
  // WatchAudit of this replica's own log (until cancelled, or `stop`).
  grpc::Status WatchOwnAudit(grpc::ServerContext* context,
                             const v1::WatchAuditRequest& request,
                             const AuditSink& write,
                             const std::atomic<bool>* stop);
  // WatchAudit with `cluster`: every live replica's records, as written.
  grpc::Status WatchClusterAudit(
      grpc::ServerContext* context, const v1::WatchAuditRequest* request,
      grpc::ServerWriter<v1::AuditRecordProto>* writer);
  // QueryAudit with `cluster`: every live replica's records, merged.
  grpc::Status QueryClusterAudit(grpc::ServerContext* context,
                                 const v1::QueryAuditRequest* request,
                                 v1::QueryAuditResponse* response);

  ModelService* const service_;
  ClusterRouter* const router_;
  ServerMetrics* const metrics_;
  SharedMemoryExchange* const shared_memory_;
};

// What the call presents: its peer, request id ("x-request-id"),
// "authorization" metadata and verified client certificate CN.
Credentials CredentialsOf(const grpc::ServerContextBase& context);

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_MODEL_STATE_SERVICE_H_
