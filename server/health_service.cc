#include "server/health_service.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace modelstate::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using WatchReactor =
    AsyncWriterReactor<HealthCheckRequest, HealthCheckResponse>;

// One Watch stream: sends the status whenever it differs from the last one
// sent, and ends once the server is down and the client has been told.
class HealthService::Watcher final : public WatchReactor {
 public:
  Watcher(Call* call, HealthService* health)
      : WatchReactor(call),
        health_(health),
        known_(call->request()->service().empty()) {
    // Registered first, and only then started: Turn may come between the
    // two (from Shutdown, which holds health's lock and then takes ours).
    const bool added = health_->Add(this);
    MutexLock lock(&mu_);
    if (!added) down_ = true;
    started_ = true;
    Advance();
  }

  // The server is shutting down.
  void Turn() {
    MutexLock lock(&mu_);
    down_ = true;
    Advance();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
    Advance();
  }

  void OnCancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    Advance();
  }

  void OnDone() override {
    health_->Remove(this);
    delete this;
  }

 private:
  HealthCheckResponse::ServingStatus Current() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!known_) return HealthCheckResponse::SERVICE_UNKNOWN;
    return down_ ? HealthCheckResponse::NOT_SERVING
                 : HealthCheckResponse::SERVING;
  }

  // With no write in flight: writes the status if it changed, or ends the
  // stream once there is nothing more to say. gRPC completes operations
  // only on the queue's threads, never inside these calls, so they may be
  // made under the lock.
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!started_ || writing_ || finished_) return;
    if (cancelled_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
      return;
    }
    if (sent_ != Current()) {
      sent_ = Current();
      message_.set_status(*sent_);
      writing_ = true;
      StartWrite(&message_);
      return;
    }
    if (down_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  HealthService* const health_;
  const bool known_;  // the server itself ("") rather than another name
  Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<HealthCheckResponse::ServingStatus> sent_ ABSL_GUARDED_BY(mu_);
  HealthCheckResponse message_ ABSL_GUARDED_BY(mu_);  // being written
};

HealthService::~HealthService() = default;

void HealthService::ServeWatches(AsyncCallQueue* queue) {
  ServeStreams<WatchReactor>(
      queue,
      [this](WatchReactor::Call* call, grpc::ServerCompletionQueue* cq,
             void* tag) {
        RequestWatch(call->context(), call->request(), call->responder(), cq,
                     cq, tag);
      },
      [this](WatchReactor::Call* call) { return new Watcher(call, this); });
}

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (!request->service().empty()) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("service: unknown service '", request->service(),
                     "' (this server reports on \"\", itself, only)"));
  }
  MutexLock lock(&mu_);
  response->set_status(down_ ? HealthCheckResponse::NOT_SERVING
                             : HealthCheckResponse::SERVING);
  return grpc::Status::OK;
}

void HealthService::Shutdown() {
  MutexLock lock(&mu_);
  down_ = true;
  for (Watcher* watcher : watchers_) watcher->Turn();
}

bool HealthService::Add(Watcher* watcher) {
  MutexLock lock(&mu_);
  if (down_) return false;
  watchers_.insert(watcher);
  return true;
}

void HealthService::Remove(Watcher* watcher) {
  MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

}  // namespace modelstate::server
