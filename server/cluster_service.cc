#include "server/cluster_service.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/convert.h"
#include "proto/service_convert.h"
#include "server/model_state_service.h"
#include "service/module_transfer.h"

namespace modelstate::server {
namespace {

absl::Status ClusterStatus(ClusterMember& member,
                           v1::GetClusterStatusResponse* response) {
  response->set_replica(member.replica());
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ClusterMemberInfo> members,
                              member.LiveMembers());
  int64_t revision = 0;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ModuleOwner> owners,
                              member.Owners(&revision));
  response->set_etcd_revision(revision);
  std::map<std::string, uint64_t> owned;
  for (const ModuleOwner& owner : owners) ++owned[owner.replica];
  std::set<std::string> live;
  for (const ClusterMemberInfo& info : members) {
    live.insert(info.replica);
    v1::ClusterMember* out = response->add_members();
    out->set_replica(info.replica);
    out->set_address(info.address);
    out->set_lease_id(info.lease);
    MODELSTATE_ASSIGN_OR_RETURN(int64_t ttl,
                                member.etcd().TimeToLive(info.lease));
    out->set_lease_ttl_seconds(ttl);
    out->set_modules(owned[info.replica]);
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<RecordedCheckpoint> checkpoints,
                              member.Checkpoints());
  for (RecordedCheckpoint& recorded : checkpoints) {
    v1::ReplicaCheckpoint* out = response->add_checkpoints();
    out->set_replica(std::move(recorded.replica));
    out->set_verifier_key(std::move(recorded.verifier_key));
    out->set_note(std::move(recorded.note));
  }
  for (const ModuleOwner& owner : owners) {
    v1::ModulePlacement* out = response->add_placements();
    out->set_module(owner.module);
    out->set_owner(owner.replica);
    out->set_owner_live(live.count(owner.replica) > 0);
  }
  return absl::OkStatus();
}

// The bytes of file a move sends per message.
constexpr size_t kMoveChunkBytes = 1 << 20;

// Sends `paths` (a module's files, manifest last) over an ImportModule
// stream to `target`, which then owns `module`; returns the bytes sent.
// When it fails, `*called_off` says whether the move certainly did not
// happen: this replica wrote its ownership again (KeepOwnership), so a
// takeover the target has not yet made can no longer succeed. Otherwise
// (etcd could not be asked) nobody can tell yet.
absl::StatusOr<uint64_t> SendModule(ClusterRouter& router,
                                    ClusterMember& member,
                                    const grpc::ServerContext& context,
                                    const Peer& target,
                                    const std::string& module,
                                    const std::vector<std::string>& paths,
                                    bool* called_off) {
  *called_off = true;  // until the target is called
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<TransferFile> files,
                              DescribeTransferFiles(paths));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t revision, member.OwnedRevision(module));
  v1::ImportModuleRequest header;
  header.mutable_header()->set_module(module);
  header.mutable_header()->set_from_replica(router.replica());
  header.mutable_header()->set_owner_revision(revision);
  uint64_t total = 0;
  for (const TransferFile& file : files) {
    auto* out = header.mutable_header()->add_files();
    out->set_name(file.name);
    out->set_bytes(file.bytes);
    total += file.bytes;
  }
  *called_off = false;
  v1::ClusterService::Stub stub(target.channel);
  std::unique_ptr<grpc::ClientContext> call = router.ForwardingContext(context);
  v1::ImportModuleResponse reply;
  std::unique_ptr<grpc::ClientWriter<v1::ImportModuleRequest>> writer =
      stub.ImportModule(call.get(), &reply);
  v1::ImportModuleRequest chunk;
  bool sending = writer->Write(header);
  absl::Status failed =
      ReadTransferFiles(paths, kMoveChunkBytes, [&](std::string& bytes) {
        chunk.mutable_data()->swap(bytes);
        sending = sending && writer->Write(chunk);
        chunk.mutable_data()->swap(bytes);
        return sending;
      });
  if (failed.ok()) {
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (status.ok()) return total;
    failed = convert::FromGrpcStatus(status);
    failed = absl::Status(
        failed.code(),
        absl::StrCat("replica ", target.replica,
                     " did not take the module: ", failed.message()));
  } else {
    call->TryCancel();
    (void)writer->Finish();
  }
  // The call may have ended here only (a deadline, a lost answer) while
  // the target took over, or is about to: calling the move off in etcd
  // settles which.
  absl::StatusOr<bool> kept = member.KeepOwnership(module);
  if (kept.ok() && *kept) {
    *called_off = true;
    return failed;
  }
  absl::StatusOr<std::optional<std::string>> owner = member.OwnerOf(module);
  if (owner.ok() && *owner == target.replica) return total;
  return failed;
}

}  // namespace

absl::StatusOr<Caller> ClusterServiceImpl::Authenticate(
    const grpc::ServerContext& context, absl::string_view rpc) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Credentials credentials,
      router_->CallerCredentials(context, CredentialsOf(context)));
  return service_->Authenticate(credentials, rpc);
}

absl::StatusOr<std::shared_ptr<ClusterMember>> ClusterServiceImpl::Member() {
  std::shared_ptr<ClusterMember> member = router_->member();
  if (member == nullptr) {
    return absl::UnavailableError("this replica is still joining");
  }
  return member;
}

grpc::Status ClusterServiceImpl::MoveModuleToReplica(
    grpc::ServerContext* context, const v1::MoveModuleToReplicaRequest* request,
    v1::MoveModuleToReplicaResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(Caller caller,
                                Authenticate(*context, "MoveModuleToReplica"));
    MODELSTATE_RETURN_IF_ERROR(
        service_->AllowAdmin(caller, "MoveModuleToReplica"));
    MODELSTATE_ASSIGN_OR_RETURN(ModuleName name,
                                convert::ParseModuleField(request->module()));
    const std::string& target = request->replica();
    if (target.empty()) {
      return absl::InvalidArgumentError("replica: empty");
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<ClusterMember> member,
                                Member());
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<std::string> owner,
                                member->OwnerOf(name.full()));
    if (!owner.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "module '", name.full(), "' is not placed in the cluster"));
    }
    if (*owner == target) {
      return absl::FailedPreconditionError(absl::StrCat(
          "module '", name.full(), "' is already on replica ", target));
    }
    // The owner moves it: any other replica passes the call on.
    MODELSTATE_ASSIGN_OR_RETURN(
        std::optional<Peer> forward_to,
        router_->Route(*context, name.full(), Access::kWrite));
    if (forward_to.has_value()) {
      v1::ClusterService::Stub stub(forward_to->channel);
      std::unique_ptr<grpc::ClientContext> call =
          router_->ForwardingContext(*context);
      return convert::FromGrpcStatus(
          stub.MoveModuleToReplica(call.get(), *request, response));
    }
    MODELSTATE_ASSIGN_OR_RETURN(Peer peer, router_->MemberPeer(target));
    uint64_t sent = 0;
    bool called_off = false;
    MODELSTATE_RETURN_IF_ERROR(service_->MoveModuleOut(
        caller, name, target,
        [&](const std::vector<std::string>& files) -> absl::StatusOr<uint64_t> {
          MODELSTATE_ASSIGN_OR_RETURN(
              sent, SendModule(*router_, *member, *context, peer, name.full(),
                               files, &called_off));
          return sent;
        },
        // Unless the move was called off, the target may hold the module
        // now or later: the mark stays for the next start.
        [&](const absl::Status&) { return called_off; }));
    response->set_module(name.full());
    response->set_from_replica(router_->replica());
    response->set_to_replica(target);
    response->set_bytes(sent);
    return absl::OkStatus();
  }();
  return convert::ToGrpcStatus(status);
}

grpc::Status ClusterServiceImpl::ImportModule(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::ImportModuleRequest>* reader,
    v1::ImportModuleResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    if (!router_->IsForwarded(*context)) {
      return absl::UnauthenticatedError(
          "ImportModule: only the replicas of this cluster call it (the "
          "cluster secret is missing)");
    }
    MODELSTATE_ASSIGN_OR_RETURN(Caller caller,
                                Authenticate(*context, "ImportModule"));
    MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<ClusterMember> member,
                                Member());
    v1::ImportModuleRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return absl::InvalidArgumentError(
          "header: the stream must open with an ImportModuleHeader");
    }
    const v1::ImportModuleHeader header = std::move(*message.mutable_header());
    MODELSTATE_ASSIGN_OR_RETURN(ModuleName name,
                                convert::ParseModuleField(header.module()));
    std::vector<TransferFile> files;
    for (const auto& file : header.files()) {
      files.push_back({file.name(), file.bytes()});
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        std::unique_ptr<ModuleImport> import,
        ModuleImport::Begin(*service_, caller, name, header.from_replica(),
                            std::move(files)));
    while (reader->Read(&message)) {
      if (!message.has_data()) {
        return absl::InvalidArgumentError(
            "header: sent twice; the stream carries one");
      }
      MODELSTATE_RETURN_IF_ERROR(import->Append(message.data()));
    }
    MODELSTATE_RETURN_IF_ERROR(import->Commit([&] {
      // The sender gave up (its deadline, its caller's cancellation): it
      // keeps the module, so no takeover.
      if (context->IsCancelled()) {
        return absl::CancelledError("the sending replica gave up the move");
      }
      return member->TakeOver(name.full(), header.from_replica(),
                              header.owner_revision());
    }));
    response->set_replica(member->replica());
    return absl::OkStatus();
  }();
  return convert::ToGrpcStatus(status);
}

grpc::Status ClusterServiceImpl::GetClusterStatus(
    grpc::ServerContext* context, const v1::GetClusterStatusRequest*,
    v1::GetClusterStatusResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(Caller caller,
                                Authenticate(*context, "GetClusterStatus"));
    MODELSTATE_RETURN_IF_ERROR(
        service_->AllowAdmin(caller, "GetClusterStatus"));
    MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<ClusterMember> member,
                                Member());
    return ClusterStatus(*member, response);
  }();
  return convert::ToGrpcStatus(status);
}

}  // namespace modelstate::server
