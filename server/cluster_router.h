// File: cluster_router.h
// Where a call about a module is served when this server is a cluster
// member (--etcd_endpoints): here, when this replica owns the module (or
// it is being built and placement picks this replica), or at its owner,
// to which the handler forwards the call (server/forwarding.h).
//
// A forwarded call carries the caller's credentials ("authorization",
// "x-request-id", and the peer and certificate name this replica saw, in
// x-modelstate-forwarded-peer / -cn) and the cluster secret
// (x-modelstate-replica-secret). The owner believes a forwarded identity
// only with the secret; without it the call is UNAUTHENTICATED, so a
// client cannot pose as someone else by sending the headers itself. A
// forwarded call is never forwarded again: if ownership changed on the
// way it answers UNAVAILABLE.
//
// A replica that has joined takes no write until every intercepting
// subscriber recorded in etcd by another replica (its home, see
// server/subscription_relay.h) is connected here too: until then its
// registrations would not reach them. Writes answer UNAVAILABLE, naming
// the subscribers it waits for, which a home relays within a second
// (relay_refresh); a home that dies takes its records with its lease.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       auto router, ClusterRouter::Create(options, secret,
//                                          grpc::InsecureChannelCredentials()));
//   MODELSTATE_RETURN_IF_ERROR(router->Join("10.0.0.7:50051", {"team/mlp"}));
//   MODELSTATE_ASSIGN_OR_RETURN(std::optional<Peer> owner,
//                               router->Route(*context, "team/mlp",
//                                             Access::kRead));
//   if (owner.has_value()) { /* forward to owner->channel */ }
#ifndef MODELSTATE_SERVER_CLUSTER_ROUTER_H_
#define MODELSTATE_SERVER_CLUSTER_ROUTER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "cluster/cluster_member.h"
#include "grpcpp/grpcpp.h"
#include "service/authenticator.h"
#include "service/module_name.h"

namespace modelstate::server {

// What a call about a module does to it.
enum class Access {
  kRead,   // served by the owner; not placed when absent
  kWrite,  // served by the owner, whose lease must be live
  kBuild,  // placed when absent, then as kWrite
};

// Another replica, ready to be called.
struct Peer {
  std::string replica;
  std::shared_ptr<grpc::Channel> channel;
};

// Thread-safe.
class ClusterRouter {
 public:
  // `secret`: the cluster secret (--cluster_secret_file's contents), at
  // least 16 bytes. `peers`: how to reach the other replicas.
  static absl::StatusOr<std::unique_ptr<ClusterRouter>> Create(
      ClusterOptions options, std::string secret,
      std::shared_ptr<grpc::ChannelCredentials> peers);

  // Registers in etcd; until it has, module calls answer UNAVAILABLE.
  // `advertise_address` "" keeps the options' address. What
  // ClusterMember::Join found of the local modules (`in_move`: those whose
  // move was under way) goes to `joined`, called before any call is routed
  // here.
  absl::Status Join(const std::string& advertise_address,
                    const std::vector<std::string>& local_modules,
                    const std::vector<std::string>& in_move = {},
                    const std::function<void(const ClusterMember::JoinReport&)>&
                        joined = nullptr);
  // Leaves the cluster (revokes the lease).
  void Leave();
  // The names of the subscribers connected to this replica, relayed ones
  // included (for the write gate above). Call before Join.
  void set_connected_subscribers(
      std::function<std::vector<std::string>()> names) {
    connected_subscribers_ = std::move(names);
  }
  // Whether the copy of a module hosted here carries an unsettled cluster
  // move (ModelStore::InMove): such a copy is served only while etcd names
  // this replica its owner. Call before Join.
  void set_unsettled_move(std::function<bool(const ModuleName&)> unsettled) {
    unsettled_move_ = std::move(unsettled);
  }
  // New credentials for calling the other replicas (a rotated certificate
  // or CA, server/server_tls.h's PeerTls). The channels made with the old
  // ones are dropped, as a channel reconnects with the credentials it was
  // made with; calls under way finish on them (a Peer holds its channel).
  void set_peer_credentials(std::shared_ptr<grpc::ChannelCredentials> peers);
  // New credentials for etcd (a rotated client certificate, CA or
  // password, server/server_tls.h's EtcdTls): the member's client makes
  // new connections with them (EtcdClient::SetCredentials), and a Join
  // still to come uses them. The lease is etcd's, not a connection's: the
  // replica keeps it, and its membership, across the switch.
  void set_etcd_credentials(const EtcdCredentials& credentials);
  // How often a subscriber's home looks for members to relay from.
  absl::Duration relay_refresh() const { return options_.relay_refresh; }

  // Where a call about `module` (as the request spells it) is served:
  // nullopt here, else the owner to forward to. UNAVAILABLE when the owner
  // holds no live lease (naming it), or when this replica must serve a
  // write but cannot confirm its own lease.
  absl::StatusOr<std::optional<Peer>> Route(
      const grpc::ServerContextBase& context, absl::string_view module,
      Access access);
  // OK while this replica may commit a write: it has joined, and its lease
  // is certainly live (ClusterMember::CheckLease). The store asks it again
  // just before each change is saved, since a write may wait long after
  // Route let it in.
  absl::Status CheckWritable();
  // After a build that Route placed here: when no other build of `module`
  // is under way here and it is not `hosted` (the build failed), it is
  // no longer this replica's.
  void BuildDone(absl::string_view module, bool hosted);
  // After `module` was deleted here: it is no longer this replica's.
  void Release(absl::string_view module);

  // The live member `replica`, ready to be called: UNAVAILABLE naming it
  // when it holds no live lease.
  absl::StatusOr<Peer> MemberPeer(const std::string& replica);
  // Every live member except this one (for calls that merge).
  absl::StatusOr<std::vector<Peer>> OtherMembers();
  // The caller's credentials, with a forwarded identity put in place when
  // a replica forwarded the call; UNAUTHENTICATED when a forwarded
  // identity comes without the cluster secret.
  absl::StatusOr<Credentials> CallerCredentials(
      const grpc::ServerContextBase& context, Credentials direct) const;
  // Whether another replica forwarded this call (it is served here, not
  // forwarded or merged again).
  bool IsForwarded(const grpc::ServerContextBase& context) const;
  // A client context for forwarding the call of `context`: its deadline
  // and cancellation, the caller's credentials and the cluster secret.
  std::unique_ptr<grpc::ClientContext> ForwardingContext(
      const grpc::ServerContextBase& context) const;

  const std::string& replica() const { return options_.replica_id; }
  // nullptr until Join and after Leave; callers keep it alive while they
  // use it.
  std::shared_ptr<ClusterMember> member();

 private:
  ClusterRouter(ClusterOptions options, std::string secret,
                std::shared_ptr<grpc::ChannelCredentials> peers)
      : options_(std::move(options)),
        secret_(std::move(secret)),
        peers_(std::move(peers)) {}
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  absl::StatusOr<Peer> LivePeer(const std::string& replica,
                                absl::string_view module);
  // OK once every subscriber homed elsewhere is connected here.
  absl::Status CheckRelays(ClusterMember& self);

  ClusterOptions options_;
  const std::string secret_;
  Mutex mu_;
  std::shared_ptr<grpc::ChannelCredentials> peers_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ClusterMember> member_ ABSL_GUARDED_BY(mu_);
  // The latest set_etcd_credentials, and how many there were: a Join that
  // began before one hands it to its member when it ends.
  std::optional<EtcdCredentials> etcd_credentials_ ABSL_GUARDED_BY(mu_);
  uint64_t etcd_credentials_set_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Builds placed here and under way, by module: a failed one releases
  // the module only when it is the last.
  std::map<std::string, int> building_ ABSL_GUARDED_BY(mu_);
  std::function<std::vector<std::string>()> connected_subscribers_;
  std::function<bool(const ModuleName&)> unsettled_move_;
  // Every relay has reached this replica since it joined.
  bool relays_arrived_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_CLUSTER_ROUTER_H_
