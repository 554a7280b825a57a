// File: subscriber.h
// The client side of Subscribe: opens the stream, declares the
// subscription, and answers each event with a handler, on a thread of its
// own, until stopped or the server ends the stream.
//
// Example:
//   v1::Subscription s;
//   s.set_name("no-temp-buffers");
//   MODELSTATE_ASSIGN_OR_RETURN(auto sub, Subscriber::Start(*client, s,
//       [](const v1::HookEventProto& e) {
//         v1::HookAnswer a;
//         a.set_event_id(e.event_id());
//         a.set_verdict(e.name() == "temp_buffer" ? v1::HookAnswer::REJECT
//                                                 : v1::HookAnswer::APPROVE);
//         return a;
//       }));
//   ...
//   sub->Stop();
#ifndef MODELSTATE_CLIENT_SUBSCRIBER_H_
#define MODELSTATE_CLIENT_SUBSCRIBER_H_

#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/sync.h"
#include "client/model_state_client.h"

namespace modelstate::client {

// Thread-safe.
class Subscriber {
 public:
  // Returns the answer to `event`; for outcome events (observers) the
  // answer is not sent. Runs on the subscriber's thread, one event at a
  // time, in arrival order.
  using Handler =
      std::function<v1::HookAnswer(const v1::HookEventProto& event)>;

  // Opens the stream and waits (up to the client's timeout) for the
  // server's acknowledgement; returns the server's error otherwise. The
  // stream itself has no deadline: it lasts until Stop().
  static absl::StatusOr<std::unique_ptr<Subscriber>> Start(
      ModelStateClient& client, const v1::Subscription& subscription,
      Handler handler);
  ~Subscriber();

  uint64_t id() const { return id_; }
  // Blocks until the stream ends; returns how it ended.
  absl::Status Wait();
  // Cancels the stream and waits for the thread.
  void Stop();
  // Ends the subscription cleanly and waits for the server to confirm it:
  // once this returns OK, no request sees this subscriber any more.
  absl::Status Unsubscribe();

 private:
  Subscriber() = default;
  void Run();

  Handler handler_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SubscribeRequest, v1::SubscribeResponse>>
      stream_;
  std::thread thread_;
  uint64_t id_ = 0;

  // One write at a time on the stream (answers, and the final WritesDone).
  Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  Mutex mu_;
  CondVar cv_;
  bool acked_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate::client

#endif  // MODELSTATE_CLIENT_SUBSCRIBER_H_
