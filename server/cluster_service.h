// File: cluster_service.h
// The ClusterService handlers (proto/modelstate/v1/cluster.proto): what an
// operator asks a cluster member about membership and placement.
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

 private:
  ModelService* const service_;
  ClusterRouter* const router_;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_CLUSTER_SERVICE_H_
