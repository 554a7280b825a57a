#include "server/subscription_relay.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/convert.h"

namespace modelstate::server {

namespace {

constexpr uint64_t kRelayedBit = uint64_t{1} << 63;
constexpr int kConnectionShift = 40;
constexpr uint64_t kOriginalMask = (uint64_t{1} << kConnectionShift) - 1;
constexpr uint64_t kMaxConnection = (uint64_t{1} << (63 - kConnectionShift));

// Whether a relayed subscription that ended with `code` should simply be
// opened again once its replica is live (it went away, or is restarting);
// anything else is the replica refusing the subscriber, who must hear it.
bool Reconnectable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct SubscriptionRelay::Upstream {
  std::string replica;
  uint64_t connection = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::ClientContext> call;
  // Set by its thread before the stream is opened, read by Answer.
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SubscribeRequest, v1::SubscribeResponse>>
      stream;
  std::thread thread;
  // Writes (the subscription, then answers) one at a time; none after the
  // stream has been finished.
  Mutex write_mu;
  bool closed ABSL_GUARDED_BY(write_mu) = false;
  // Guarded by the relay's mu_.
  bool acked = false;
  bool ended = false;
};

SubscriptionRelay::SubscriptionRelay(ClusterRouter* router,
                                     const grpc::ServerContextBase* context,
                                     absl::Duration refresh)
    : router_(router), context_(context), refresh_(refresh) {}

SubscriptionRelay::~SubscriptionRelay() { Stop(); }

absl::Status SubscriptionRelay::Start(const v1::Subscription& subscription,
                                      EventSink on_event,
                                      FailureSink on_failure,
                                      absl::Duration connect_timeout) {
  subscription_ = subscription;
  on_event_ = std::move(on_event);
  if (subscription.mode() == v1::Subscription::MODE_UNSPECIFIED ||
      subscription.mode() == v1::Subscription::MODE_INTERCEPT) {
    // Recorded first: a replica that joins from here on waits for this
    // subscriber's relay before it takes writes.
    std::shared_ptr<ClusterMember> member = router_->member();
    if (member == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "replica ", router_->replica(), " is still joining the cluster"));
    }
    MODELSTATE_RETURN_IF_ERROR(member->RecordSubscriber(subscription.name()));
    recorded_in_ = std::move(member);
  }
  std::vector<std::shared_ptr<Upstream>> opened = ConnectNew();
  const absl::Time deadline = absl::Now() + connect_timeout;
  MutexLock lock(&mu_);
  // Until every replica has answered (or the time is up), a refusal is
  // Start's to report; afterwards on_failure_'s.
  while (!failed_) {
    bool waiting = false;
    for (const auto& upstream : opened) {
      waiting = waiting || (!upstream->acked && !upstream->ended);
    }
    if (!waiting || changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (failed_) return failure_;
  on_failure_ = std::move(on_failure);
  refresher_ = std::thread([this] { RefreshLoop(); });
  return absl::OkStatus();
}

std::vector<std::shared_ptr<SubscriptionRelay::Upstream>>
SubscriptionRelay::ConnectNew() {
  // Not fatal: a member list that cannot be read now is read again in a
  // moment (module calls fail meanwhile too, etcd being out of reach).
  absl::StatusOr<std::vector<Peer>> peers = router_->OtherMembers();
  std::vector<std::shared_ptr<Upstream>> opened;
  if (!peers.ok()) return opened;
  MutexLock lock(&mu_);
  for (const Peer& peer : *peers) {
    if (stopping_ || failed_ || next_connection_ >= kMaxConnection) break;
    bool connected = false;
    for (const auto& entry : upstreams_) {
      connected = connected || entry.second->replica == peer.replica;
    }
    if (connected) continue;
    auto upstream = std::make_shared<Upstream>();
    upstream->replica = peer.replica;
    upstream->connection = next_connection_++;
    upstream->channel = peer.channel;
    upstream->call = router_->ForwardingContext(*context_);
    upstreams_[upstream->connection] = upstream;
    upstream->thread = std::thread([this, upstream] { RunUpstream(upstream); });
    opened.push_back(std::move(upstream));
  }
  return opened;
}

void SubscriptionRelay::RunUpstream(std::shared_ptr<Upstream> upstream) {
  v1::ModelStateService::Stub stub(upstream->channel);
  {
    MutexLock lock(&upstream->write_mu);
    upstream->stream = stub.Subscribe(upstream->call.get());
    v1::SubscribeRequest request;
    *request.mutable_subscription() = subscription_;
    upstream->stream->Write(request);
  }
  auto message = std::make_unique<v1::SubscribeResponse>();
  bool acked = upstream->stream->Read(message.get()) && message->has_ack();
  if (acked) {
    MutexLock lock(&mu_);
    upstream->acked = true;
    changed_.SignalAll();
  }
  // Events until the stream ends; no relay lock is held while one goes to
  // the subscriber.
  while (acked && upstream->stream->Read(message.get())) {
    if (!message->has_event()) continue;
    v1::HookEventProto* event = message->mutable_event();
    if (event->event_id() > kOriginalMask) continue;  // cannot be mapped
    event->set_event_id(kRelayedBit |
                        (upstream->connection << kConnectionShift) |
                        event->event_id());
    on_event_(std::move(message));
    message = std::make_unique<v1::SubscribeResponse>();
  }
  grpc::Status status;
  {
    MutexLock lock(&upstream->write_mu);
    upstream->closed = true;
    status = upstream->stream->Finish();
  }
  bool refused;
  {
    MutexLock lock(&mu_);
    upstream->ended = true;
    upstreams_.erase(upstream->connection);
    ended_.push_back(std::move(upstream->thread));
    changed_.SignalAll();
    refused = !stopping_ && !Reconnectable(status.error_code());
  }
  if (refused) {
    absl::Status refusal = convert::FromGrpcStatus(status);
    Fail(absl::Status(
        refusal.code(),
        absl::StrCat("replica ", upstream->replica, ": ", refusal.message())));
  }
}

void SubscriptionRelay::Answer(v1::HookAnswer answer) {
  const uint64_t id = answer.event_id();
  std::shared_ptr<Upstream> upstream;
  {
    MutexLock lock(&mu_);
    auto it = upstreams_.find((id & ~kRelayedBit) >> kConnectionShift);
    if (it == upstreams_.end()) return;
    upstream = it->second;
  }
  v1::SubscribeRequest request;
  *request.mutable_answer() = std::move(answer);
  request.mutable_answer()->set_event_id(id & kOriginalMask);
  MutexLock lock(&upstream->write_mu);
  if (!upstream->closed) upstream->stream->Write(request);
}

void SubscriptionRelay::RefreshLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time next = absl::Now() + refresh_;
      while (!stopping_ && !failed_ && !changed_.WaitWithDeadline(&mu_, next)) {
      }
      if (stopping_ || failed_) return;
    }
    JoinEnded();
    ConnectNew();
  }
}

void SubscriptionRelay::JoinEnded() {
  std::vector<std::thread> ended;
  {
    MutexLock lock(&mu_);
    ended.swap(ended_);
  }
  for (std::thread& thread : ended) thread.join();
}

void SubscriptionRelay::Fail(const absl::Status& status) {
  FailureSink sink;
  {
    MutexLock lock(&mu_);
    if (failed_ || stopping_) return;
    failed_ = true;
    failure_ = status;
    sink = on_failure_;
    changed_.SignalAll();
  }
  if (sink) sink(status);
}

void SubscriptionRelay::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& entry : upstreams_) entry.second->call->TryCancel();
    changed_.SignalAll();
  }
  if (refresher_.joinable()) refresher_.join();
  {
    MutexLock lock(&mu_);
    while (!upstreams_.empty()) changed_.Wait(&mu_);
  }
  JoinEnded();
  if (recorded_in_ != nullptr) {
    recorded_in_->ForgetSubscriber(subscription_.name());
    recorded_in_.reset();
  }
}

}  // namespace modelstate::server
