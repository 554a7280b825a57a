// File: cluster_service.h
// The ClusterService handlers (proto/modelstate/v1/cluster.proto): what an
// operator asks a cluster member about membership and placement, and the
// two halves of moving a module between replicas: the owner streams the
// module's files (as on disk: the manifest and the data files it names) to
// the replica that is to own it, which writes them, commits, takes over
// the ownership in etcd and then hosts the module; only then does the old
// owner delete its copy. An answer lost after the takeover is settled by
// etcd: the old owner deletes its copy only when etcd names the new owner.
//
// Example:
//   ClusterServiceImpl cluster(&service, &router);
//   builder.RegisterService(&cluster);
#ifndef MODELSTATE_SERVER_CLUSTER_SERVICE_H_
#define MODELSTATE_SERVER_CLUSTER_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "modelstate/v1/cluster.grpc.pb.h"
#include "server/cluster_router.h"
#include "service/model_service.h"

namespace modelstate::server {

// Thread-safe.
class ClusterServiceImpl final : public v1::ClusterService::Service {
 public:
  // Neither is owned; both must outlive the handlers.
  ClusterServiceImpl(ModelService* service, ClusterRouter* router)
      : service_(service), router_(router) {}

  grpc::Status GetClusterStatus(
      grpc::ServerContext* context, const v1::GetClusterStatusRequest* request,
      v1::GetClusterStatusResponse* response) override;
  grpc::Status MoveModuleToReplica(
      grpc::ServerContext* context,
      const v1::MoveModuleToReplicaRequest* request,
      v1::MoveModuleToReplicaResponse* response) override;
  grpc::Status ImportModule(grpc::ServerContext* context,
                            grpc::ServerReader<v1::ImportModuleRequest>* reader,
                            v1::ImportModuleResponse* response) override;

 private:
  // The caller of `rpc`, as its credentials (or a replica's forwarded
  // identity) say.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context,
                                      absl::string_view rpc);
  // This replica's membership: UNAVAILABLE while it is joining.
  absl::StatusOr<std::shared_ptr<ClusterMember>> Member();

  ModelService* const service_;
  ClusterRouter* const router_;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_CLUSTER_SERVICE_H_
