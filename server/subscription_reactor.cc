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
    absl::StatusOr<std::unique_ptr<SubscriberSession>> session,
    const Limits& limits)
    : max_queued_events_(limits.max_queued_events),
      max_tensor_bytes_(limits.max_tensor_bytes),
      channel_(std::make_shared<Channel>(this)) {
  if (!session.ok()) {
    FinishOnce(session.status());
    return;
  }
  session_ = *std::move(session);
  StartRead(&request_);
}

void SubscriptionReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The subscriber closed its side (or the call was cancelled). Detached
    // before the stream ends, so once the client sees the end, no request
    // waits for or is seen by this subscriber any more.
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
    v1::SubscribeResponse ack;
    ack.mutable_ack()->set_subscriber_id(*id);
    Push(std::move(ack));
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

void SubscriptionReactor::Enqueue(std::shared_ptr<const HookEvent> event) {
  v1::SubscribeResponse message;
  absl::Status converted =
      convert::EventToProto(*event, message.mutable_event());
  if (!converted.ok()) {
    // The values could not be read; send the event without them.
    message.mutable_event()->clear_data();
  }
  Push(std::move(message));
}

void SubscriptionReactor::Push(v1::SubscribeResponse message) {
  v1::SubscribeResponse* start = nullptr;
  std::optional<grpc::Status> finish;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    if (queue_.size() >= max_queued_events_) {
      // Not reading its events: drop it rather than buffer without bound.
      finish = FinishLocked(convert::ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("subscriber is not reading its events: ",
                       max_queued_events_, " are waiting"))));
    } else {
      queue_.push_back(std::move(message));
      if (!writing_) {
        writing_ = true;
        ++starting_writes_;
        start = &queue_.front();
      }
    }
  }
  if (start != nullptr) StartWriteThenAnyFinish(start);
  if (finish.has_value()) Finish(*std::move(finish));
}

void SubscriptionReactor::OnWriteDone(bool ok) {
  v1::SubscribeResponse* next = nullptr;
  {
    MutexLock lock(&mu_);
    if (!queue_.empty()) queue_.pop_front();
    if (ok && !finished_ && !queue_.empty()) {
      ++starting_writes_;
      next = &queue_.front();
    } else {
      writing_ = false;
    }
  }
  if (next != nullptr) StartWriteThenAnyFinish(next);
}

void SubscriptionReactor::StartWriteThenAnyFinish(
    const v1::SubscribeResponse* message) {
  // `message` stays valid: only OnWriteDone removes messages.
  StartWrite(message);
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
  channel_->Disconnect();
  session_.reset();  // detaches, and gives the stream slot back
  delete this;
}

}  // namespace modelstate::server
