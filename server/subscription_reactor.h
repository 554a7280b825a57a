// File: subscription_reactor.h
// One Subscribe stream: a reactor (server/async_calls.h) that attaches the
// subscriber through its SubscriberSession (service/model_service.h, which
// admits it and talks to the hub), forwards its answers, and writes the
// hub's events to the stream, one write in flight at a time, from a queue
// bounded in events and in bytes (a subscriber that stops reading is
// disconnected rather than letting the server buffer without limit). The
// queue holds the hub's events, whose tensors share their bytes with the
// modules; only the message being written holds a copy.
//
// On a cluster member the reactor carries a SubscriptionRelay
// (server/subscription_relay.h): events of the other replicas join the same
// queue, and answers to them go back through the relay. The ack is the
// stream's first message and is sent once the relay has subscribed at every
// live member; events that come sooner wait behind it.
//
// Example:
//   return new SubscriptionReactor(call, service->OpenSubscription(caller),
//                                  service->limits());
#ifndef MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_
#define MODELSTATE_SERVER_SUBSCRIPTION_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include "base/sync.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "server/async_calls.h"
#include "server/metrics.h"
#include "server/subscription_relay.h"
#include "service/limits.h"
#include "service/model_service.h"
#include "service/subscriber_hub.h"

namespace modelstate::server {

// Deletes itself when the RPC is done (OnDone).
class SubscriptionReactor
    : public AsyncBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse> {
 public:
  // Serves `call`. `session` not OK: the call ends with its status at once (a
  // refusal, already audited). Uses limits.max_queued_events,
  // max_subscriber_queue_bytes and max_tensor_bytes. `replica` (cluster
  // members) names this replica in every event it sends; `relay` (a
  // subscriber's home replica) brings the other replicas' events.
  // `metrics` (optional) is told the bytes queued.
  SubscriptionReactor(
      Call* call, absl::StatusOr<std::unique_ptr<SubscriberSession>> session,
      const Limits& limits, ServerMetrics* metrics = nullptr,
      std::string replica = "",
      std::unique_ptr<SubscriptionRelay> relay = nullptr);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // Called through the channel (any thread).
  void Enqueue(std::shared_ptr<const HookEvent> event);
  void FinishOnce(const absl::Status& status);

 private:
  class Channel;
  // A message waiting to be written: built already (the ack), or an event
  // turned into one when its write starts.
  struct Queued {
    std::shared_ptr<const HookEvent> event;
    std::unique_ptr<v1::SubscribeResponse> message;
    uint64_t bytes = 0;  // what it holds, as counted against the bound
  };
  void Push(Queued queued);
  // The ack goes first, ahead of the events queued since the attach.
  void PushAck(uint64_t subscriber_id);
  // StartWrite of `queued`'s message (built now from its event if need
  // be), then the Finish that another thread asked for meanwhile.
  void StartWriteThenAnyFinish(Queued* queued) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the stream finished and returns the status for the caller to pass
  // to Finish (with mu_ released), unless a thread is between deciding on a
  // write and starting it: no write may start after Finish, so the last such
  // thread finishes once its StartWrite has returned.
  std::optional<grpc::Status> FinishLocked(grpc::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const size_t max_queued_events_;
  const uint64_t max_queue_bytes_;
  const uint64_t max_tensor_bytes_;
  const std::shared_ptr<Channel> channel_;
  ServerMetrics* const metrics_;
  const std::string replica_;

  // Only touched by reactions, which gRPC never runs concurrently for reads.
  std::unique_ptr<SubscriberSession> session_;  // null when refused
  std::unique_ptr<SubscriptionRelay> relay_;    // null but at a home
  v1::SubscribeRequest request_;
  bool attached_ = false;

  Mutex mu_;
  // Messages to write; the front one is being written while writing_. Only
  // OnWriteDone removes messages, so a pointer handed to StartWrite stays
  // valid until its write is done.
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // queued_bytes_, as the metrics see it (once attached).
  std::shared_ptr<std::atomic<uint64_t>> queued_gauge_ ABSL_GUARDED_BY(mu_);
  // The ack is queued: writes may start.
  bool acked_ ABSL_GUARDED_BY(mu_) = false;
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
