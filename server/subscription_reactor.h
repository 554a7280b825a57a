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
#include <optional>

#include "base/sync.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/auth.h"
#include "service/model_store.h"
#include "service/subscriber_hub.h"

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
  // StartWrite, then the Finish that another thread asked for meanwhile.
  void StartWriteThenAnyFinish(const v1::SubscribeResponse* message)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the stream finished and returns the status for the caller to pass
  // to Finish (with mu_ released), unless a thread is between deciding on a
  // write and starting it: no write may start after Finish, so the last such
  // thread finishes once its StartWrite has returned.
  std::optional<grpc::Status> FinishLocked(grpc::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  // Messages to write; the front one is being written while writing_. Only
  // OnWriteDone removes messages, so a pointer handed to StartWrite stays
  // valid until its write is done.
  std::deque<v1::SubscribeResponse> queue_ ABSL_GUARDED_BY(mu_);
  // A write is outstanding (at most one at a time).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Threads that have taken a message to write and not yet returned from
  // StartWrite: more than one when a write completes (and OnWriteDone takes
  // the next) before the thread that started it has returned.
  int starting_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // No more writes; Finish has been called, or is deferred_finish_.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_
