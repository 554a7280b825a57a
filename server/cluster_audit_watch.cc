// File: cluster_audit_watch.cc
#include "server/cluster_audit_watch.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/sync.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "proto/convert.h"
#include "server/forwarding.h"

namespace modelstate::server {
namespace {

// The watch one replica runs for the cluster's: its own, from its own
// after_seq.
v1::WatchAuditRequest AtReplica(const v1::WatchAuditRequest& request,
                                const std::string& replica) {
  v1::WatchAuditRequest own = request;
  own.set_cluster(false);
  own.clear_after_seqs();
  auto after = request.after_seqs().find(replica);
  if (after != request.after_seqs().end()) own.set_after_seq(after->second);
  return own;
}

}  // namespace

grpc::Status WatchEveryReplica(ClusterRouter& router,
                               grpc::ServerContext* context,
                               const v1::WatchAuditRequest& request,
                               grpc::ServerWriter<v1::AuditRecordProto>* writer,
                               const OwnAuditWatch& own) {
  absl::StatusOr<std::vector<Peer>> first = router.OtherMembers();
  if (!first.ok()) return convert::ToGrpcStatus(first.status());
  Mutex mu;
  grpc::Status failure;  // guarded by mu
  std::atomic<bool> stop{false};
  absl::Notification stopped;
  auto writes_as = [&](const std::string& replica) -> AuditSink {
    return [&, replica](v1::AuditRecordProto& record) {
      record.set_replica(replica);
      MutexLock lock(&mu);
      return writer->Write(record);
    };
  };
  // Guarded by mu: who is watched, and how.
  std::set<std::string> watched;
  std::vector<std::unique_ptr<grpc::ClientContext>> calls;
  std::vector<std::thread> threads;
  auto follow = [&](const Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!watched.insert(peer.replica).second) return;
    calls.push_back(router.ForwardingContext(*context));
    threads.emplace_back([&, peer, call = calls.back().get(),
                          remote = AtReplica(request, peer.replica)] {
      Stub stub(peer.channel);
      std::unique_ptr<grpc::ClientReader<v1::AuditRecordProto>> reader =
          stub.WatchAudit(call, remote);
      AuditSink write = writes_as(peer.replica);
      v1::AuditRecordProto record;
      bool written = true;
      while (!stop.load() && written && reader->Read(&record)) {
        written = write(record);
      }
      const bool was_stopped = stop.exchange(true);
      call->TryCancel();
      grpc::Status status = reader->Finish();
      if (was_stopped || !written) return;
      if (status.ok()) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "its audit watch ended");
      }
      MutexLock lock(&mu);
      failure = FromReplica(peer.replica, status);
    });
  };
  {
    MutexLock lock(&mu);
    for (const Peer& peer : *first) follow(peer);
  }
  std::thread joiners([&] {
    while (!stopped.WaitForNotificationWithTimeout(router.relay_refresh())) {
      absl::StatusOr<std::vector<Peer>> now = router.OtherMembers();
      if (!now.ok()) continue;  // etcd away: try again
      MutexLock lock(&mu);
      for (const Peer& peer : *now) follow(peer);
    }
  });
  grpc::Status local = own(AtReplica(request, router.replica()),
                           writes_as(router.replica()), &stop);
  stop.store(true);
  stopped.Notify();
  joiners.join();
  {
    MutexLock lock(&mu);
    for (const auto& call : calls) call->TryCancel();
  }
  for (std::thread& thread : threads) thread.join();
  MutexLock lock(&mu);
  return failure.ok() ? local : failure;
}

}  // namespace modelstate::server
