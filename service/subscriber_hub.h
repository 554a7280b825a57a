// File: subscriber_hub.h
// Remote registration hooks (SEMANTICS H1-H8): subscribers that approve,
// modify or reject registrations, decided after the in-process hooks.
//
// - Interceptors (mode kIntercept) run in (priority, subscription time)
//   order; each event goes through its own chain, and the chains of
//   different events run at the same time (an event waits only for its own
//   answers), so a build with many registrations costs about one round trip
//   per interceptor, not one per registration. Each slot's chain order, and
//   so the outcome, is the same as deciding one event at a time.
// - Each interceptor has a timeout and a failure policy: a timeout, a
//   disconnect or an invalid answer blocks (fail-closed) or approves
//   (fail-open). Nothing waits forever. An event's clock starts when it
//   becomes the subscriber's oldest unanswered event, so events pipelined
//   behind a slow but steady answerer do not time out for it. When the
//   oldest does time out, the subscriber is not answering: every event it
//   holds then fails with it (events sent later get their own timeout; a
//   reconnection under the same name starts the clock afresh for all).
// - An answer for an event the subscriber no longer holds (already
//   answered, timed out or failed) is late or a duplicate: recorded in the
//   audit log as "ignored", never enforced. An answer for an event it was
//   never sent is garbage and fails what the subscriber holds.
// - Stray answers (late, duplicate, or garbage when the subscriber holds
//   nothing to fail; a dry-run subscriber's duplicates and unknown ids)
//   change nothing, so a subscriber flooding them must not grow the audit
//   log by a record each: the first kStrayAnswersRecorded of a subscriber
//   name in an interval get their own records, the rest one summary per
//   name and interval (AuditAggregator), written when the interval ends,
//   when the subscriber leaves, and at StopStrayAnswers. The subscriber
//   stays connected: ending its stream would let later builds skip it.
// - Dry-run subscribers see every event; their answers are validated like
//   an interceptor's (an invalid one is recorded as "invalid") and recorded
//   in the audit log, but never enforced nor awaited. Observers get the final
//   outcome, never awaited.
// - A subscriber that reconnects under the same name takes its place back
//   in the order, and receives the events still waiting for it if it
//   reconnects as an interceptor. Back as a dry-run subscriber or an
//   observer, it is never awaited: what the interceptor held, and events
//   whose chain has yet to reach it, get its failure policy, as on a
//   disconnect. With authentication, a name belongs to the identity that
//   first used it.
// - A MODIFY re-initialising without a seed draws from ReinitSeed(request
//   seed, entry path), so the same build request gives the same values.
//
// The transport (a gRPC stream) implements SubscriberChannel; the hub knows
// nothing of gRPC.
//
// Example:
//   SubscriberHub hub(audit_log);
//   store.set_decider(&hub);
//   MODELSTATE_ASSIGN_OR_RETURN(uint64_t id, hub.Attach(spec, &channel, ctx));
//   ... channel.Send() delivers events; the transport calls
//   hub.Answer(id, answer) for each answer and hub.Detach(id) at the end.
#ifndef MODELSTATE_SERVICE_SUBSCRIBER_HUB_H_
#define MODELSTATE_SERVICE_SUBSCRIBER_HUB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/metrics.h"
#include "base/sync.h"
#include "core/hooks.h"
#include "nn/module_spec.h"
#include "service/audit_aggregator.h"
#include "service/audit_events.h"
#include "service/audit_log.h"
#include "service/limits.h"
#include "service/model_store.h"

namespace modelstate {

enum class SubscriberMode : uint8_t {
  kIntercept = 0,
  kObserve = 1,
  kDryRun = 2
};
enum class FailurePolicy : uint8_t { kFailClosed = 0, kFailOpen = 1 };
enum class Verdict : uint8_t { kApprove = 0, kModify = 1, kReject = 2 };

absl::string_view VerdictName(
    Verdict verdict);  // "approve", "modify", "reject"

// Which events a subscriber sees. Empty lists and globs select everything.
struct SubscriptionFilter {
  std::vector<EntryKind> kinds;
  std::vector<RegistrationAction> actions;
  std::vector<std::string> namespaces;
  std::string module_type_glob;  // * and ?
  std::string name_glob;
};

struct SubscriptionSpec {
  std::string name;  // unique among connected subscribers; 1-128 chars
  SubscriberMode mode = SubscriberMode::kIntercept;
  SubscriptionFilter filter;
  int32_t priority = 0;  // lower first
  // Per event; 0: the hub's default (Limits::subscriber_timeout).
  absl::Duration timeout = absl::ZeroDuration();
  FailurePolicy failure_policy = FailurePolicy::kFailClosed;
  bool include_data = false;
  uint64_t max_data_bytes = 1 << 20;  // larger tensors are sent without data
  // Namespaces this subscriber may see at all (set by the server from the
  // caller's identity; empty: every namespace).
  std::vector<std::string> visible_namespaces;
  // Namespaces whose subscribers this one may learn of: those the caller
  // may review or audit ("*": every namespace; set by the server from the
  // caller's identity). An earlier interceptor of a chain that may see a
  // namespace outside them is not named to this one, nor its reason given
  // (see HookEvent::chain), as ListSubscribers would not list it.
  std::vector<std::string> learns_of = {"*"};
  // Set by the server when callers are authenticated: the name is bound to
  // this identity for the hub's lifetime, so nobody else can take over a
  // subscriber's place (and its pending events). Empty: names are unbound.
  std::string owner_identity;
};

// The seed a re-initialise transform without its own seed draws from: the
// first 8 bytes (big-endian) of SHA-256("<request seed>:<entry path>"),
// where the entry path is the dotted path of the parameter or buffer (for
// example "encoder.0.weight").
uint64_t ReinitSeed(uint64_t request_seed, absl::string_view entry_path);

// The namespaces whose events subscriber `spec` may be sent: its filter's
// within its visible ones; {"*"} when any.
std::vector<std::string> NamespacesSeenBy(const SubscriptionSpec& spec);

// Whether a caller who may review or audit `namespaces` ("*": all) may learn
// of a subscriber that sees `seen` (NamespacesSeenBy): its name, filters and
// reasons. Only when they cover every namespace it sees, so one team's
// reviewers never learn what another team's (or an admin's) subscribers
// watch for. ListSubscribers lists by it; chains name by it.
bool MayLearnOf(const std::vector<std::string>& namespaces,
                const std::vector<std::string>& seen);

// What a chain step names instead of a subscriber its recipient may not
// learn of (never a valid subscriber name).
inline constexpr char kHiddenSubscriber[] = "(hidden)";

// What an earlier interceptor of the chain did.
struct ChainStep {
  // kHiddenSubscriber, with an empty reason, when the recipient may not
  // learn of it (SubscriptionSpec::learns_of); the verdict is always given.
  std::string subscriber;
  std::string
      verdict;  // "approve", "modify", "reject", "failed-open", "failed-closed"
  std::string reason;
};

// One event as a subscriber sees it.
struct HookEvent {
  uint64_t event_id = 0;
  std::string correlation_id;
  uint64_t call_id = 0;  // the request's OperationContext::call_id
  std::string identity;
  std::string ns;
  std::string module;
  std::string path;
  std::string module_type;
  EntryKind kind = EntryKind::kParameter;
  RegistrationAction action = RegistrationAction::kRegister;
  std::string name;
  // The value proposed (after the in-process hooks and the earlier
  // interceptors); undefined tensor / null module for unregistrations.
  SlotValue value;
  std::string value_sha256;    // content hash of value.tensor ("" if none)
  bool data_included = false;  // value.tensor's bytes are to be sent
  // What the earlier interceptors did, as this subscriber may learn of it
  // (the audit log records every step in full).
  std::vector<ChainStep> chain;
  // For observers: the final outcome. A reason that names a subscriber the
  // observer may not learn of names kHiddenSubscriber instead, without that
  // subscriber's own reason.
  bool is_outcome = false;
  HookResult::Kind outcome = HookResult::Kind::kKeep;
  std::string outcome_reason;
};

// A transform MODIFY asks for instead of a full replacement (H5).
struct Transform {
  std::optional<DType> cast;
  std::optional<Device> device;
  std::optional<bool> requires_grad;
  std::optional<bool> persistent;
  std::optional<InitSpec> reinit;  // zeros, ones, constant, uniform, normal
};

struct SubscriberAnswer {
  uint64_t event_id = 0;
  Verdict verdict = Verdict::kApprove;
  std::string reason;
  Tensor replacement;  // MODIFY with values
  // Parameters: whether the replacement requires grad (floating only);
  // unset: as the proposed parameter does.
  std::optional<bool> replacement_requires_grad;
  std::optional<Transform> transform;  // MODIFY with a transform
  // Set by the transport when the answer could not even be decoded (for
  // example a replacement tensor whose bytes do not match its shape): the
  // answer is invalid for this reason.
  std::string invalid;
};

// Delivers events to one subscriber. Send() may be called from any thread,
// never with the hub's lock held, and must not block or call back into the
// hub synchronously. The hub keeps its channels alive while it may still
// send; a channel whose stream is gone must drop what it is sent.
class SubscriberChannel {
 public:
  virtual ~SubscriberChannel() = default;
  virtual void Send(std::shared_ptr<const HookEvent> event) = 0;
  // The hub is done with this channel (replaced by a reconnection).
  virtual void Close(absl::Status status) = 0;
};

// What ReleaseName freed.
struct NameRelease {
  std::string owner;          // the identity it was bound to ("" if none)
  bool disconnected = false;  // a connected subscriber's stream was ended
};

struct SubscriberInfo {
  uint64_t id;
  SubscriptionSpec spec;
  uint64_t order;    // subscription time, kept across reconnections
  uint64_t pending;  // events waiting for this subscriber's answer
};

// Thread-safe.
class SubscriberHub : public RegistrationDecider {
 public:
  // `audit` (optional, not owned) receives every event, answer and outcome.
  // `default_timeout` is a subscriber's timeout when its spec leaves it 0.
  // Stray answers are counted over `stray_interval` (0: each gets its own
  // record), for at most `max_stray_keys` subscriber names apart.
  explicit SubscriberHub(
      AuditLog* audit = nullptr,
      absl::Duration default_timeout = Limits().subscriber_timeout,
      absl::Duration stray_interval = Limits().denied_audit_interval,
      size_t max_stray_keys = Limits().max_denied_keys);
  ~SubscriberHub() override;

  // Adds a subscriber (a timeout of 0 becomes the hub's default).
  // INVALID_ARGUMENT for a bad spec; PERMISSION_DENIED
  // when the name is bound to another identity (spec.owner_identity). A
  // connected subscriber with the same name is replaced: its channel is
  // closed with ABORTED and the events waiting for it go to the new one if
  // that is an interceptor; otherwise they get the old one's failure
  // policy, as on a disconnect.
  absl::StatusOr<uint64_t> Attach(SubscriptionSpec spec,
                                  std::shared_ptr<SubscriberChannel> channel,
                                  const OperationContext& ctx);
  // Binds subscriber names to the identities that own them, as the audit
  // log's subscribe and release records say (in log order), so that a
  // restart neither frees a name for another identity to take nor binds a
  // released one. Call once, before the first Attach; returns
  // how many names are bound.
  absl::StatusOr<size_t> RestoreNameOwners();
  // Frees subscriber name `name` (an admin's ReleaseSubscriberName), so
  // that any identity may take it next: NOT_FOUND when it is neither bound
  // nor connected; FAILED_PRECONDITION while a subscriber with that name is
  // connected, unless `force`, which ends its stream (ABORTED) and fails
  // the events it holds as a disconnect does. Recorded ("release") on disk
  // before it returns; RestoreNameOwners undoes the binding on replay.
  absl::StatusOr<NameRelease> ReleaseName(const std::string& name, bool force,
                                          const OperationContext& ctx);
  // The subscriber's stream ended: the events waiting for it get its
  // failure policy. Unknown ids are ignored.
  void Detach(uint64_t subscriber_id, const OperationContext& ctx);
  // Detach, then ends the subscriber's stream with `status` (its rights
  // were revoked). Unknown ids are ignored.
  void Disconnect(uint64_t subscriber_id, const absl::Status& status,
                  const OperationContext& ctx);
  // An answer from a subscriber. An invalid answer (a bad replacement, or
  // one the transport could not decode) fails the event it names; an answer
  // for an event never sent to it is garbage and fails every event it
  // holds; a late or duplicate one is only recorded.
  void Answer(uint64_t subscriber_id, SubscriberAnswer answer);

  std::vector<SubscriberInfo> List() const;

  // Closes every subscriber's channel with `status` (server shutdown).
  void CloseAll(const absl::Status& status);
  // Writes the stray answers counted so far and stops the interval's
  // thread (server shutdown, once no stream runs; idempotent). Stray
  // answers after it are still counted, and written at destruction.
  void StopStrayAnswers() { stray_.Stop(); }

  // Stray answers a subscriber name gets its own records for in an
  // interval before the rest are counted.
  static constexpr size_t kStrayAnswersRecorded = 8;

  // Where to count each interceptor answer's round trip and each event
  // that timed out, labelled by subscriber name (either may be null; not
  // owned). Call before the first Attach.
  void set_metrics(metrics::Family<metrics::Histogram>* round_trip_seconds,
                   metrics::Family<metrics::Counter>* timeouts_total) {
    round_trip_seconds_ = round_trip_seconds;
    timeouts_total_ = timeouts_total;
  }
  // Where to count stray answers (late, duplicate, unknown event id), by
  // subscriber name (null: not counted; not owned). Before the first Attach.
  void set_stray_answers_metric(metrics::Family<metrics::Counter>* total) {
    stray_answers_total_ = total;
  }
  // The most bytes of tensor data the dry runs that dry-run subscribers
  // have yet to answer may hold, all subscribers together, each run
  // counted once (they hold the proposed tensors, which outlive a deleted
  // module): past it, the oldest are forgotten and answers to them are
  // "unknown event id". Before the first Attach.
  void set_max_dry_run_bytes(uint64_t bytes) { max_dry_run_bytes_ = bytes; }

  // RegistrationDecider: the remote chains for `records`.
  std::vector<HookDecision> Decide(
      const OperationContext& ctx, const ModuleName& module,
      absl::Span<const RegistrationRecord> records) override;

 private:
  struct Subscriber;
  struct Pending;
  struct Round;
  using Sends = std::vector<std::pair<std::shared_ptr<SubscriberChannel>,
                                      std::shared_ptr<const HookEvent>>>;

  // A pending event for `rec` (already finished when the in-process hooks
  // blocked it), recorded in the audit log.
  std::unique_ptr<Pending> NewPendingLocked(const OperationContext& ctx,
                                            const ModuleName& module,
                                            const RegistrationRecord& rec,
                                            std::string sha256,
                                            size_t* remaining)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `p` on its way: its chain of `interceptors` (sorted), and a copy
  // to each dry-run subscriber that matches.
  void RouteLocked(Pending& p,
                   const std::vector<const Subscriber*>& interceptors,
                   Sends& sends) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `remaining` (the unfinished events of `events`) is 0,
  // failing the events whose subscribers time out. Releases mu_ while it
  // waits and while it delivers what timeouts send.
  void AwaitChainsLocked(const std::vector<std::unique_ptr<Pending>>& events,
                         const size_t& remaining)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the outcome of each of `events` and collects what observers are
  // sent; forgets dry-run events older than 10 minutes.
  void FinishEventsLocked(const OperationContext& ctx, const ModuleName& module,
                          const std::vector<std::unique_ptr<Pending>>& events,
                          Sends& sends) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `p` forward to its next interceptor (or finishes it); collects
  // the sends to do once the lock is released.
  void AdvanceLocked(Pending& p, Sends& sends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When `p` times out: an event its subscriber held when an earlier one
  // timed out already has (InfinitePast); otherwise only the subscriber's
  // oldest unanswered event has a deadline, the others none (yet).
  absl::Time DeadlineLocked(const Pending& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Pending& p, const Subscriber& s, absl::string_view why,
                  Sends& sends) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Pending& p, HookDecision decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct DryRun;
  void DryRunAnswerLocked(Subscriber& s, const SubscriberAnswer& answer,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `s` (a dry-run subscriber) is sent dry run `event_id`, holding `bytes`
  // of tensor data; the oldest runs (any subscriber's) are forgotten while
  // all of them hold more than max_dry_run_bytes_.
  void AwaitDryRunLocked(Subscriber& s, uint64_t event_id, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `s` answers dry run `event_id` no more (it answered, or the run is
  // forgotten); the run goes once no subscriber is left to answer it.
  void StopAwaitingLocked(Subscriber& s, uint64_t event_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ordered by event id: oldest first.
  using DryRuns = std::map<uint64_t, std::unique_ptr<DryRun>>;
  // Forgets `run` (its subscribers await it no more); the next one.
  DryRuns::iterator EraseDryRunLocked(DryRuns::iterator run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Subscriber `name` is gone: no dry run waits for its answer any more.
  void ForgetDryRunsLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<const HookEvent> EventFor(const Pending& p,
                                            const Subscriber& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Matches(const Subscriber& s, const HookEvent& e) const;
  static void Deliver(const Sends& sends);
  void Audit(AuditRecord record);
  // Records `facts`, a stray answer of `s` (one that changed nothing), in
  // bounded space (see stray_), and counts it.
  void StrayAnswerLocked(const Subscriber& s,
                         const audit_events::AnswerFacts& facts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `record` (its seq, to Sync once the lock is released): records
  // about names are appended under mu_, so that the log orders them as the
  // hub did, and a restart replays the same bindings.
  absl::StatusOr<uint64_t> AppendLocked(AuditRecord record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Syncs what AppendLocked returned (OK without an audit log).
  absl::Status SyncAppended(const absl::StatusOr<uint64_t>& seq);
  // Appends `record` and waits until it is on disk (subscribe and
  // unsubscribe records, written before the client hears of the change).
  absl::Status AuditDurably(AuditRecord record);

  AuditLog* const audit_;
  const absl::Duration default_timeout_;
  metrics::Family<metrics::Histogram>* round_trip_seconds_ = nullptr;
  metrics::Family<metrics::Counter>* timeouts_total_ = nullptr;
  metrics::Family<metrics::Counter>* stray_answers_total_ = nullptr;
  uint64_t max_dry_run_bytes_ = Limits().max_subscriber_queue_bytes;
  // Stray answers, keyed by subscriber name (its own lock; taken under mu_).
  AuditAggregator stray_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<uint64_t, std::unique_ptr<Subscriber>> subscribers_
      ABSL_GUARDED_BY(mu_);
  // Subscription order by name, kept after a subscriber leaves.
  absl::flat_hash_map<std::string, uint64_t> order_by_name_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Pending*> pending_ ABSL_GUARDED_BY(mu_);
  // Dry-run events whose answers are still welcome: until each dry-run
  // subscriber it went to has answered or gone, for 10 minutes at most,
  // and while all of them hold at most max_dry_run_bytes_ (dry_run_bytes_,
  // the sum of their DryRun::bytes).
  DryRuns dry_runs_ ABSL_GUARDED_BY(mu_);
  uint64_t dry_run_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Names bound to identities (SubscriptionSpec::owner_identity).
  absl::flat_hash_map<std::string, std::string> owner_by_name_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_subscriber_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_event_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_send_ ABSL_GUARDED_BY(mu_) = 1;  // orders a subscriber's queue
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_SUBSCRIBER_HUB_H_
