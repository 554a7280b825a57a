#include "client/subscriber.h"

#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "proto/convert.h"

namespace modelstate::client {

absl::StatusOr<std::unique_ptr<Subscriber>> Subscriber::Start(
    ModelStateClient& client, const v1::Subscription& subscription,
    Handler handler) {
  std::unique_ptr<Subscriber> sub(new Subscriber());
  sub->handler_ = std::move(handler);
  // A subscription lasts until it is stopped: no deadline, but the
  // client's credentials.
  sub->context_ = client.NewContext(absl::InfiniteDuration());
  sub->stream_ = client.stub().Subscribe(sub->context_.get());
  v1::SubscribeRequest hello;
  *hello.mutable_subscription() = subscription;
  if (!sub->stream_->Write(hello)) {
    return convert::FromGrpcStatus(sub->stream_->Finish());
  }
  sub->thread_ = std::thread([s = sub.get()] { s->Run(); });
  absl::Status why;
  {
    MutexLock lock(&sub->mu_);
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!sub->acked_ && !sub->ended_) {
      if (sub->cv_.WaitWithDeadline(&sub->mu_, deadline)) break;
    }
    if (sub->acked_) return sub;
    why =
        !sub->ended_
            ? absl::DeadlineExceededError("no acknowledgement from the server")
        : sub->end_status_.ok()
            ? absl::UnavailableError("the server ended the subscription")
            : sub->end_status_;
  }
  sub->Stop();
  return why;
}

void Subscriber::Run() {
  v1::SubscribeResponse response;
  while (stream_->Read(&response)) {
    if (response.payload_case() == v1::SubscribeResponse::kAck) {
      MutexLock lock(&mu_);
      id_ = response.ack().subscriber_id();
      acked_ = true;
      cv_.SignalAll();
      continue;
    }
    if (response.payload_case() != v1::SubscribeResponse::kEvent) continue;
    const v1::HookEventProto& event = response.event();
    v1::HookAnswer answer = handler_(event);
    if (event.is_outcome()) continue;
    // Handlers usually leave the id to us.
    if (answer.event_id() == 0) answer.set_event_id(event.event_id());
    v1::SubscribeRequest request;
    *request.mutable_answer() = std::move(answer);
    MutexLock lock(&write_mu_);
    if (writes_done_) continue;  // unsubscribing: answers are no longer due
    if (!stream_->Write(request)) break;
  }
  absl::Status status = convert::FromGrpcStatus(stream_->Finish());
  MutexLock lock(&mu_);
  ended_ = true;
  end_status_ = status;
  cv_.SignalAll();
}

absl::Status Subscriber::Wait() {
  MutexLock lock(&mu_);
  while (!ended_) cv_.Wait(&mu_);
  return end_status_;
}

absl::Status Subscriber::Unsubscribe() {
  {
    MutexLock lock(&write_mu_);
    if (!writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  // The server detaches the subscriber before it ends the stream.
  absl::Status status = Wait();
  if (thread_.joinable()) thread_.join();
  return status;
}

void Subscriber::Stop() {
  if (context_ != nullptr) context_->TryCancel();
  if (thread_.joinable()) thread_.join();
}

Subscriber::~Subscriber() { Stop(); }

}  // namespace modelstate::client
