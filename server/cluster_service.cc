#include "server/cluster_service.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "proto/convert.h"
#include "server/model_state_service.h"

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

}  // namespace

grpc::Status ClusterServiceImpl::GetClusterStatus(
    grpc::ServerContext* context, const v1::GetClusterStatusRequest*,
    v1::GetClusterStatusResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        Credentials credentials,
        router_->CallerCredentials(*context, CredentialsOf(*context)));
    MODELSTATE_ASSIGN_OR_RETURN(
        Caller caller, service_->Authenticate(credentials, "GetClusterStatus"));
    MODELSTATE_RETURN_IF_ERROR(
        service_->AllowAdmin(caller, "GetClusterStatus"));
    std::shared_ptr<ClusterMember> member = router_->member();
    if (member == nullptr) {
      return absl::UnavailableError("this replica is still joining");
    }
    return ClusterStatus(*member, response);
  }();
  return convert::ToGrpcStatus(status);
}

}  // namespace modelstate::server
