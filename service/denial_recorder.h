// File: denial_recorder.h
// Audits refused calls (PERMISSION_DENIED, UNAUTHENTICATED) in bounded
// space: a caller without valid credentials must not grow the audit log,
// which the server also keeps in memory, by one record per call.
//
// Refusals are counted per key: (peer address without its port, identity
// or "unauthenticated", rpc, namespace, module, error code and message).
// The first refusal of a key in an interval gets its own "denied" record
// at once (an attack shows at once, with its request id); the later ones
// of that interval are counted and written as one "denied" record with
// details.count (refusals after the first), .first and .last when the
// interval ends, and at Stop. At most `max_keys` keys are counted in one
// interval; refusals of further keys are counted in one "other" key
// (peer "*", no identity, namespace or rpc). So an interval writes at most
// 2 * max_keys + 2 records, and the table holds at most max_keys + 1 keys.
// The counting is AuditAggregator's, shared with the hub's stray answers.
//
// Example:
//   DenialRecorder denials(audit_log, absl::Seconds(60), 256);
//   denials.Record(ctx, "ipv4:10.0.0.7:51234", "GetModule", module, status);
//   ...
//   denials.Stop();  // the last counts are written
#ifndef MODELSTATE_SERVICE_DENIAL_RECORDER_H_
#define MODELSTATE_SERVICE_DENIAL_RECORDER_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "service/audit_aggregator.h"
#include "service/audit_events.h"
#include "service/audit_log.h"
#include "service/module_name.h"
#include "service/operation_context.h"

namespace modelstate {

// "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7", "ipv6:[::1]:5000" ->
// "ipv6:[::1]": a client's connections share its address, not its ports.
std::string PeerAddress(absl::string_view peer);

// Thread-safe.
class DenialRecorder {
 public:
  // `audit` (not owned, must outlive this) null: nothing is recorded.
  // `interval` 0: every refusal gets its own record (nothing is counted).
  DenialRecorder(AuditLog* audit, absl::Duration interval, size_t max_keys);
  // Stops (see Stop).
  ~DenialRecorder();
  DenialRecorder(const DenialRecorder&) = delete;
  DenialRecorder& operator=(const DenialRecorder&) = delete;

  // One refused call, from `peer`, by ctx.identity ("" before
  // authentication), with the request id ctx.correlation_id.
  void Record(const OperationContext& ctx, absl::string_view peer,
              absl::string_view rpc, const ModuleName& module,
              const absl::Status& status);
  // Like Record, but always its own record at once, never counted: for a
  // revocation of a call under way, which its caller is told of and must
  // find in the log (each tracked call is revoked at most once, so these
  // are bounded by the calls the server admits).
  void RecordRevocation(const OperationContext& ctx, absl::string_view peer,
                        absl::string_view rpc, const ModuleName& module,
                        const absl::Status& status);
  // Writes the counted refusals now and starts a new interval.
  void Flush();
  // Ends the interval thread and flushes (idempotent). Refusals recorded
  // later are still counted, and written by Flush or the destructor.
  void Stop();

 private:
  // Keyed by DenialKey; one own record per key and interval.
  AuditAggregator counts_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_DENIAL_RECORDER_H_
