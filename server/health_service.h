// File: health_service.h
// grpc.health.v1 for one grpc::Server: the server ("" service) is SERVING
// until Shutdown, NOT_SERVING from then on; any other service name is
// unknown (Check: NOT_FOUND; Watch: SERVICE_UNKNOWN). Check is synchronous;
// a Watch stream is a reactor on an AsyncCallQueue (server/async_calls.h),
// so that watchers hold no thread. At Shutdown every watcher of the server
// is sent NOT_SERVING and its stream ends.
//
// gRPC's own health service is not used: in gRPC 1.51 it is built on the
// callback API, which delays other calls (see async_calls.h).
//
// Example:
//   HealthService health;
//   builder.RegisterService(&health);
//   AsyncCallQueue queue(builder);
//   server = builder.BuildAndStart();
//   queue.Start(2);
//   health.ServeWatches(&queue);
//   ...
//   health.Shutdown();  // watchers see NOT_SERVING
//   server->Shutdown();
//   queue.Shutdown();
#ifndef MODELSTATE_SERVER_HEALTH_SERVICE_H_
#define MODELSTATE_SERVER_HEALTH_SERVICE_H_

#include "absl/container/flat_hash_set.h"
#include "base/sync.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/async_calls.h"

namespace modelstate::server {

class HealthService final
    : public grpc::health::v1::Health::WithAsyncMethod_Watch<
          grpc::health::v1::Health::Service> {
 public:
  HealthService() = default;
  ~HealthService() override;

  // Once the server is built: Watch calls are served on `queue` from now.
  void ServeWatches(AsyncCallQueue* queue);

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

  // NOT_SERVING from now on, and every watcher is told.
  void Shutdown();

 private:
  class Watcher;
  // Adds a new watcher unless shut down; returns whether it was added.
  bool Add(Watcher* watcher);
  void Remove(Watcher* watcher);

  Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_HEALTH_SERVICE_H_
