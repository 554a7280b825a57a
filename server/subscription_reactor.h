// File: subscription_reactor.h
// One Subscribe stream: a gRPC callback reactor that attaches the
// subscriber to the SubscriberHub, forwards its answers, and writes the
// hub's events to the stream, one write in flight at a time, from a bounded
// queue (a subscriber that stops reading is disconnected rather than letting
// the server buffer without limit).
#ifndef MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_
#define MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "core/model_store.h"
#include "core/subscriber_hub.h"
#include "core/sync.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/auth.h"

namespace modelstate::server {

struct SubscriptionLimits {
  // Events waiting to be written before the subscriber is dropped.
  size_t max_queued_events = 10000;
  uint64_t max_tensor_bytes = uint64_t{16} << 30;
};

// What the caller may subscribe to.
struct SubscriptionAccess {
  // Not OK: the call ends with this status at once (already audited).
  absl::Status denied;
  // Checks the subscription against the caller's rights and narrows what it
  // may see (SubscriptionSpec::visible_namespaces); null: anything goes.
  std::function<absl::Status(SubscriptionSpec&)> admit;
  // Held while the subscription lasts (streams per identity).
  std::unique_ptr<StreamLimiter::Slot> slot;
};

// Deletes itself when the RPC is done (gRPC's reactor contract).
class SubscriptionReactor
    : public grpc::ServerBidiReactor<v1::SubscribeRequest,
                                     v1::SubscribeResponse> {
 public:
  SubscriptionReactor(SubscriberHub* hub, OperationContext ctx,
                      SubscriptionLimits limits, SubscriptionAccess access);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // Called through the channel (any thread).
  void Enqueue(std::shared_ptr<const HookEvent> event);
  void FinishOnce(const grpc::Status& status);

 private:
  class Channel;
  void Push(v1::SubscribeResponse message);

  // Constant after construction.
  SubscriberHub* const hub_;
  const OperationContext ctx_;
  const SubscriptionLimits limits_;
  const std::shared_ptr<Channel> channel_;
  SubscriptionAccess access_;

  // Only touched by reactions, which gRPC never runs concurrently for reads.
  v1::SubscribeRequest request_;
  uint64_t subscriber_id_ = 0;

  Mutex mu_;
  std::deque<v1::SubscribeResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_
