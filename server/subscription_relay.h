// File: subscription_relay.h
// Cluster-wide hooks: a subscriber connected to one replica sees the
// registrations of every replica. The replica it connected to (its home)
// subscribes on its behalf at every other live member, as the subscriber
// (its identity forwarded with the cluster secret, server/cluster_router.h),
// with the same subscription; each of those replicas' hubs then treats the
// relay as one of its own subscribers: same chain order, timeouts and
// failure policies. The relay passes their events on to the subscriber and
// its answers back. When the subscriber's stream ends, or its home dies,
// every relayed subscription ends, which each owner's hub takes as the
// subscriber's disconnect: its failure policy applies.
//
// An interceptor is recorded in etcd under its home's lease while the relay
// runs, so that a replica that joins takes no write before the relay has
// reached it (server/cluster_router.h).
//
// One event-id space: a relayed event's id is 2^63 + (connection << 40) +
// its id at the owner, so ids never collide with the home hub's own (below
// 2^63) nor between connections; the event's `replica` and
// `replica_event_id` say whose audit log decided it, under which id.
//
// Members that join later are subscribed to within `refresh` (1 s).
//
// Example:
//   auto relay = std::make_unique<SubscriptionRelay>(router, context);
//   MODELSTATE_RETURN_IF_ERROR(relay->Start(subscription, on_event,
//                                           on_failure));
//   ... answers with IsRelayed(id) go to relay->Answer(std::move(answer));
//   relay->Stop();
#ifndef MODELSTATE_SERVER_SUBSCRIPTION_RELAY_H_
#define MODELSTATE_SERVER_SUBSCRIPTION_RELAY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/cluster_router.h"

namespace modelstate::server {

// Thread-safe.
class SubscriptionRelay {
 public:
  // An event from another replica, its id already in the subscriber's
  // space. Called from the relay's threads, never with its locks held.
  using EventSink =
      std::function<void(std::unique_ptr<v1::SubscribeResponse> event)>;
  // Another replica refused the subscription for a reason the subscriber
  // must hear (its name taken by another identity, a role it lacks, a
  // replacement under the same name): the subscription ends with it.
  using FailureSink = std::function<void(const absl::Status& status)>;

  // `router` and `context` (the subscriber's call) outlive the relay.
  SubscriptionRelay(ClusterRouter* router,
                    const grpc::ServerContextBase* context,
                    absl::Duration refresh = absl::Seconds(1));
  ~SubscriptionRelay();  // Stop()

  static bool IsRelayed(uint64_t event_id) { return event_id >> 63 != 0; }

  // Subscribes at every other live member, waiting up to `connect_timeout`
  // for their acknowledgements (so that the subscriber's own ack means
  // subscribed across the cluster), then keeps the set up to date. A
  // replica that refuses outright makes Start fail with its status.
  absl::Status Start(const v1::Subscription& subscription, EventSink on_event,
                     FailureSink on_failure,
                     absl::Duration connect_timeout = absl::Seconds(5));
  // An answer to a relayed event goes to the replica that sent it, under
  // its own id. An answer for a connection that has ended is dropped: that
  // replica's hub already applied the failure policy.
  void Answer(v1::HookAnswer answer);
  // Ends every relayed subscription and joins the threads. Idempotent.
  void Stop();

 private:
  struct Upstream;
  // Opens `peer`'s subscription and relays its events until it ends.
  void RunUpstream(std::shared_ptr<Upstream> upstream);
  // Subscribes at the members not yet subscribed to; returns the new ones.
  std::vector<std::shared_ptr<Upstream>> ConnectNew() ABSL_LOCKS_EXCLUDED(mu_);
  void RefreshLoop();
  // The subscription must end with `status` (once).
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void JoinEnded() ABSL_LOCKS_EXCLUDED(mu_);

  ClusterRouter* const router_;
  const grpc::ServerContextBase* const context_;
  const absl::Duration refresh_;
  v1::Subscription subscription_;
  EventSink on_event_;
  FailureSink on_failure_;

  Mutex mu_;
  CondVar changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  uint64_t next_connection_ ABSL_GUARDED_BY(mu_) = 1;
  // Live connections, by connection number (the id's bits 40-62).
  std::map<uint64_t, std::shared_ptr<Upstream>> upstreams_ ABSL_GUARDED_BY(mu_);
  // Threads of connections that have ended, to join.
  std::vector<std::thread> ended_ ABSL_GUARDED_BY(mu_);
  std::thread refresher_;
  // Where this interceptor is recorded (until Stop), if it is.
  std::shared_ptr<ClusterMember> recorded_in_;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_SUBSCRIPTION_RELAY_H_
