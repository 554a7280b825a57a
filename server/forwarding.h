// File: forwarding.h
// Passes a call on to the replica that owns its module (see
// server/cluster_router.h), message by message: a stream is relayed as it
// arrives, never held whole. The owner's status, response and trailing
// metadata (its audit record numbers) come back to the caller as the owner
// sent them; the caller's deadline and cancellation go with the call.
//
// Example:
//   if (std::optional<Peer> owner = ...) {
//     return ForwardUnary(router, *owner, context,
//                         &v1::ModelStateService::Stub::GetModule, *request,
//                         response);
//   }
#ifndef MODELSTATE_SERVER_FORWARDING_H_
#define MODELSTATE_SERVER_FORWARDING_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/cluster_router.h"

namespace modelstate::server {

using Stub = v1::ModelStateService::Stub;

// A replica's failure, as the status of the call that asked it: the same
// code, the message naming the replica.
grpc::Status FromReplica(const std::string& replica,
                         const grpc::Status& status);

// The owner's trailing metadata, as this call's.
void PassOnTrailers(const grpc::ClientContext& from,
                    grpc::ServerContextBase* to);

template <typename Request, typename Response>
grpc::Status ForwardUnary(const ClusterRouter& router, const Peer& owner,
                          grpc::ServerContextBase* context,
                          grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                       const Request&,
                                                       Response*),
                          const Request& request, Response* response) {
  Stub stub(owner.channel);
  std::unique_ptr<grpc::ClientContext> call =
      router.ForwardingContext(*context);
  grpc::Status status = (stub.*method)(call.get(), request, response);
  PassOnTrailers(*call, context);
  return status;
}

// A server stream: each message the owner sends goes on to the caller.
template <typename Request, typename Message>
grpc::Status ForwardDownload(const ClusterRouter& router, const Peer& owner,
                             grpc::ServerContext* context,
                             std::unique_ptr<grpc::ClientReader<Message>> (
                                 Stub::*method)(grpc::ClientContext*,
                                                const Request&),
                             const Request& request,
                             grpc::ServerWriter<Message>* writer) {
  Stub stub(owner.channel);
  std::unique_ptr<grpc::ClientContext> call =
      router.ForwardingContext(*context);
  std::unique_ptr<grpc::ClientReader<Message>> reader =
      (stub.*method)(call.get(), request);
  Message message;
  while (reader->Read(&message)) {
    if (!writer->Write(message)) {
      call->TryCancel();  // the caller went away
      break;
    }
  }
  grpc::Status status = reader->Finish();
  PassOnTrailers(*call, context);
  return status;
}

// A load stream whose first message (`start`) this replica has read: it
// and every message after it go on to the owner.
grpc::Status ForwardLoad(const ClusterRouter& router, const Peer& owner,
                         grpc::ServerContext* context,
                         const v1::LoadStateDictRequest& start,
                         grpc::ServerReader<v1::LoadStateDictRequest>* reader,
                         v1::LoadStateDictResponse* response);

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_FORWARDING_H_
