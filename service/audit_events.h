// File: audit_events.h
// Every audit record the service writes, built in one place: the record
// types (AuditType, stored under the names below; the names are part of
// the format on disk and never change) and one builder per type, so that
// a type's record has the same fields wherever it is made.
//
//   build, register, load_state_dict, move, set_training, forward, delete
//       a change to a hosted module (ModelStore); outcome "ok", or "error"
//       with details.error = {code, message}
//   registration, answer, outcome
//       a remote hook's event, a subscriber's answer, the final decision
//       (SubscriberHub)
//   subscribe, unsubscribe   a subscriber came or went (SubscriberHub)
//   release                  an admin freed a subscriber name (SubscriberHub)
//   denied                   a refused call (AccessGate); or, with
//                            details.count, the refusals of one key counted
//                            over an interval (service/denial_recorder.h)
//   recovered, restore       start-up: a saved change the log had missed,
//                            a module that could not be restored
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       uint64_t seq, log->Append(audit_events::Delete(ctx, name, status)));
#ifndef MODELSTATE_SERVICE_AUDIT_EVENTS_H_
#define MODELSTATE_SERVICE_AUDIT_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/registration.h"
#include "nn/module_spec.h"
#include "service/audit_aggregator.h"
#include "service/audit_log.h"
#include "service/module_name.h"
#include "service/module_repository.h"
#include "service/operation_context.h"

namespace modelstate {

struct HookEvent;
struct SubscriptionSpec;

enum class AuditType {
  kBuild,
  kRegister,
  kLoadStateDict,
  kMove,
  kSetTraining,
  kForward,
  kDelete,
  kRegistration,
  kAnswer,
  kOutcome,
  kSubscribe,
  kUnsubscribe,
  kDenied,
  kRecovered,
  kRestore,
  kRelease,
  kMoveOut,
  kMoveIn,
  kSetAside,
};

// The stored name: "build", "register", "load_state_dict", ...
absl::string_view AuditTypeName(AuditType type);

namespace audit_events {

// --- Changes to a hosted module (ModelStore) ---------------------------
// The record holds the spec (SpecJson) when its text is at most
// kMaxRecordedSpecBytes, with modules nested more than 16 deep shown by
// their type alone (an audit record nests at most 64 levels), and the
// SHA-256 of the whole spec's text (SpecSha256) always.
AuditRecord Build(const OperationContext& ctx, const ModuleName& module,
                  const ModuleSpec& spec, const BuildOptions& options,
                  size_t registrations, size_t blocked, bool all_or_nothing,
                  const absl::Status& result);
inline constexpr size_t kMaxRecordedSpecBytes = 64 << 10;
// A spec as build records and attestations show it: a JSON object with
// the ModuleSpec's fields (empty ones left out; kwargs as an object; a
// tensor's explicit values as {"dtype", "shape", "sha256"} of its raw
// bytes), in its canonical text: compact, keys sorted. SpecSha256 is the
// lowercase hex SHA-256 of that text, so a holder of the spec's record, or
// of the same text, can check it.
std::string SpecJson(const ModuleSpec& spec);
std::string SpecSha256(const ModuleSpec& spec);
// `event` is the registration decided (null when it was refused before
// any: a quota); `removal` for RemoveEntry.
AuditRecord Register(const OperationContext& ctx, const ModuleName& module,
                     const std::string& path, const std::string& name,
                     const RegistrationEvent* event, bool removal,
                     const absl::Status& result);
// `keys`: the load's missing and unexpected keys, when it succeeded.
// `sha256`: what was loaded (core/state_digest.h StateSha256), when known.
AuditRecord LoadStateDict(const OperationContext& ctx, const ModuleName& module,
                          const LoadOptions& options,
                          const StateDict& state_dict,
                          const IncompatibleKeys* keys,
                          const absl::Status& result,
                          absl::string_view sha256 = {});
// `convert_all`: type(dtype), every tensor converted ("convert_all": true).
AuditRecord Move(const OperationContext& ctx, const ModuleName& module,
                 std::optional<Device> device, std::optional<DType> dtype,
                 bool convert_all, const absl::Status& result);
AuditRecord SetTraining(const OperationContext& ctx, const ModuleName& module,
                        bool training, const absl::Status& result);
// A training-mode forward (an eval-mode one changes nothing and is not
// recorded).
AuditRecord Forward(const OperationContext& ctx, const ModuleName& module,
                    const std::string& path, const absl::Status& result);
AuditRecord Delete(const OperationContext& ctx, const ModuleName& module,
                   const absl::Status& result);
// A cluster move: the old owner's record names where the module went, the
// new owner's where it came from; both carry the bytes of files moved.
AuditRecord MoveOut(const OperationContext& ctx, const ModuleName& module,
                    const std::string& to_replica, uint64_t bytes,
                    const absl::Status& result);
AuditRecord MoveIn(const OperationContext& ctx, const ModuleName& module,
                   const std::string& from_replica, uint64_t bytes,
                   const absl::Status& result);

// --- Remote hooks (SubscriberHub) ---------------------------------------
// An event as it enters the remote chain: `value` proposed (its content
// hash `sha256`) after the in-process hooks decided `in_process`.
AuditRecord Registration(const OperationContext& ctx, const ModuleName& module,
                         const HookEvent& event, const SlotValue& value,
                         const std::string& sha256,
                         HookResult::Kind in_process);

// One answer of a subscriber, or its failure to answer.
struct AnswerFacts {
  // The event answered, when known: whose request and which module.
  const HookEvent* event = nullptr;
  uint64_t event_id = 0;
  std::string subscriber;
  // A verdict's name, "invalid", "ignored", "failed-closed" or
  // "failed-open".
  std::string outcome;
  std::string reason;
  bool dry_run = false;
  std::string problem;  // why it is invalid or ignored; "" for none
  std::optional<double> latency_ms;
  // A valid MODIFY's value (with its content hash).
  const SlotValue* value = nullptr;
  std::string value_sha256;
};
AuditRecord Answer(const AnswerFacts& facts);

// A subscriber's stray answers (late, duplicate, or for events never sent
// to it; none of them changed anything) counted over an interval after
// its first few, which have their own Answer records: outcome "ignored",
// details.aggregated, .count, .kinds (problem -> count), .first_event_id,
// .last_event_id and .first, .last (times).
AuditRecord StrayAnswers(const std::string& subscriber,
                         const AuditTally& tally);

// The final decision on `event`; `sha256` is the hash of its value.
AuditRecord Outcome(const OperationContext& ctx, const ModuleName& module,
                    const HookEvent& event, const HookDecision& decision,
                    const std::string& sha256);
AuditRecord Subscribe(const OperationContext& ctx, const SubscriptionSpec& spec,
                      bool reconnected);
AuditRecord Unsubscribe(const OperationContext& ctx,
                        const std::string& subscriber);

// `subscriber`'s name, bound to `owner` ("" for none), freed by ctx's
// identity; `disconnected`: the subscriber connected under it was ended.
AuditRecord ReleaseName(const OperationContext& ctx,
                        const std::string& subscriber, const std::string& owner,
                        bool disconnected);

// --- Access and start-up -------------------------------------------------
AuditRecord Denied(const OperationContext& ctx, absl::string_view peer,
                   absl::string_view rpc, const ModuleName& module,
                   const absl::Status& status);
// Refusals of one key counted over an interval, after the first (which
// has its own Denied record): no correlation id, `peer` an address without
// its port; details.count, .first and .last (times), and .aggregated.
struct DeniedCount {
  std::string identity;  // "" for unauthenticated callers
  std::string peer;
  std::string rpc;
  ModuleName module;
  absl::Status status;
  uint64_t count = 0;
  absl::Time first;
  absl::Time last;
};
AuditRecord DeniedAggregate(const DeniedCount& denied);
// A change saved on disk (`note`) that the log had not recorded.
AuditRecord Recovered(const ModuleName& module, const ChangeNote& note);
AuditRecord RestoreFailed(const absl::Status& error);
// A copy of `module` found here at start-up that the cluster says
// `owner` holds (left by a move that crashed), moved to `path`.
AuditRecord SetAside(const ModuleName& module, const std::string& owner,
                     const std::string& path, const absl::Status& result);

}  // namespace audit_events
}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_EVENTS_H_
