// File: access_gate.h
// Who may call what: authenticates a call's credentials into a Caller and
// checks the caller's permissions, recording refusals in the audit log as
// "denied" records, counted per key and interval in bounded space
// (service/denial_recorder.h). Authorisation lives here and nowhere else;
// the service asks the gate before it acts.
//
// Who sees a denied record (AuditRecordVisible): a refusal in a namespace
// (a call on a module, or one asking for a namespace) carries that
// namespace, so the namespace's auditors see it; a refusal of no namespace
// (no or bad credentials, a call that needs a permission somewhere) is
// seen by admins and auditors of every namespace ("*") only.
//
// Example:
//   AccessGate gate(authenticator, audit_log, limits);
//   MODELSTATE_ASSIGN_OR_RETURN(Caller caller,
//                               gate.Authenticate(credentials, "GetModule"));
//   MODELSTATE_RETURN_IF_ERROR(
//       gate.Allow(caller, "GetModule", Permission::kRead, name));
#ifndef MODELSTATE_SERVICE_ACCESS_GATE_H_
#define MODELSTATE_SERVICE_ACCESS_GATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/access_policy.h"
#include "service/audit_log.h"
#include "service/authenticator.h"
#include "service/denial_recorder.h"
#include "service/limits.h"
#include "service/module_name.h"
#include "service/operation_context.h"

namespace modelstate {

// An authenticated caller and the context its changes are recorded with.
struct Caller {
  OperationContext ctx;  // identity: the principal's; the request's id
  Principal principal;
  std::string peer;
  // What the call presented, so that a stream can be authenticated again
  // after the token file is reloaded (StillAllows).
  Credentials credentials;
  // AccessGate::policy_generation() read before `principal` was looked up:
  // a stream whose caller's generation is not the current one asks
  // StillAllows.
  uint64_t policy_generation = 0;
};

// Thread-safe.
class AccessGate {
 public:
  // Neither is owned; both must outlive the gate. `auth` null: every caller
  // is an admin named after its peer. `audit` null: denials go unrecorded.
  // `limits`: how denials are counted (denied_audit_interval,
  // max_denied_keys).
  AccessGate(const Authenticator* auth, AuditLog* audit,
             const Limits& limits = Limits())
      : auth_(auth),
        audit_(audit),
        denials_(audit, limits.denied_audit_interval, limits.max_denied_keys) {}

  // Whether callers are authenticated (a token file is in force).
  bool authenticates() const { return auth_ != nullptr && auth_->enabled(); }

  // The caller, with the request id it sent (or a fresh one, unique across
  // restarts), or UNAUTHENTICATED / PERMISSION_DENIED, recorded.
  absl::StatusOr<Caller> Authenticate(const Credentials& credentials,
                                      absl::string_view rpc);

  // OK if the caller holds `permission` in `module`'s namespace (writes also
  // need a writable audit log, see AuditWritable); otherwise
  // PERMISSION_DENIED, recorded.
  absl::Status Allow(const Caller& caller, absl::string_view rpc,
                     Permission permission, const ModuleName& module);
  // Allow in namespace `ns`; "" asks for `permission` in some namespace.
  absl::Status AllowIn(const Caller& caller, absl::string_view rpc,
                       Permission permission, const std::string& ns);
  // OK if the caller is an admin of every namespace (calls about the
  // server as a whole); otherwise PERMISSION_DENIED, recorded.
  absl::Status AllowAdmin(const Caller& caller, absl::string_view rpc);
  // OK if the caller holds `permission` in some namespace (calls that then
  // show only what those namespaces allow); otherwise PERMISSION_DENIED,
  // recorded.
  absl::Status AllowSomewhere(const Caller& caller, absl::string_view rpc,
                              Permission permission);

  // For a stream opened by `caller` with `permission`, asked again once the
  // token file was reloaded (policy_generation moved): OK while its
  // credentials still name the same identity and that identity still holds
  // `permission` in every namespace it held it in when the stream opened.
  // Otherwise UNAUTHENTICATED (the token or certificate names no principal,
  // or another one) or PERMISSION_DENIED (a namespace was taken away),
  // recorded as Revoke records. A revoked token must not keep a subscription
  // that decides registrations, or an audit watch, running until it
  // disconnects.
  absl::Status StillAllows(const Caller& caller, absl::string_view rpc,
                           Permission permission);
  // StillAllows, and the principal it checked (the reloaded file's): for a
  // caller that goes on under that principal, so that what it keeps is
  // what was checked, whatever reload comes meanwhile.
  absl::StatusOr<Principal> StillAllowed(const Caller& caller,
                                         absl::string_view rpc,
                                         Permission permission);
  // For a transfer of `module` (GetStateDict, LoadStateDict) opened by
  // `caller`, or a build of it that waited for another (BuildModule),
  // asked again once the token file was reloaded: OK while its
  // credentials still name the same identity and it still holds
  // `permission` in the module's namespace (other namespaces it lost do
  // not matter to this transfer). Otherwise UNAUTHENTICATED or
  // PERMISSION_DENIED, recorded, as StillAllows.
  absl::Status StillAllowsIn(const Caller& caller, absl::string_view rpc,
                             Permission permission, const ModuleName& module);
  // A refusal decided but not yet recorded: the module it is recorded
  // under (none when the credentials no longer name the identity) and why.
  struct Refusal {
    ModuleName module;
    absl::Status status;
  };
  // StillAllowsIn's decision without its record: nullopt when allowed.
  // For callers that decide under a lock and record (Refuse) after it,
  // since recording appends to the audit log, which may sync to disk.
  std::optional<Refusal> StillAllowsInUnrecorded(
      const Caller& caller, absl::string_view rpc, Permission permission,
      const ModuleName& module) const;
  // Records `refusal` of a call already admitted, revoked by a reload, in
  // a record of its own at once (DenialRecorder::RecordRevocation), never
  // counted into an interval's total: a caller's parallel transfers,
  // subscriptions or audit watches revoked together each leave theirs, in
  // the log before the caller is told. Bounded by the calls the server
  // admits, as each is revoked once. Every Still* refusal is recorded so.
  void Revoke(const Caller& caller, absl::string_view rpc,
              const Refusal& refusal);
  // Revoke, then the refusal's status.
  absl::Status Refuse(const Caller& caller, absl::string_view rpc,
                      Refusal refusal);
  // The principal `caller`'s credentials name now, if it is still the
  // same identity; otherwise UNAUTHENTICATED, recorded. Without
  // authentication, `caller`'s own principal.
  absl::StatusOr<Principal> StillNamed(const Caller& caller,
                                       absl::string_view rpc);
  // Authenticator::generation(); 0 without authentication.
  uint64_t policy_generation() const {
    return auth_ != nullptr ? auth_->generation() : 0;
  }

  // UNAVAILABLE naming the audit log once an append or sync of it failed:
  // every change is refused rather than made unaudited.
  absl::Status AuditWritable() const;

  // Writes the denials counted so far and stops counting in intervals
  // (server shutdown; see DenialRecorder::Stop).
  void FlushDenials() { denials_.Stop(); }

 private:
  absl::Status Deny(const Caller& caller, absl::string_view rpc,
                    const ModuleName& module, absl::Status denied);
  // StillNamed's decision without its record.
  absl::StatusOr<Principal> NamedNow(const Caller& caller) const;
  const Authenticator* const auth_;
  AuditLog* const audit_;
  DenialRecorder denials_;
};

// Whether an auditor allowed `namespaces` (NamespacesFor(kAudit); {"*"}:
// all) may see `record`: records of no namespace need every namespace.
bool AuditRecordVisible(const std::vector<std::string>& namespaces,
                        const AuditRecord& record);

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_ACCESS_GATE_H_
