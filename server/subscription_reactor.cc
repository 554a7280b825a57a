#include "server/subscription_reactor.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/service_convert.h"

namespace modelstate::server {

// The hub's handle on the stream. It outlives the reactor if the hub still
// holds it; once the reactor is done, what is sent is dropped.
class SubscriptionReactor::Channel : public SubscriberChannel {
 public:
  explicit Channel(SubscriptionReactor* reactor) : reactor_(reactor) {}

  void Send(std::shared_ptr<const HookEvent> event) override {
    MutexLock lock(&mu_);
    if (reactor_ != nullptr) reactor_->Enqueue(std::move(event));
  }
  void Close(absl::Status status) override {
    MutexLock lock(&mu_);
    if (reactor_ != nullptr) reactor_->FinishOnce(status);
  }
  // Called when the reactor is about to be deleted.
  void Disconnect() {
    MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  Mutex mu_;
  SubscriptionReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

SubscriptionReactor::SubscriptionReactor(
    Call* call, absl::StatusOr<std::unique_ptr<SubscriberSession>> session,
    const Limits& limits, ServerMetrics* metrics, std::string replica,
    std::unique_ptr<SubscriptionRelay> relay)
    : AsyncBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse>(call),
      max_queued_events_(limits.max_queued_events),
      max_queue_bytes_(limits.max_subscriber_queue_bytes),
      max_tensor_bytes_(limits.max_tensor_bytes),
      channel_(std::make_shared<Channel>(this)),
      metrics_(metrics),
      replica_(std::move(replica)),
      relay_(std::move(relay)) {
  if (!session.ok()) {
    FinishOnce(session.status());
    return;
  }
  session_ = *std::move(session);
  StartRead(&request_);
}

void SubscriptionReactor::OnReadDone(bool ok) {
  if (!ok && !attached_) {
    // Half-closed without a subscription, or its first message did not
    // parse (gRPC's reader does not say which): never a subscription.
    FinishOnce(absl::InvalidArgumentError(
        "subscription: no subscription could be read: the stream ended "
        "before it, or its first message is not a SubscribeRequest"));
    return;
  }
  if (!ok) {
    // The subscriber closed its side (or the call was cancelled). Detached
    // before the stream ends, so once the client sees the end, no request
    // waits for or is seen by this subscriber any more (nor, once their
    // relayed subscriptions have ended, at other replicas).
    if (relay_ != nullptr) relay_->Stop();
    session_->Detach();
    FinishOnce(absl::OkStatus());
    return;
  }
  if (!attached_) {
    if (request_.payload_case() != v1::SubscribeRequest::kSubscription) {
      FinishOnce(absl::InvalidArgumentError(
          "subscription: the first message must be a subscription"));
      return;
    }
    absl::StatusOr<SubscriptionSpec> spec =
        convert::SubscriptionFromProto(request_.subscription());
    absl::StatusOr<uint64_t> id =
        spec.ok() ? session_->Attach(*std::move(spec), channel_)
                  : spec.status();
    if (!id.ok()) {
      FinishOnce(id.status());
      return;
    }
    attached_ = true;
    if (relay_ != nullptr) {
      absl::Status relayed = relay_->Start(
          request_.subscription(),
          [this](std::unique_ptr<v1::SubscribeResponse> event) {
            Queued queued;
            queued.bytes = event->ByteSizeLong();
            queued.message = std::move(event);
            Push(std::move(queued));
          },
          [this](const absl::Status& status) { FinishOnce(status); });
      if (!relayed.ok()) {
        relay_->Stop();
        session_->Detach();
        FinishOnce(relayed);
        return;
      }
    }
    PushAck(*id);
  } else if (request_.payload_case() == v1::SubscribeRequest::kAnswer &&
             relay_ != nullptr &&
             SubscriptionRelay::IsRelayed(request_.answer().event_id())) {
    relay_->Answer(std::move(*request_.mutable_answer()));
  } else if (request_.payload_case() == v1::SubscribeRequest::kAnswer) {
    session_->Answer(
        convert::AnswerFromProto(request_.mutable_answer(), max_tensor_bytes_));
  } else {
    FinishOnce(absl::InvalidArgumentError(
        "answer: only answers may follow the subscription"));
    return;
  }
  StartRead(&request_);
}

namespace {

// What a queued event holds beyond what the hub holds anyway: its strings,
// and the bytes its message will copy (counted while queued, since the
// module may drop its tensor meanwhile and leave the event the only owner).
uint64_t QueuedBytes(const HookEvent& e) {
  uint64_t bytes = sizeof(HookEvent) + e.correlation_id.size() +
                   e.identity.size() + e.ns.size() + e.module.size() +
                   e.path.size() + e.module_type.size() + e.name.size() +
                   e.outcome_reason.size();
  for (const ChainStep& step : e.chain) {
    bytes += sizeof(ChainStep) + step.subscriber.size() + step.reason.size();
  }
  if (e.data_included && e.value.tensor.defined()) {
    bytes += e.value.tensor.nbytes();
  }
  return bytes;
}

}  // namespace

void SubscriptionReactor::Enqueue(std::shared_ptr<const HookEvent> event) {
  Queued queued;
  queued.bytes = QueuedBytes(*event);
  queued.event = std::move(event);
  Push(std::move(queued));
}

void SubscriptionReactor::Push(Queued queued) {
  Queued* start = nullptr;
  std::optional<grpc::Status> finish;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    if (queue_.size() >= max_queued_events_) {
      // Not reading its events: drop it rather than buffer without bound.
      finish = FinishLocked(
          convert::ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
              "subscriber is not reading its events: ", max_queued_events_,
              " are waiting (--max_queued_events)"))));
    } else if (!queue_.empty() &&
               queued_bytes_ + queued.bytes > max_queue_bytes_) {
      // One event always fits, however large: it alone is not buffering.
      finish = FinishLocked(convert::ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("subscriber is not reading its events: ", queued_bytes_,
                       " bytes are waiting and ", queued.bytes,
                       " more would exceed --max_subscriber_queue_mib (",
                       max_queue_bytes_, " bytes)"))));
    } else {
      queued_bytes_ += queued.bytes;
      if (queued_gauge_ != nullptr) queued_gauge_->store(queued_bytes_);
      queue_.push_back(std::move(queued));
      if (acked_ && !writing_) {
        writing_ = true;
        ++starting_writes_;
        start = &queue_.front();
      }
    }
  }
  if (start != nullptr) StartWriteThenAnyFinish(start);
  if (finish.has_value()) Finish(*std::move(finish));
}

void SubscriptionReactor::PushAck(uint64_t subscriber_id) {
  Queued ack;
  ack.message = std::make_unique<v1::SubscribeResponse>();
  ack.message->mutable_ack()->set_subscriber_id(subscriber_id);
  ack.bytes = sizeof(v1::SubscribeResponse);
  Queued* start = nullptr;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    acked_ = true;
    if (metrics_ != nullptr) {
      queued_gauge_ = metrics_->TrackQueue(request_.subscription().name());
    }
    // No write has started before the ack, so the front is free to take.
    queued_bytes_ += ack.bytes;
    if (queued_gauge_ != nullptr) queued_gauge_->store(queued_bytes_);
    queue_.push_front(std::move(ack));
    writing_ = true;
    ++starting_writes_;
    start = &queue_.front();
  }
  StartWriteThenAnyFinish(start);
}

void SubscriptionReactor::OnWriteDone(bool ok) {
  Queued* next = nullptr;
  Queued done;
  {
    MutexLock lock(&mu_);
    if (!queue_.empty()) {
      // Freed below, outside the lock: it may be a large copy.
      done = std::move(queue_.front());
      queued_bytes_ -= done.bytes;
      if (queued_gauge_ != nullptr) queued_gauge_->store(queued_bytes_);
      queue_.pop_front();
    }
    if (ok && !finished_ && !queue_.empty()) {
      ++starting_writes_;
      next = &queue_.front();
    } else {
      writing_ = false;
    }
  }
  if (next != nullptr) StartWriteThenAnyFinish(next);
}

void SubscriptionReactor::StartWriteThenAnyFinish(Queued* queued) {
  // `queued` stays valid: only OnWriteDone removes the front, and only once
  // this write is done. Nobody else touches its message.
  if (queued->message == nullptr) {
    queued->message = std::make_unique<v1::SubscribeResponse>();
    absl::Status converted =
        convert::EventToProto(*queued->event, queued->message->mutable_event());
    if (!converted.ok()) {
      // The values could not be read; send the event without them.
      queued->message->mutable_event()->clear_data();
    }
    if (!replica_.empty()) {
      v1::HookEventProto* event = queued->message->mutable_event();
      event->set_replica(replica_);
      event->set_replica_event_id(event->event_id());
    }
  }
  StartWrite(queued->message.get());
  std::optional<grpc::Status> finish;
  {
    MutexLock lock(&mu_);
    // The write just started may already be done, and OnWriteDone (on
    // another thread) be starting the next: the last starter finishes.
    if (--starting_writes_ == 0) {
      finish = std::exchange(deferred_finish_, std::nullopt);
    }
  }
  if (finish.has_value()) Finish(*std::move(finish));
}

std::optional<grpc::Status> SubscriptionReactor::FinishLocked(
    grpc::Status status) {
  if (finished_) return std::nullopt;
  finished_ = true;
  if (starting_writes_ > 0) {
    // That thread calls Finish once its StartWrite has returned.
    deferred_finish_ = std::move(status);
    return std::nullopt;
  }
  return status;
}

void SubscriptionReactor::FinishOnce(const absl::Status& status) {
  std::optional<grpc::Status> finish;
  {
    MutexLock lock(&mu_);
    finish = FinishLocked(convert::ToGrpcStatus(status));
  }
  if (finish.has_value()) Finish(*std::move(finish));
}

void SubscriptionReactor::OnDone() {
  if (relay_ != nullptr) relay_->Stop();  // its threads call Push
  channel_->Disconnect();
  session_.reset();  // detaches, and gives the stream slot back
  delete this;
}

}  // namespace modelstate::server
