// File: cluster_audit_watch.h
// WatchAudit with `cluster`: this replica's records and every other live
// replica's, fanned into one stream as each replica writes them. Each other
// replica's records come from a forwarded WatchAudit on a thread of its
// own; replicas that join while the watch runs are followed from the next
// relay_refresh. One write at a time; the first side to fail stops all.
//
// Example (a handler):
//   return WatchEveryReplica(*router_, context, *request, writer,
//       [&](const v1::WatchAuditRequest& own, const AuditSink& write,
//           const std::atomic<bool>* stop) {
//         return WatchOwnAudit(context, own, write, stop);
//       });
#ifndef MODELSTATE_SERVER_CLUSTER_AUDIT_WATCH_H_
#define MODELSTATE_SERVER_CLUSTER_AUDIT_WATCH_H_

#include <atomic>
#include <functional>

#include "grpcpp/grpcpp.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "server/cluster_router.h"

namespace modelstate::server {

// Where a watch's records go; false when the caller has gone.
using AuditSink = std::function<bool(v1::AuditRecordProto& record)>;

// This replica's own watch: runs until the call ends or `*stop` is set,
// writing each matching record to `write`.
using OwnAuditWatch = std::function<grpc::Status(
    const v1::WatchAuditRequest& request, const AuditSink& write,
    const std::atomic<bool>* stop)>;

// Runs `own` here and a forwarded watch at each other replica, each asked
// from its own entry of `request.after_seqs()`, and writes every record to
// `writer` naming its replica. Returns the first replica's failure (a
// replica whose watch ends is UNAVAILABLE, named), else `own`'s status.
grpc::Status WatchEveryReplica(ClusterRouter& router,
                               grpc::ServerContext* context,
                               const v1::WatchAuditRequest& request,
                               grpc::ServerWriter<v1::AuditRecordProto>* writer,
                               const OwnAuditWatch& own);

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_CLUSTER_AUDIT_WATCH_H_
