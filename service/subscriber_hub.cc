#include "service/subscriber_hub.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/glob.h"
#include "base/quote.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "core/generator.h"
#include "core/init.h"
#include "nlohmann/json.hpp"
#include "service/audit_events.h"

namespace modelstate {

struct SubscriberHub::Subscriber {
  // Answers remembered for telling late or duplicate answers from garbage.
  static constexpr size_t kMaxSettled = 1 << 16;

  uint64_t id = 0;
  SubscriptionSpec spec;
  uint64_t order = 0;
  std::shared_ptr<SubscriberChannel> channel;
  // Events waiting for its answer, in the order they were sent (send number
  // -> event id), and the reverse index.
  std::map<uint64_t, uint64_t> queue;
  absl::flat_hash_map<uint64_t, uint64_t> holding;
  // When the oldest waiting event became the oldest: its timeout runs from
  // here, so an event queued behind a slow answer keeps its whole timeout.
  absl::Time oldest_since;
  // Events sent up to this send number were held when one timed out.
  uint64_t expired_through = 0;
  // Events it held and no longer holds, the most recent kMaxSettled.
  std::deque<uint64_t> settled_order;
  absl::flat_hash_set<uint64_t> settled;
  // Dry runs waiting for its answer (a dry-run subscriber's), oldest first:
  // event id -> the bytes of tensor data the run holds, and their sum.
  std::map<uint64_t, uint64_t> dry_awaiting;
  uint64_t dry_awaiting_bytes = 0;

  void Hold(uint64_t event_id, uint64_t send_number, absl::Time now) {
    if (queue.empty()) oldest_since = now;
    queue.emplace(send_number, event_id);
    holding.emplace(event_id, send_number);
  }
  // Stops waiting for `event_id`; false if it was not waiting for it.
  bool Release(uint64_t event_id, absl::Time now) {
    auto it = holding.find(event_id);
    if (it == holding.end()) return false;
    const bool was_oldest = queue.begin()->first == it->second;
    queue.erase(it->second);
    holding.erase(it);
    if (was_oldest) oldest_since = now;
    Settle(event_id);
    return true;
  }
  void Settle(uint64_t event_id) {
    if (!settled.insert(event_id).second) return;
    settled_order.push_back(event_id);
    if (settled_order.size() > kMaxSettled) {
      settled.erase(settled_order.front());
      settled_order.pop_front();
    }
  }
  // When waiting for `event_id` times out: only the oldest event's clock
  // runs, except for events held when an earlier one timed out, which have
  // timed out already.
  absl::Time DeadlineOf(uint64_t event_id) const {
    auto it = holding.find(event_id);
    if (it == holding.end()) return absl::InfiniteFuture();
    if (it->second <= expired_through) return absl::InfinitePast();
    if (queue.begin()->first != it->second) return absl::InfiniteFuture();
    return oldest_since + spec.timeout;
  }
  // `event_id` timed out. Its own timeout (not an earlier event's) shows the
  // subscriber is not answering: every event it holds now fails with it,
  // rather than each waiting a whole timeout in turn, which would hold a
  // 1,000-event build for 1,000 timeouts. Returns whether it was its own.
  bool TimeOut(uint64_t event_id, absl::Time now) {
    auto it = holding.find(event_id);
    const bool own = it != holding.end() && it->second > expired_through;
    if (own) expired_through = queue.rbegin()->first;
    Release(event_id, now);
    return own;
  }
  // Event ids waiting, oldest first.
  std::vector<uint64_t> Held() const {
    std::vector<uint64_t> ids;
    ids.reserve(queue.size());
    for (const auto& [number, event_id] : queue) ids.push_back(event_id);
    return ids;
  }
};

// A dry-run event: what its answers are validated against.
struct SubscriberHub::DryRun {
  // Without the submodule a module event proposes (a MODIFY of one is
  // invalid anyway): only its tensor's bytes are held.
  std::shared_ptr<const HookEvent> event;
  absl::Time sent_at;
  // The registration without its module (registration.module is null, so
  // that a run never keeps a deleted module alive): what a replacement's
  // shape is checked against instead.
  RegistrationEvent registration;
  bool fixed_shapes = false;
  std::string module_type;
  uint64_t request_seed = 0;
  uint64_t bytes = 0;  // of event->value.tensor's data
  // Dry-run subscribers (names) it went to that have not answered yet. Once
  // none is left, the run is forgotten: it holds the proposed tensor,
  // which a deleted module must not leave behind for ten minutes.
  absl::flat_hash_set<std::string> awaiting;
};

// One event on its way through its chain of interceptors.
struct SubscriberHub::Pending {
  uint64_t event_id = 0;
  uint64_t request_seed = 0;
  const RegistrationRecord* record = nullptr;
  HookEvent base;
  SlotValue value;  // current value
  std::string value_sha256;
  bool modified = false;
  std::vector<uint64_t> chain;  // subscription orders, in chain order
  absl::flat_hash_map<uint64_t, SubscriptionSpec> chain_specs;  // by order
  size_t stage = 0;
  std::vector<ChainStep> steps;
  // NamespacesSeenBy of each step's subscriber: who may learn of it.
  std::vector<std::vector<std::string>> step_seen;
  uint64_t waiting_on = 0;  // subscriber id, 0 when not sent
  absl::Time sent_at;
  bool done = false;
  HookDecision result;
  size_t* remaining = nullptr;  // the Decide call's count of unfinished events
};

namespace {

// A subscriber's reason travels into audit records (kept for good: the
// answer's and the outcome's), later interceptors' events, build reports
// and error texts, so only this much of it is kept.
constexpr size_t kMaxReasonBytes = 1 << 10;

// `reason`, or its start and a marker with its whole size when it is
// longer than kMaxReasonBytes (never cut inside a UTF-8 character).
std::string CappedReason(std::string reason) {
  if (reason.size() <= kMaxReasonBytes) return reason;
  const std::string marker = absl::StrCat("...[", reason.size(), " bytes]");
  size_t keep = kMaxReasonBytes - marker.size();
  // A UTF-8 continuation byte (10xxxxxx) would start a broken character.
  while (keep > 0 &&
         (static_cast<unsigned char>(reason[keep]) & 0xC0) == 0x80) {
    --keep;
  }
  reason.resize(keep);
  return absl::StrCat(reason, marker);
}

bool ValidSubscriberName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-' ||
              c == ':' || c == '@';
    if (!ok) return false;
  }
  return true;
}

// What an answer's record says before the answer is judged: its verdict.
audit_events::AnswerFacts AnswerFactsOf(const std::string& subscriber,
                                        const SubscriberAnswer& answer) {
  audit_events::AnswerFacts facts;
  facts.event_id = answer.event_id;
  facts.subscriber = subscriber;
  facts.outcome = std::string(VerdictName(answer.verdict));
  facts.reason = answer.reason;
  return facts;
}

// Why an interceptor's events fail when its name reconnects in `mode`
// (not kIntercept), whose answers are never awaited.
std::string NotInterceptingAnyMore(SubscriberMode mode) {
  return mode == SubscriberMode::kDryRun ? "reconnected as a dry-run subscriber"
                                         : "reconnected as an observer";
}

// Why an event ended in `result` (`modified` by an interceptor), as an
// observer whose view of its chain is `shown` (its steps, with the
// subscribers it may not learn of hidden) may learn: a reason that names
// such a subscriber (a reject, a failure closed, a modification) names
// kHiddenSubscriber instead, without the subscriber's own words.
std::string OutcomeReasonShown(const HookDecision& result, bool modified,
                               const std::vector<ChainStep>& shown) {
  if (shown.empty()) return result.reason;  // no subscriber decided
  const ChainStep& last = shown.back();
  if (result.blocked()) {
    // Only the last step blocks (a reject or a failure closed).
    if (last.subscriber != kHiddenSubscriber) return result.reason;
    if (last.verdict == "reject") {
      return absl::StrCat("rejected by ", kHiddenSubscriber);
    }
    return absl::StrCat("subscriber ", kHiddenSubscriber, " failed (",
                        last.verdict, ")");
  }
  if (!modified) return result.reason;
  std::vector<std::string> who;
  for (const ChainStep& step : shown) {
    if (step.verdict == "modify") who.push_back(step.subscriber);
  }
  return absl::StrCat("modified by ", absl::StrJoin(who, ", "));
}

std::string EntryPath(const RegistrationEvent& event) {
  return event.path.empty() ? event.name
                            : absl::StrCat(event.path, ".", event.name);
}

// The value a MODIFY answer asks for instead of `current`, validated
// (SEMANTICS H4, H5). `event` is the registration (its value unused).
absl::StatusOr<SlotValue> ModifiedValue(const RegistrationEvent& event,
                                        const SlotValue& current,
                                        const SubscriberAnswer& answer,
                                        uint64_t request_seed) {
  if (event.action == RegistrationAction::kUnregister) {
    return absl::InvalidArgumentError(
        "MODIFY is not allowed on an unregister event");
  }
  if (event.kind == EntryKind::kModule) {
    return absl::InvalidArgumentError(
        "a submodule registration can only be approved or rejected");
  }
  SlotValue candidate = current;
  if (answer.replacement.defined()) {
    if (answer.transform.has_value()) {
      return absl::InvalidArgumentError(
          "MODIFY carries either a replacement tensor or a transform, not "
          "both");
    }
    candidate.tensor = answer.replacement;
    if (event.kind == EntryKind::kParameter) {
      // Asked for explicitly, requires_grad on an integer tensor is invalid
      // (torch: "Only Tensors of floating point ... can require
      // gradients"); only the proposed parameter's flag is dropped quietly.
      if (answer.replacement_requires_grad.value_or(false) &&
          !IsFloatingPoint(answer.replacement.dtype())) {
        return absl::InvalidArgumentError(
            absl::StrCat("requires_grad needs a floating point dtype, not ",
                         DTypeName(answer.replacement.dtype())));
      }
      MODELSTATE_ASSIGN_OR_RETURN(
          candidate.tensor,
          MakeParameter(answer.replacement,
                        answer.replacement_requires_grad.value_or(
                            current.tensor.requires_grad()) &&
                            IsFloatingPoint(answer.replacement.dtype())));
    }
  } else if (answer.transform.has_value()) {
    const Transform& t = *answer.transform;
    Tensor tensor = current.tensor;
    if (t.reinit.has_value()) {
      MODELSTATE_ASSIGN_OR_RETURN(tensor, tensor.Clone());
      Generator gen(t.reinit->seed.has_value()
                        ? *t.reinit->seed
                        : ReinitSeed(request_seed, EntryPath(event)));
      const InitSpec& init = *t.reinit;
      switch (init.kind) {
        case InitSpec::Kind::kZeros:
          MODELSTATE_RETURN_IF_ERROR(ConstantInit(tensor, 0.0));
          break;
        case InitSpec::Kind::kOnes:
          MODELSTATE_RETURN_IF_ERROR(ConstantInit(tensor, 1.0));
          break;
        case InitSpec::Kind::kConstant:
          MODELSTATE_RETURN_IF_ERROR(ConstantInit(tensor, init.a));
          break;
        case InitSpec::Kind::kUniform:
          MODELSTATE_RETURN_IF_ERROR(UniformInit(tensor, init.a, init.b, gen));
          break;
        case InitSpec::Kind::kNormal:
          MODELSTATE_RETURN_IF_ERROR(NormalInit(tensor, init.a, init.b, gen));
          break;
        default:
          return absl::InvalidArgumentError(
              "reinit supports zeros, ones, constant, uniform and normal");
      }
    }
    if (t.cast.has_value() || t.device.has_value()) {
      if (t.cast.has_value() &&
          IsFloatingPoint(tensor.dtype()) != IsFloatingPoint(*t.cast)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot cast ", DTypeName(tensor.dtype()), " to ",
                         DTypeName(*t.cast)));
      }
      MODELSTATE_ASSIGN_OR_RETURN(tensor,
                                  tensor.To(t.device.value_or(tensor.device()),
                                            t.cast.value_or(tensor.dtype())));
    }
    // A fresh tensor object, so that the proposed one is never changed.
    Tensor fresh = tensor.is_same(current.tensor) ? tensor.Detach() : tensor;
    if (event.kind == EntryKind::kParameter) {
      if (t.requires_grad.value_or(false) && !IsFloatingPoint(fresh.dtype())) {
        return absl::InvalidArgumentError(
            absl::StrCat("set_requires_grad(true) needs a floating point "
                         "dtype, not ",
                         DTypeName(fresh.dtype())));
      }
      bool rg = t.requires_grad.value_or(current.tensor.requires_grad());
      if (rg && !IsFloatingPoint(fresh.dtype())) rg = false;
      MODELSTATE_ASSIGN_OR_RETURN(fresh, MakeParameter(fresh, rg));
    } else if (t.requires_grad.has_value()) {
      return absl::InvalidArgumentError(
          "set_requires_grad applies to parameters only");
    }
    if (t.persistent.has_value()) {
      if (event.kind != EntryKind::kBuffer) {
        return absl::InvalidArgumentError(
            "set_persistent applies to buffers only");
      }
      candidate.persistent = *t.persistent;
    }
    candidate.tensor = fresh;
  } else {
    return absl::InvalidArgumentError(
        "MODIFY needs a replacement tensor or a transform");
  }
  RegistrationEvent proposed = event;
  proposed.value = current;
  MODELSTATE_ASSIGN_OR_RETURN(candidate,
                              NormalizeReplacement(proposed, candidate));
  MODELSTATE_RETURN_IF_ERROR(ValidateReplacement(proposed, candidate));
  return candidate;
}

}  // namespace

uint64_t ReinitSeed(uint64_t request_seed, absl::string_view entry_path) {
  const std::string digest =
      Sha256Hex(absl::StrCat(request_seed, ":", entry_path));
  uint64_t seed = 0;
  // 16 hex digits: the first 8 bytes, big-endian.
  for (size_t i = 0; i < 16; ++i) {
    const char c = digest[i];
    seed =
        (seed << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return seed;
}

absl::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kApprove:
      return "approve";
    case Verdict::kModify:
      return "modify";
    case Verdict::kReject:
      return "reject";
  }
  return "approve";
}

SubscriberHub::SubscriberHub(AuditLog* audit, absl::Duration default_timeout,
                             absl::Duration stray_interval,
                             size_t max_stray_keys)
    : audit_(audit),
      default_timeout_(default_timeout),
      stray_(audit, stray_interval, max_stray_keys, kStrayAnswersRecorded,
             [](const AuditTally& tally) {
               // The names beyond max_stray_keys, counted together.
               return audit_events::StrayAnswers("*", tally);
             }) {}
SubscriberHub::~SubscriberHub() = default;

namespace {

// Every record of `type` in `audit`, in seq order.
absl::StatusOr<std::vector<AuditRecord>> RecordsOfType(const AuditLog& audit,
                                                       AuditType type) {
  AuditQuery query;
  query.type = std::string(AuditTypeName(type));
  query.limit = AuditQuery::kMaxLimit;
  std::vector<AuditRecord> all;
  while (true) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> page,
                                audit.Query(query));
    if (page.empty()) return all;
    query.after_seq = page.back().seq;
    for (AuditRecord& r : page) all.push_back(std::move(r));
  }
}

// A string field of a record's details ("" when absent).
std::string DetailOf(const AuditRecord& r, const char* field) {
  nlohmann::json details =
      nlohmann::json::parse(r.details_json, nullptr, false);
  if (!details.is_object()) return "";
  auto it = details.find(field);
  return it != details.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

absl::StatusOr<size_t> SubscriberHub::RestoreNameOwners() {
  if (audit_ == nullptr) return 0;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> subscribes,
                              RecordsOfType(*audit_, AuditType::kSubscribe));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> releases,
                              RecordsOfType(*audit_, AuditType::kRelease));
  MutexLock lock(&mu_);
  // Both in seq order: replayed merged, as they happened.
  auto release = releases.begin();
  for (const AuditRecord& r : subscribes) {
    for (; release != releases.end() && release->seq < r.seq; ++release) {
      owner_by_name_.erase(DetailOf(*release, "subscriber"));
    }
    const std::string name = DetailOf(r, "subscriber");
    const std::string owner = DetailOf(r, "owner");
    // No owner: made without authentication. The first identity to use a
    // name owns it, as in Attach.
    if (!name.empty() && !owner.empty())
      owner_by_name_.try_emplace(name, owner);
  }
  for (; release != releases.end(); ++release) {
    owner_by_name_.erase(DetailOf(*release, "subscriber"));
  }
  return owner_by_name_.size();
}

void SubscriberHub::Audit(AuditRecord record) {
  if (audit_ == nullptr) return;
  // A failed audit append is reported by the operation's final Sync.
  audit_->Append(std::move(record)).IgnoreError();
}

void SubscriberHub::StrayAnswerLocked(const Subscriber& s,
                                      const audit_events::AnswerFacts& facts) {
  if (stray_answers_total_ != nullptr) {
    stray_answers_total_->Labels({s.spec.name}).Increment();
  }
  const std::string& name = s.spec.name;
  stray_.Record(
      {.key = name, .kind = facts.problem, .id = facts.event_id},
      [&] { return audit_events::Answer(facts); },
      [&]() -> AuditAggregator::Summarise {
        return [name](const AuditTally& tally) {
          return audit_events::StrayAnswers(name, tally);
        };
      });
}

absl::StatusOr<uint64_t> SubscriberHub::AppendLocked(AuditRecord record) {
  if (audit_ == nullptr) return 0;
  return audit_->Append(std::move(record));
}

absl::Status SubscriberHub::SyncAppended(const absl::StatusOr<uint64_t>& seq) {
  if (audit_ == nullptr) return absl::OkStatus();
  MODELSTATE_RETURN_IF_ERROR(seq.status());
  return audit_->Sync(*seq);
}

absl::Status SubscriberHub::AuditDurably(AuditRecord record) {
  if (audit_ == nullptr) return absl::OkStatus();
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t seq, audit_->Append(std::move(record)));
  return audit_->Sync(seq);
}

absl::StatusOr<uint64_t> SubscriberHub::Attach(
    SubscriptionSpec spec, std::shared_ptr<SubscriberChannel> channel,
    const OperationContext& ctx) {
  if (!ValidSubscriberName(spec.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: ", Quote(spec.name),
        " is not a valid subscriber name (1-128 of [A-Za-z0-9_.:@-])"));
  }
  if (spec.timeout == absl::ZeroDuration()) spec.timeout = default_timeout_;
  if (spec.timeout <= absl::ZeroDuration() || spec.timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        "timeout: must be more than 0 and at most 1 hour");
  }
  Sends sends;
  std::shared_ptr<SubscriberChannel> replaced;
  uint64_t id;
  absl::StatusOr<uint64_t> appended;
  {
    MutexLock lock(&mu_);
    if (!spec.owner_identity.empty()) {
      auto [owner, first] =
          owner_by_name_.try_emplace(spec.name, spec.owner_identity);
      if (!first && owner->second != spec.owner_identity) {
        // The owner is named only to a caller that may learn of the
        // subscriber (as ListSubscribers lists it); to others the name
        // would otherwise tell who watches which namespaces. A name bound
        // with no subscriber connected shows none of its namespaces, so
        // only a caller who may learn of every subscriber is told its owner.
        const Subscriber* holder = nullptr;
        for (const auto& entry : subscribers_) {
          if (entry.second->spec.name == spec.name) holder = entry.second.get();
        }
        const bool may_learn =
            holder != nullptr
                ? MayLearnOf(spec.learns_of, NamespacesSeenBy(holder->spec))
                : MayLearnOf(spec.learns_of, {"*"});
        if (!may_learn) {
          return absl::PermissionDeniedError(
              absl::StrCat("name: subscriber '", spec.name,
                           "' is taken by another identity; '",
                           spec.owner_identity, "' may not take its place"));
        }
        return absl::PermissionDeniedError(absl::StrCat(
            "name: subscriber '", spec.name, "' belongs to '", owner->second,
            "'; '", spec.owner_identity, "' may not take its place"));
      }
    }
    id = next_subscriber_id_++;
    auto known = order_by_name_.find(spec.name);
    uint64_t order =
        known != order_by_name_.end() ? known->second : next_order_++;
    order_by_name_[spec.name] = order;
    auto sub = std::make_unique<Subscriber>();
    sub->id = id;
    sub->spec = spec;
    sub->order = order;
    sub->channel = channel;
    // A connected subscriber of the same name is replaced. What it held
    // goes to the new connection if that is an interceptor, which starts
    // the oldest event's clock afresh. A dry-run subscriber or an observer
    // is never awaited: for what the old one held, it went away.
    const absl::Time now = absl::Now();
    for (auto it = subscribers_.begin(); it != subscribers_.end(); ++it) {
      Subscriber& old = *it->second;
      if (old.spec.name != spec.name) continue;
      replaced = old.channel;
      for (uint64_t event_id : old.Held()) {
        auto p = pending_.find(event_id);
        if (p == pending_.end()) continue;
        if (spec.mode != SubscriberMode::kIntercept) {
          old.Release(event_id, now);
          FailLocked(*p->second, old, NotInterceptingAnyMore(spec.mode), sends);
          continue;
        }
        p->second->waiting_on = id;
        sub->Hold(event_id, next_send_++, now);
        sends.emplace_back(channel, EventFor(*p->second, *sub));
      }
      // Back in another mode, it answers no dry run of the old one's;
      // back as a dry-run subscriber, it may answer them all.
      if (old.spec.mode == SubscriberMode::kDryRun &&
          spec.mode != SubscriberMode::kDryRun) {
        ForgetDryRunsLocked(spec.name);
      } else if (old.spec.mode == SubscriberMode::kDryRun) {
        sub->dry_awaiting = std::move(old.dry_awaiting);
        sub->dry_awaiting_bytes = old.dry_awaiting_bytes;
      }
      cv_.SignalAll();
      // Its answers to what the old connection settled are late, not
      // garbage.
      sub->settled = std::move(old.settled);
      sub->settled_order = std::move(old.settled_order);
      subscribers_.erase(it);
      break;
    }
    subscribers_.emplace(id, std::move(sub));
    appended =
        AppendLocked(audit_events::Subscribe(ctx, spec, replaced != nullptr));
  }
  if (replaced != nullptr) {
    replaced->Close(absl::AbortedError(absl::StrCat(
        "subscriber '", spec.name, "' reconnected on another stream")));
  }
  Deliver(sends);
  // On disk before the subscriber is acknowledged; a subscription that
  // cannot be recorded does not stand.
  if (absl::Status recorded = SyncAppended(appended); !recorded.ok()) {
    Detach(id, ctx);
    return absl::UnavailableError(
        absl::StrCat("the subscription could not be recorded in the audit "
                     "log: ",
                     recorded.message()));
  }
  return id;
}

void SubscriberHub::Detach(uint64_t subscriber_id,
                           const OperationContext& ctx) {
  Sends sends;
  std::string name;
  {
    MutexLock lock(&mu_);
    auto it = subscribers_.find(subscriber_id);
    if (it == subscribers_.end()) return;
    std::unique_ptr<Subscriber> sub = std::move(it->second);
    subscribers_.erase(it);
    name = sub->spec.name;
    for (uint64_t event_id : sub->Held()) {
      auto p = pending_.find(event_id);
      if (p != pending_.end()) {
        FailLocked(*p->second, *sub, "disconnected", sends);
      }
    }
    ForgetDryRunsLocked(name);
    cv_.SignalAll();
  }
  Deliver(sends);
  // Its stray answers counted so far are written before it is gone.
  stray_.FlushKey(name);
  // On disk before the stream ends. A failure needs no answer here: it
  // stays in the log's health, and the server refuses later changes.
  AuditDurably(audit_events::Unsubscribe(ctx, name)).IgnoreError();
}

void SubscriberHub::Disconnect(uint64_t subscriber_id,
                               const absl::Status& status,
                               const OperationContext& ctx) {
  std::shared_ptr<SubscriberChannel> channel;
  {
    MutexLock lock(&mu_);
    auto it = subscribers_.find(subscriber_id);
    if (it == subscribers_.end()) return;
    channel = it->second->channel;
  }
  Detach(subscriber_id, ctx);
  channel->Close(status);
}

absl::StatusOr<NameRelease> SubscriberHub::ReleaseName(
    const std::string& name, bool force, const OperationContext& ctx) {
  NameRelease release;
  Sends sends;
  std::shared_ptr<SubscriberChannel> ended;
  absl::StatusOr<uint64_t> appended;
  {
    MutexLock lock(&mu_);
    auto owner = owner_by_name_.find(name);
    auto connected = std::find_if(
        subscribers_.begin(), subscribers_.end(),
        [&](const auto& entry) { return entry.second->spec.name == name; });
    if (owner == owner_by_name_.end() && connected == subscribers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("name: no subscriber name ", Quote(name), " is bound"));
    }
    if (connected != subscribers_.end() && !force) {
      return absl::FailedPreconditionError(absl::StrCat(
          "subscriber '", name,
          "' is connected: set force to end its stream and release it"));
    }
    if (owner != owner_by_name_.end()) {
      release.owner = owner->second;
      owner_by_name_.erase(owner);
    }
    if (connected != subscribers_.end()) {
      std::unique_ptr<Subscriber> sub = std::move(connected->second);
      subscribers_.erase(connected);
      for (uint64_t event_id : sub->Held()) {
        auto p = pending_.find(event_id);
        if (p != pending_.end()) {
          FailLocked(*p->second, *sub, "disconnected", sends);
        }
      }
      ForgetDryRunsLocked(name);
      stray_.FlushKey(name);
      ended = sub->channel;
      release.disconnected = true;
      cv_.SignalAll();
    }
    // A released name starts afresh, at the end of the order too.
    order_by_name_.erase(name);
    appended = AppendLocked(audit_events::ReleaseName(ctx, name, release.owner,
                                                      release.disconnected));
  }
  if (ended != nullptr) {
    ended->Close(absl::AbortedError(absl::StrCat(
        "subscriber name '", name, "' was released by '", ctx.identity, "'")));
  }
  Deliver(sends);
  MODELSTATE_RETURN_IF_ERROR(SyncAppended(appended));
  return release;
}

void SubscriberHub::CloseAll(const absl::Status& status) {
  std::vector<std::shared_ptr<SubscriberChannel>> channels;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, sub] : subscribers_) channels.push_back(sub->channel);
  }
  for (const auto& channel : channels) channel->Close(status);
}

std::vector<SubscriberInfo> SubscriberHub::List() const {
  MutexLock lock(&mu_);
  std::vector<SubscriberInfo> out;
  for (const auto& [id, sub] : subscribers_) {
    out.push_back(
        SubscriberInfo{id, sub->spec, sub->order, sub->holding.size()});
  }
  return out;
}

std::vector<std::string> NamespacesSeenBy(const SubscriptionSpec& spec) {
  const std::vector<std::string>& visible = spec.visible_namespaces;
  if (spec.filter.namespaces.empty()) {
    return visible.empty() ? std::vector<std::string>{"*"} : visible;
  }
  std::vector<std::string> seen;
  for (const std::string& ns : spec.filter.namespaces) {
    if (visible.empty() || absl::c_linear_search(visible, ns)) {
      seen.push_back(ns);
    }
  }
  return seen;
}

bool MayLearnOf(const std::vector<std::string>& namespaces,
                const std::vector<std::string>& seen) {
  if (absl::c_linear_search(namespaces, "*")) return true;
  return absl::c_all_of(seen, [&](const std::string& ns) {
    return absl::c_linear_search(namespaces, ns);
  });
}

bool SubscriberHub::Matches(const Subscriber& s, const HookEvent& e) const {
  const SubscriptionSpec& spec = s.spec;
  auto contains = [](const auto& list, const auto& value) {
    return list.empty() ||
           std::find(list.begin(), list.end(), value) != list.end();
  };
  return contains(spec.visible_namespaces, e.ns) &&
         contains(spec.filter.kinds, e.kind) &&
         contains(spec.filter.actions, e.action) &&
         contains(spec.filter.namespaces, e.ns) &&
         (spec.filter.module_type_glob.empty() ||
          GlobMatch(spec.filter.module_type_glob, e.module_type)) &&
         (spec.filter.name_glob.empty() ||
          GlobMatch(spec.filter.name_glob, e.name));
}

std::shared_ptr<const HookEvent> SubscriberHub::EventFor(
    const Pending& p, const Subscriber& s) const {
  auto event = std::make_shared<HookEvent>(p.base);
  event->value = p.value;
  event->value_sha256 = p.value_sha256;
  event->chain = p.steps;
  for (size_t i = 0; i < event->chain.size(); ++i) {
    // A later subscriber learns what an earlier one did, but not who it is
    // nor why, unless ListSubscribers would show it that subscriber: a
    // team's reviewer must not learn an admin's policy from its reasons.
    if (!MayLearnOf(s.spec.learns_of, p.step_seen[i])) {
      event->chain[i].subscriber = kHiddenSubscriber;
      event->chain[i].reason.clear();
    }
  }
  const Tensor& t = p.value.tensor;
  event->data_included = s.spec.include_data && t.defined() &&
                         t.device().has_storage() &&
                         t.nbytes() <= s.spec.max_data_bytes;
  return event;
}

void SubscriberHub::FinishLocked(Pending& p, HookDecision decision) {
  if (p.done) return;
  p.done = true;
  p.result = std::move(decision);
  p.waiting_on = 0;
  pending_.erase(p.event_id);
  --*p.remaining;
}

absl::Time SubscriberHub::DeadlineLocked(const Pending& p) const {
  if (p.done || p.waiting_on == 0) return absl::InfiniteFuture();
  auto it = subscribers_.find(p.waiting_on);
  if (it == subscribers_.end()) return absl::InfiniteFuture();
  return it->second->DeadlineOf(p.event_id);
}

void SubscriberHub::AdvanceLocked(Pending& p, Sends& sends) {
  while (!p.done && p.stage < p.chain.size()) {
    uint64_t order = p.chain[p.stage];
    Subscriber* s = nullptr;
    for (auto& [id, sub] : subscribers_) {
      if (sub->order == order) s = sub.get();
    }
    if (s == nullptr || s->spec.mode != SubscriberMode::kIntercept) {
      // Gone before its turn, or back in a mode that is never awaited: its
      // failure policy as an interceptor decides.
      const SubscriptionSpec& spec = p.chain_specs.at(order);
      Subscriber ghost;
      ghost.spec = spec;
      ghost.order = order;
      FailLocked(p, ghost,
                 s == nullptr ? std::string("is not connected")
                              : NotInterceptingAnyMore(s->spec.mode),
                 sends);
      return;
    }
    p.waiting_on = s->id;
    p.sent_at = absl::Now();
    s->Hold(p.event_id, next_send_++, p.sent_at);
    sends.emplace_back(s->channel, EventFor(p, *s));
    return;
  }
  if (p.done) return;
  HookDecision d;
  bool replaced =
      p.modified || p.record->local.kind == HookResult::Kind::kReplace;
  d.kind = replaced ? HookResult::Kind::kReplace : HookResult::Kind::kKeep;
  d.value = p.value;
  if (p.modified) {
    std::vector<std::string> who;
    for (const ChainStep& step : p.steps) {
      if (step.verdict == "modify") who.push_back(step.subscriber);
    }
    d.reason = absl::StrCat("modified by ", absl::StrJoin(who, ", "));
  } else {
    d.reason = p.record->local.reason;
  }
  FinishLocked(p, std::move(d));
}

void SubscriberHub::FailLocked(Pending& p, const Subscriber& s,
                               absl::string_view why, Sends& sends) {
  if (p.done) return;
  bool closed = s.spec.failure_policy == FailurePolicy::kFailClosed;
  p.steps.push_back(ChainStep{s.spec.name,
                              closed ? "failed-closed" : "failed-open",
                              absl::StrCat(s.spec.name, " ", why)});
  p.step_seen.push_back(NamespacesSeenBy(s.spec));
  audit_events::AnswerFacts failure;
  failure.event = &p.base;
  failure.event_id = p.event_id;
  failure.subscriber = s.spec.name;
  failure.outcome = closed ? "failed-closed" : "failed-open";
  failure.reason = absl::StrCat(s.spec.name, " ", why);
  Audit(audit_events::Answer(failure));
  p.waiting_on = 0;
  if (closed) {
    HookDecision d;
    d.kind = HookResult::Kind::kBlock;
    d.reason =
        absl::StrCat("subscriber ", s.spec.name, " ", why, " (fail-closed)");
    FinishLocked(p, std::move(d));
    return;
  }
  ++p.stage;
  AdvanceLocked(p, sends);
}

void SubscriberHub::DryRunAnswerLocked(Subscriber& s,
                                       const SubscriberAnswer& answer,
                                       absl::Time now) {
  audit_events::AnswerFacts facts = AnswerFactsOf(s.spec.name, answer);
  facts.dry_run = true;
  SlotValue modified_value;
  auto dr = dry_runs_.find(answer.event_id);
  const bool awaited =
      dr != dry_runs_.end() && dr->second->awaiting.contains(s.spec.name);
  if (!awaited && s.settled.contains(answer.event_id)) {
    facts.outcome = "ignored";
    facts.problem = "duplicate answer";
  } else if (!awaited) {
    // Never sent to it (another subscriber's event, maybe of a namespace
    // it may not see), older than ten minutes, or forgotten to keep what
    // the unanswered dry runs hold within max_dry_run_bytes_.
    facts.outcome = "invalid";
    facts.problem = "unknown event id";
  } else {
    DryRun& run = *dr->second;
    // Recorded under its event, like an interceptor's, even when the rest
    // of the answer could not be decoded.
    facts.event = run.event.get();
    facts.latency_ms = absl::ToDoubleMilliseconds(now - run.sent_at);
    if (!answer.invalid.empty()) {
      facts.outcome = "invalid";
      facts.problem = answer.invalid;
    } else if (answer.verdict == Verdict::kModify) {
      // Validated as if enforced, so a dry run shows what would fail.
      absl::StatusOr<SlotValue> modified = ModifiedValue(
          run.registration, run.event->value, answer, run.request_seed);
      // The shape check ValidateReplacement makes with the module, which
      // the run does not keep.
      if (modified.ok() && run.fixed_shapes &&
          modified->tensor.shape() != run.event->value.tensor.shape()) {
        modified = absl::InvalidArgumentError(absl::StrCat(
            "shape must stay ", ShapeToString(run.event->value.tensor.shape()),
            " in ", run.module_type, ", got ",
            ShapeToString(modified->tensor.shape())));
      }
      if (modified.ok()) {
        modified_value = *std::move(modified);
        facts.value = &modified_value;
        facts.value_sha256 = ContentHash(modified_value.tensor);
      } else {
        facts.outcome = "invalid";
        facts.problem = std::string(modified.status().message());
      }
    }
  }
  if (awaited) {
    Audit(audit_events::Answer(facts));
    s.Settle(answer.event_id);
    StopAwaitingLocked(s, answer.event_id);
  } else {
    StrayAnswerLocked(s, facts);
  }
}

void SubscriberHub::StopAwaitingLocked(Subscriber& s, uint64_t event_id) {
  auto held = s.dry_awaiting.find(event_id);
  if (held != s.dry_awaiting.end()) {
    s.dry_awaiting_bytes -= held->second;
    s.dry_awaiting.erase(held);
  }
  auto run = dry_runs_.find(event_id);
  if (run == dry_runs_.end()) return;
  run->second->awaiting.erase(s.spec.name);
  if (run->second->awaiting.empty()) EraseDryRunLocked(run);
}

SubscriberHub::DryRuns::iterator SubscriberHub::EraseDryRunLocked(
    DryRuns::iterator run) {
  dry_run_bytes_ -= run->second->bytes;
  // Its subscribers await it no more: their answers to it are "unknown
  // event id".
  for (auto& [id, sub] : subscribers_) {
    if (run->second->awaiting.empty()) break;
    if (!run->second->awaiting.contains(sub->spec.name)) continue;
    auto held = sub->dry_awaiting.find(run->first);
    if (held == sub->dry_awaiting.end()) continue;
    sub->dry_awaiting_bytes -= held->second;
    sub->dry_awaiting.erase(held);
  }
  return dry_runs_.erase(run);
}

void SubscriberHub::AwaitDryRunLocked(Subscriber& s, uint64_t event_id,
                                      uint64_t bytes) {
  if (!s.dry_awaiting.emplace(event_id, bytes).second) return;
  s.dry_awaiting_bytes += bytes;
  // The bound is on every dry run together, each counted once however
  // many subscribers await it: one per subscriber multiplied it by the
  // subscribers a client connects (each may filter other modules, so that
  // their runs differ). The oldest are forgotten first: a dry-run
  // subscriber answers in order, if at all. The newest is kept even when
  // it alone is over the bound, so that a tensor that large still gets its
  // answer.
  while (dry_run_bytes_ > max_dry_run_bytes_ && !dry_runs_.empty() &&
         dry_runs_.begin()->first != event_id) {
    EraseDryRunLocked(dry_runs_.begin());
  }
}

void SubscriberHub::ForgetDryRunsLocked(const std::string& name) {
  for (auto it = dry_runs_.begin(); it != dry_runs_.end();) {
    it->second->awaiting.erase(name);
    if (it->second->awaiting.empty()) {
      it = EraseDryRunLocked(it);
    } else {
      ++it;
    }
  }
}

void SubscriberHub::Answer(uint64_t subscriber_id, SubscriberAnswer answer) {
  answer.reason = CappedReason(std::move(answer.reason));
  Sends sends;
  {
    MutexLock lock(&mu_);
    auto sit = subscribers_.find(subscriber_id);
    if (sit == subscribers_.end()) return;
    Subscriber& s = *sit->second;
    absl::Time now = absl::Now();
    if (s.spec.mode == SubscriberMode::kDryRun) {
      DryRunAnswerLocked(s, answer, now);
      return;
    }
    audit_events::AnswerFacts facts = AnswerFactsOf(s.spec.name, answer);
    auto pit = pending_.find(answer.event_id);
    if ((pit == pending_.end() || pit->second->waiting_on != subscriber_id) &&
        s.settled.contains(answer.event_id)) {
      // It already answered this event, or the event was decided without
      // it (timeout, failure): a late or duplicate answer, only recorded.
      facts.outcome = "ignored";
      facts.problem =
          "late or duplicate answer: this subscriber's part in the event is "
          "already decided";
      if (pit != pending_.end()) facts.event = &pit->second->base;
      StrayAnswerLocked(s, facts);
      return;
    }
    if (pit == pending_.end() || pit->second->waiting_on != subscriber_id) {
      // Garbage: the subscriber is broken, so everything it holds fails.
      facts.outcome = "invalid";
      facts.problem = answer.invalid.empty()
                          ? "no event with this id was sent to this subscriber"
                          : answer.invalid;
      if (s.holding.empty()) {
        // Nothing to fail (an observer never holds anything): it changed
        // nothing, like a late answer. One that fails events is recorded
        // on its own; there are at most as many as events sent to it.
        StrayAnswerLocked(s, facts);
        return;
      }
      Audit(audit_events::Answer(facts));
      for (uint64_t event_id : s.Held()) {
        s.Release(event_id, now);
        auto p = pending_.find(event_id);
        if (p != pending_.end()) {
          FailLocked(
              *p->second, s,
              answer.invalid.empty()
                  ? std::string("sent an answer for an unknown event")
                  : absl::StrCat("sent an invalid answer: ", answer.invalid),
              sends);
        }
      }
      cv_.SignalAll();
    } else {
      Pending& p = *pit->second;
      s.Release(p.event_id, now);
      facts.event = &p.base;
      facts.latency_ms = absl::ToDoubleMilliseconds(now - p.sent_at);
      if (round_trip_seconds_ != nullptr) {
        round_trip_seconds_->Labels({s.spec.name})
            .ObserveDuration(now - p.sent_at);
      }
      absl::Status valid = absl::OkStatus();
      if (!answer.invalid.empty()) {
        // Its event id was read, the rest could not be decoded (a
        // replacement whose bytes do not match its shape, an unknown
        // verdict): an invalid answer for that event, as a replacement of
        // the wrong shape is, recorded under that event.
        valid = absl::InvalidArgumentError(answer.invalid);
      } else if (answer.verdict == Verdict::kModify) {
        absl::StatusOr<SlotValue> modified =
            ModifiedValue(p.record->event, p.value, answer, p.request_seed);
        if (modified.ok()) {
          p.value = *std::move(modified);
          p.value_sha256 = ContentHash(p.value.tensor);
          p.modified = true;
        } else {
          valid = modified.status();
        }
      }
      if (!valid.ok()) {
        facts.outcome = "invalid";
        facts.problem = std::string(valid.message());
        Audit(audit_events::Answer(facts));
        FailLocked(p, s,
                   absl::StrCat("sent an invalid answer: ", valid.message()),
                   sends);
      } else {
        if (answer.verdict == Verdict::kModify) {
          facts.value = &p.value;
          facts.value_sha256 = p.value_sha256;
        }
        Audit(audit_events::Answer(facts));
        p.steps.push_back(ChainStep{s.spec.name,
                                    std::string(VerdictName(answer.verdict)),
                                    answer.reason});
        p.step_seen.push_back(NamespacesSeenBy(s.spec));
        if (answer.verdict == Verdict::kReject) {
          HookDecision d;
          d.kind = HookResult::Kind::kBlock;
          d.reason =
              absl::StrCat("rejected by ", s.spec.name,
                           answer.reason.empty() ? "" : ": ", answer.reason);
          FinishLocked(p, std::move(d));
        } else {
          ++p.stage;
          AdvanceLocked(p, sends);
        }
      }
      cv_.SignalAll();
    }
  }
  Deliver(sends);
}

void SubscriberHub::Deliver(const Sends& sends) {
  for (const auto& [channel, event] : sends) channel->Send(event);
}

std::unique_ptr<SubscriberHub::Pending> SubscriberHub::NewPendingLocked(
    const OperationContext& ctx, const ModuleName& module,
    const RegistrationRecord& rec, std::string sha256, size_t* remaining) {
  auto p = std::make_unique<Pending>();
  p->event_id = next_event_id_++;
  p->request_seed = ctx.seed;
  p->record = &rec;
  p->remaining = remaining;
  HookEvent& e = p->base;
  e.event_id = p->event_id;
  e.correlation_id = ctx.correlation_id;
  e.call_id = ctx.call_id;
  e.identity = ctx.identity;
  e.ns = module.ns;
  e.module = module.name;
  e.path = rec.event.path;
  e.module_type = rec.owner != nullptr ? rec.owner->type_name() : "";
  e.kind = rec.event.kind;
  e.action = rec.event.action;
  e.name = rec.event.name;
  p->value = rec.local.blocked() ? rec.event.value : rec.local.value;
  p->value_sha256 = std::move(sha256);
  Audit(audit_events::Registration(ctx, module, e, p->value, p->value_sha256,
                                   rec.local.kind));
  if (rec.local.blocked()) {
    p->done = true;
    p->result = rec.local;
  }
  return p;
}

void SubscriberHub::RouteLocked(
    Pending& p, const std::vector<const Subscriber*>& interceptors,
    Sends& sends) {
  const HookEvent& e = p.base;
  for (const Subscriber* s : interceptors) {
    if (Matches(*s, e)) {
      p.chain.push_back(s->order);
      p.chain_specs.emplace(s->order, s->spec);
    }
  }
  for (const auto& [id, sub] : subscribers_) {
    if (sub->spec.mode != SubscriberMode::kDryRun || !Matches(*sub, e)) {
      continue;
    }
    std::shared_ptr<const HookEvent> ev = EventFor(p, *sub);
    std::unique_ptr<DryRun>& run = dry_runs_[p.event_id];
    if (run == nullptr) {
      run = std::make_unique<DryRun>();
      run->event = ev;
      if (ev->value.module != nullptr) {
        auto without_module = std::make_shared<HookEvent>(*ev);
        without_module->value.module = nullptr;
        run->event = std::move(without_module);
      }
      run->sent_at = absl::Now();
      run->registration = p.record->event;
      run->registration.value = SlotValue();
      run->registration.module = nullptr;
      const Module* owner = p.record->event.module;
      run->fixed_shapes = owner != nullptr && owner->fixed_shapes();
      run->module_type = owner != nullptr ? owner->type_name() : "";
      run->request_seed = p.request_seed;
      const Tensor& t = run->event->value.tensor;
      run->bytes = t.defined() && t.device().has_storage() ? t.nbytes() : 0;
      dry_run_bytes_ += run->bytes;
    }
    run->awaiting.insert(sub->spec.name);
    AwaitDryRunLocked(*sub, p.event_id, run->bytes);
    sends.emplace_back(sub->channel, ev);
  }
  ++*p.remaining;
  pending_[p.event_id] = &p;
  AdvanceLocked(p, sends);
}

void SubscriberHub::AwaitChainsLocked(
    const std::vector<std::unique_ptr<Pending>>& events,
    const size_t& remaining) {
  Sends sends;
  while (remaining > 0) {
    // An answer or a timeout elsewhere signals, and the deadlines are
    // looked at again.
    absl::Time next = absl::InfiniteFuture();
    for (const auto& p : events) next = std::min(next, DeadlineLocked(*p));
    if (next > absl::Now()) cv_.WaitWithDeadline(&mu_, next);
    absl::Time now = absl::Now();
    bool timed_out = false;
    for (const auto& p : events) {
      if (DeadlineLocked(*p) > now) continue;
      Subscriber& sub = *subscribers_.at(p->waiting_on);
      const bool own = sub.TimeOut(p->event_id, now);
      timed_out = true;
      if (own && timeouts_total_ != nullptr) {
        timeouts_total_->Labels({sub.spec.name}).Increment();
      }
      FailLocked(*p, sub,
                 absl::StrCat("timed out after ",
                              absl::FormatDuration(sub.spec.timeout),
                              own ? "" : " on an earlier event"),
                 sends);
    }
    // The subscriber's next event, maybe another call's, starts its clock,
    // and its events held with the one that timed out fail.
    if (timed_out) cv_.SignalAll();
    if (!sends.empty()) {
      // Sends made on timeouts go out with the lock released.
      Sends out;
      out.swap(sends);
      mu_.Unlock();
      Deliver(out);
      mu_.Lock();
    }
  }
}

void SubscriberHub::FinishEventsLocked(
    const OperationContext& ctx, const ModuleName& module,
    const std::vector<std::unique_ptr<Pending>>& events, Sends& sends) {
  absl::Time expired = absl::Now() - absl::Minutes(10);
  for (auto& [id, sub] : subscribers_) {
    // Oldest first: each subscriber's expired runs are at the front.
    while (!sub->dry_awaiting.empty()) {
      const uint64_t event_id = sub->dry_awaiting.begin()->first;
      auto run = dry_runs_.find(event_id);
      if (run != dry_runs_.end() && run->second->sent_at >= expired) break;
      StopAwaitingLocked(*sub, event_id);
    }
  }
  for (auto it = dry_runs_.begin(); it != dry_runs_.end();) {
    if (it->second->sent_at < expired) {
      it = EraseDryRunLocked(it);
    } else {
      ++it;
    }
  }
  // Outcomes: audited, and sent to observers.
  for (const auto& p : events) {
    Audit(audit_events::Outcome(ctx, module, p->base, p->result,
                                p->value_sha256));
    for (const auto& [id, sub] : subscribers_) {
      if (sub->spec.mode != SubscriberMode::kObserve || !Matches(*sub, p->base))
        continue;
      auto ev = std::make_shared<HookEvent>(*EventFor(*p, *sub));
      if (!p->result.blocked()) ev->value = p->result.value;
      ev->is_outcome = true;
      ev->outcome = p->result.kind;
      ev->outcome_reason =
          OutcomeReasonShown(p->result, p->modified, ev->chain);
      sends.emplace_back(sub->channel, ev);
    }
  }
}

std::vector<HookDecision> SubscriberHub::Decide(
    const OperationContext& ctx, const ModuleName& module,
    absl::Span<const RegistrationRecord> records) {
  std::vector<std::unique_ptr<Pending>> events(records.size());
  // Content hashes before taking the lock: they read every byte.
  std::vector<std::string> hashes(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    if (!records[i].local.blocked())
      hashes[i] = ContentHash(records[i].local.value.tensor);
  }
  size_t remaining = 0;
  Sends sends;
  {
    MutexLock lock(&mu_);
    std::vector<const Subscriber*> interceptors;
    for (const auto& [id, sub] : subscribers_) {
      if (sub->spec.mode == SubscriberMode::kIntercept)
        interceptors.push_back(sub.get());
    }
    std::sort(interceptors.begin(), interceptors.end(),
              [](const Subscriber* a, const Subscriber* b) {
                return std::make_pair(a->spec.priority, a->order) <
                       std::make_pair(b->spec.priority, b->order);
              });
    for (size_t i = 0; i < records.size(); ++i) {
      events[i] = NewPendingLocked(ctx, module, records[i],
                                   std::move(hashes[i]), &remaining);
      if (!events[i]->done) RouteLocked(*events[i], interceptors, sends);
    }
  }
  Deliver(sends);
  sends.clear();
  {
    MutexLock lock(&mu_);
    AwaitChainsLocked(events, remaining);
    FinishEventsLocked(ctx, module, events, sends);
  }
  Deliver(sends);
  std::vector<HookDecision> finals;
  finals.reserve(events.size());
  for (auto& p : events) finals.push_back(std::move(p->result));
  return finals;
}

}  // namespace modelstate
