#include "server/forwarding.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace modelstate::server {

grpc::Status FromReplica(const std::string& replica,
                         const grpc::Status& status) {
  return grpc::Status(
      status.error_code(),
      absl::StrCat("replica ", replica, ": ", status.error_message()));
}

void PassOnTrailers(const grpc::ClientContext& from,
                    grpc::ServerContextBase* to) {
  for (const auto& [key, value] : from.GetServerTrailingMetadata()) {
    // gRPC's own trailers (grpc-status, ...) are set by the status.
    if (key.starts_with("grpc-")) continue;
    to->AddTrailingMetadata(std::string(key.data(), key.size()),
                            std::string(value.data(), value.size()));
  }
}

grpc::Status ForwardLoad(const ClusterRouter& router, const Peer& owner,
                         grpc::ServerContext* context,
                         const v1::LoadStateDictRequest& start,
                         grpc::ServerReader<v1::LoadStateDictRequest>* reader,
                         v1::LoadStateDictResponse* response) {
  Stub stub(owner.channel);
  std::unique_ptr<grpc::ClientContext> call =
      router.ForwardingContext(*context);
  std::unique_ptr<grpc::ClientWriter<v1::LoadStateDictRequest>> writer =
      stub.LoadStateDict(call.get(), response);
  bool open = writer->Write(start);
  v1::LoadStateDictRequest message;
  while (open && reader->Read(&message)) open = writer->Write(message);
  // A caller that went away must not look like a stream that ended: the
  // owner would take what came as the whole load and refuse it as short,
  // but cancelling says what happened.
  if (context->IsCancelled()) call->TryCancel();
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  PassOnTrailers(*call, context);
  return status;
}

}  // namespace modelstate::server
