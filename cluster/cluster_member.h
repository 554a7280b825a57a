// File: cluster_member.h
// This server's membership of a modelstate cluster, kept in etcd:
//   <prefix>members/<replica>   {"address": ..., "lease": ...}, attached to
//                               the replica's lease, so it disappears when
//                               the replica stops renewing it;
//   <prefix>owners/<ns>/<name>  the replica that owns the module; not
//                               leased: a dead owner keeps its modules
//                               (they answer UNAVAILABLE) until it comes
//                               back with its volume.
// A module is placed when it is built, on the live member that owns the
// fewest modules (ties broken by a hash of module and replica, so that
// replicas agree), and claimed by its owner in one transaction that also
// requires the owner's member record: a replica whose lease has lapsed
// cannot claim. The lease is renewed every third of its time to live; a
// replica refuses writes (CheckLease) once it cannot be sure its lease is
// still live, before etcd could have let it expire.
//
// Example:
//   ClusterOptions options;
//   options.etcd.endpoints = {"127.0.0.1:2379"};
//   options.replica_id = "modelstate-0";
//   options.advertise_address = "10.0.0.7:50051";
//   MODELSTATE_ASSIGN_OR_RETURN(auto member,
//                               ClusterMember::Join(options, {"team/mlp"}));
//   MODELSTATE_ASSIGN_OR_RETURN(std::string owner,
//                               member->ChooseOwner("team/new"));
//   if (owner == member->replica()) {
//     MODELSTATE_RETURN_IF_ERROR(member->Claim("team/new"));
//   }
#ifndef MODELSTATE_CLUSTER_CLUSTER_MEMBER_H_
#define MODELSTATE_CLUSTER_CLUSTER_MEMBER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "cluster/etcd_client.h"

namespace modelstate {

struct ClusterOptions {
  EtcdOptions etcd;
  // This replica's name, unique in the cluster ([A-Za-z0-9_.-]).
  std::string replica_id;
  // host:port where the other replicas reach this one.
  std::string advertise_address;
  // Names this replica's data directory. A live member record with this
  // replica id and the same volume is this replica's previous life (killed
  // before its lease ran out), which a restart takes over; with another
  // volume it is a second server given the same id, refused.
  std::string volume_id;
  // The lease's time to live: how long a replica that stopped renewing it
  // is still counted live.
  int64_t lease_seconds = 10;
  // Every key the cluster keeps starts with this.
  std::string key_prefix = "/modelstate/";
  // The replica's audit log as it stands: its verifier key and latest
  // signed checkpoint, recorded in etcd at each renewal when it changed
  // (empty: none).
  std::function<std::pair<std::string, std::string>()> audit_checkpoint;
  // How often a subscriber's home replica looks for members that joined,
  // to relay their events to it (server/subscription_relay.h).
  absl::Duration relay_refresh = absl::Seconds(1);
};

struct ClusterMemberInfo {
  std::string replica;
  std::string address;
  int64_t lease = 0;
};

struct RecordedCheckpoint {
  std::string replica;
  std::string verifier_key;
  std::string note;
};

struct ModuleOwner {
  std::string module;  // "namespace/name"
  std::string replica;
};

// An intercepting subscriber and the replica it is connected to (its
// home), which relays every other replica's events to it.
struct RecordedSubscriber {
  std::string name;
  std::string home;
};

// Thread-safe.
class ClusterMember {
 public:
  // What Join found of the modules a replica hosts.
  struct JoinReport {
    // Hosted modules this replica does not own, with their owner: another
    // replica, or "" for a module whose move was under way that no replica
    // owns now (deleted by its owner meanwhile). The copies here are not
    // the module.
    std::vector<ModuleOwner> owned_elsewhere;
    // Modules whose move was under way that etcd names this replica's.
    std::vector<std::string> moves_settled;
  };
  // Registers this replica under a new lease (ALREADY_EXISTS when a live
  // member has its replica id), claims the modules it already hosts
  // (`local_modules`, full names) and starts renewing the lease. Those in
  // `in_move` (a cluster move of them was under way when this replica
  // stopped) are not claimed: they are this replica's only if etcd already
  // says so. What is not this replica's goes to `report` (when given; else
  // it is only logged).
  static absl::StatusOr<std::unique_ptr<ClusterMember>> Join(
      ClusterOptions options, const std::vector<std::string>& local_modules,
      const std::vector<std::string>& in_move = {},
      JoinReport* report = nullptr);
  // Stops renewing and revokes the lease: the replica leaves at once.
  ~ClusterMember();

  const std::string& replica() const { return options_.replica_id; }
  EtcdClient& etcd() { return *etcd_; }

  // The replica that owns `module`, nullopt when it is not placed.
  absl::StatusOr<std::optional<std::string>> OwnerOf(absl::string_view module);
  // The member record of `replica`, nullopt when it holds no live lease.
  absl::StatusOr<std::optional<ClusterMemberInfo>> LiveMember(
      absl::string_view replica);
  // Every member with a live lease, by replica id.
  absl::StatusOr<std::vector<ClusterMemberInfo>> LiveMembers();
  // Every placed module, by name, and etcd's revision when read.
  absl::StatusOr<std::vector<ModuleOwner>> Owners(int64_t* revision = nullptr);
  // Every replica's recorded audit checkpoint, by replica.
  absl::StatusOr<std::vector<RecordedCheckpoint>> Checkpoints();

  // Where a new module goes: the live member owning the fewest modules.
  absl::StatusOr<std::string> ChooseOwner(absl::string_view module);
  // Makes this replica the owner of `module`: OK when it is (now or
  // already); FAILED_PRECONDITION naming the owner when another replica
  // is; UNAVAILABLE when this replica's lease has lapsed.
  absl::Status Claim(absl::string_view module);
  // The etcd revision at which this replica's ownership of `module` was
  // last written: a move's sender passes it to the receiver's TakeOver.
  // FAILED_PRECONDITION naming the owner when this replica does not own it.
  absl::StatusOr<int64_t> OwnedRevision(absl::string_view module);
  // Makes this replica the owner of `module` in place of `from` (a cluster
  // move), in one transaction that also requires this replica's member
  // record and, unless `from_revision` is 0, that `from`'s ownership is
  // still the one written at that revision: FAILED_PRECONDITION naming the
  // owner when `from` no longer owns it, or when `from` called the move off
  // (KeepOwnership); UNAVAILABLE when this replica's lease has lapsed.
  absl::Status TakeOver(absl::string_view module, absl::string_view from,
                        int64_t from_revision = 0);
  // Writes this replica's ownership of `module` again (same value, a new
  // revision), so that no move of it begun before can take it over any
  // more: after it, a move that failed ambiguously has certainly not
  // happened. Returns false when this replica no longer owns `module`, or
  // holds no member record to write with.
  absl::StatusOr<bool> KeepOwnership(absl::string_view module);
  // Gives up ownership of `module` (after it was deleted here).
  absl::Status Release(absl::string_view module);

  // OK while this replica's lease is certainly live: a write checks it
  // first, so a replica cut off from etcd (or stopped) past its lease
  // accepts no write after it resumes until it has a live lease again.
  absl::Status CheckLease() const;
  // FAILED_PRECONDITION once another server has taken this replica's id
  // (it registered while this one's lease had lapsed): this one then serves
  // nothing, reads included, since its copies are no longer the owner's.
  // OK otherwise.
  absl::Status Standing() const;
  // The lease currently held (0 while there is none).
  int64_t lease() const;

  // An intercepting subscriber homed here, recorded under this replica's
  // lease (at <prefix>subscribers/<name>/<replica>; again under a new lease
  // when the old one lapsed) until it is forgotten as often as it was
  // recorded: a replica that joins takes no write until every recorded
  // subscriber's relay has reached it, and a home that dies takes its
  // records with it.
  absl::Status RecordSubscriber(const std::string& name);
  void ForgetSubscriber(const std::string& name);
  // Every recorded subscriber, with its home.
  absl::StatusOr<std::vector<RecordedSubscriber>> RecordedSubscribers();

 private:
  ClusterMember(ClusterOptions options, std::unique_ptr<EtcdClient> etcd);

  std::string MemberKey(absl::string_view replica) const;
  std::string OwnerKey(absl::string_view module) const;
  std::string CheckpointKey(absl::string_view replica) const;
  std::string SubscriberKey(absl::string_view name) const;
  // Records the audit log's latest checkpoint in etcd if it changed.
  absl::Status PublishCheckpoint();
  // Grants a lease and writes this replica's member record under it.
  absl::Status Register(bool first);
  void RenewLoop();

  const ClusterOptions options_;
  const std::unique_ptr<EtcdClient> etcd_;
  mutable Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  // Before this the lease is live in etcd: the renewal that set it was
  // sent before etcd restarted the lease's clock.
  absl::Time live_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status displaced_ ABSL_GUARDED_BY(mu_);  // see Standing()
  // Subscribers recorded here, each with how many subscriptions hold it.
  std::map<std::string, int> subscribers_ ABSL_GUARDED_BY(mu_);
  // What PublishCheckpoint last recorded (the renewal thread's, and Join's
  // before it starts).
  std::string published_;
  absl::Notification stop_;
  std::thread renewer_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CLUSTER_CLUSTER_MEMBER_H_
