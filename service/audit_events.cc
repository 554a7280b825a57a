#include "service/audit_events.h"

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/time/time.h"
#include "base/sha256.h"
#include "nlohmann/json.hpp"
#include "service/subscriber_hub.h"

namespace modelstate {
namespace {

using Json = nlohmann::json;

// A record of `type` about `module` on behalf of `ctx`.
AuditRecord Record(AuditType type, const OperationContext& ctx,
                   const ModuleName& module) {
  AuditRecord r;
  r.identity = ctx.identity;
  r.correlation_id = ctx.correlation_id;
  r.call_id = ctx.call_id;
  r.type = std::string(AuditTypeName(type));
  r.ns = module.ns;
  r.module = module.name;
  return r;
}

// The audit log keeps every record for good, so a record holds at most this
// much of an error's text and this many keys of each list; what is left out
// is counted ("message_bytes", "missing_keys_count", ...).
constexpr size_t kMaxErrorBytes = 8 << 10;
constexpr size_t kMaxListedKeys = 1000;

Json ErrorJson(const absl::Status& status) {
  absl::string_view message = status.message();
  Json error = {{"code", absl::StatusCodeToString(status.code())},
                {"message", std::string(message.substr(0, kMaxErrorBytes))}};
  if (message.size() > kMaxErrorBytes) error["message_bytes"] = message.size();
  return error;
}

// `keys` under `field`, the first kMaxListedKeys of them, and their count
// under "<field>_count" when there are more.
void PutKeys(Json& details, const std::string& field,
             const std::vector<std::string>& keys) {
  const size_t listed = std::min(keys.size(), kMaxListedKeys);
  details[field] =
      std::vector<std::string>(keys.begin(), keys.begin() + listed);
  if (listed < keys.size()) details[field + "_count"] = keys.size();
}

// Every dump replaces bytes that are not UTF-8 (an error text can quote a
// damaged file's bytes) instead of throwing: a record must always be
// writable. Valid text dumps exactly as with the defaults.
constexpr auto kReplaceInvalidUtf8 = Json::error_handler_t::replace;

// A change to a module: "ok", or "error" with the error in the details.
AuditRecord Change(AuditType type, const OperationContext& ctx,
                   const ModuleName& module, Json details,
                   const absl::Status& result) {
  AuditRecord r = Record(type, ctx, module);
  r.outcome = result.ok() ? "ok" : "error";
  if (!result.ok()) details["error"] = ErrorJson(result);
  r.details_json = details.dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

// What a registration proposes or decided: a tensor's description, a
// module's type, or null.
Json ValueJson(const SlotValue& v, const std::string& sha256) {
  if (v.tensor.defined()) {
    return {{"dtype", std::string(DTypeName(v.tensor.dtype()))},
            {"shape", v.tensor.shape()},
            {"device", v.tensor.device().ToString()},
            {"nbytes", v.tensor.nbytes()},
            {"requires_grad", v.tensor.requires_grad()},
            {"persistent", v.persistent},
            {"sha256", sha256}};
  }
  if (v.module != nullptr) return {{"module_type", v.module->type_name()}};
  return nullptr;
}

Json SpecValueJson(const SpecValue& v) {
  return std::visit(
      [](const auto& x) -> Json {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>,
                                     std::monostate>) {
          return nullptr;
        } else {
          return x;
        }
      },
      v);
}

Json TensorSpecJson(const TensorSpec& t) {
  Json out = Json::object();
  if (t.data.defined()) {
    // The values themselves may be large: their digest stands for them
    // (of a copy on the host when they are on a device).
    out["data"] = {{"dtype", std::string(DTypeName(t.data.dtype()))},
                   {"shape", t.data.shape()},
                   {"sha256", ContentHash(t.data)}};
    return out;
  }
  if (t.dtype.has_value()) out["dtype"] = std::string(DTypeName(*t.dtype));
  out["shape"] = t.shape;
  Json init = {{"kind", std::string(InitKindName(t.init.kind))},
               {"a", t.init.a},
               {"b", t.init.b}};
  if (t.init.seed.has_value()) init["seed"] = *t.init.seed;
  out["init"] = std::move(init);
  return out;
}

// Specs nested deeper than this many modules are recorded down to it: each
// level adds three levels of JSON, and an audit record's details may nest
// at most 64 (spec_sha256 still covers the whole spec).
constexpr int kMaxRecordedSpecDepth = 16;
constexpr int kWholeSpec = std::numeric_limits<int>::max();

// The spec as SpecJson describes it, with the modules below `max_depth`
// levels replaced by their type and an "omitted" note.
Json SpecObject(const ModuleSpec& spec, int max_depth, int depth = 0) {
  Json out = {{"type", spec.type}};
  if (!spec.ref.empty()) {
    out["ref"] = spec.ref;
    return out;
  }
  if (depth >= max_depth) {
    out["omitted"] = "nested too deep to record";
    return out;
  }
  if (spec.custom) out["custom"] = true;
  if (!spec.args.empty()) {
    Json args = Json::array();
    for (const SpecValue& v : spec.args) args.push_back(SpecValueJson(v));
    out["args"] = std::move(args);
  }
  if (!spec.kwargs.empty()) {
    Json kwargs = Json::object();
    for (const auto& [name, v] : spec.kwargs) kwargs[name] = SpecValueJson(v);
    out["kwargs"] = std::move(kwargs);
  }
  if (!spec.children.empty()) {
    Json children = Json::array();
    for (const ModuleChild& c : spec.children) {
      children.push_back({{"name", c.name},
                          {"spec", SpecObject(c.spec, max_depth, depth + 1)}});
    }
    out["children"] = std::move(children);
  }
  if (!spec.members.empty()) {
    Json members = Json::array();
    for (const MemberSpec& m : spec.members) {
      Json member = {{"kind", std::string(EntryKindName(m.kind))},
                     {"name", m.name}};
      if (m.is_none) {
        member["none"] = true;
      } else if (m.kind == EntryKind::kModule) {
        if (m.module != nullptr) {
          member["spec"] = SpecObject(*m.module, max_depth, depth + 1);
        }
      } else {
        member["tensor"] = TensorSpecJson(m.tensor);
        if (m.kind == EntryKind::kParameter) {
          member["requires_grad"] = m.requires_grad;
        } else {
          member["persistent"] = m.persistent;
        }
      }
      members.push_back(std::move(member));
    }
    out["members"] = std::move(members);
  }
  if (spec.has_extra_state) out["extra_state"] = true;
  if (!spec.ties.empty()) {
    Json ties = Json::array();
    for (const TieSpec& t : spec.ties) {
      ties.push_back({{"target", t.target}, {"source", t.source}});
    }
    out["ties"] = std::move(ties);
  }
  return out;
}

std::string DecisionName(HookResult::Kind kind) {
  switch (kind) {
    case HookResult::Kind::kKeep:
      return "keep";
    case HookResult::Kind::kReplace:
      return "replace";
    case HookResult::Kind::kBlock:
      return "block";
  }
  return "keep";
}

// The context of the request behind a hook event.
OperationContext ContextOf(const HookEvent& event) {
  OperationContext ctx;
  ctx.identity = event.identity;
  ctx.correlation_id = event.correlation_id;
  ctx.call_id = event.call_id;
  return ctx;
}

ModuleName ModuleOf(const HookEvent& event) {
  return ModuleName{event.ns, event.module};
}

}  // namespace

absl::string_view AuditTypeName(AuditType type) {
  switch (type) {
    case AuditType::kBuild:
      return "build";
    case AuditType::kRegister:
      return "register";
    case AuditType::kLoadStateDict:
      return "load_state_dict";
    case AuditType::kMove:
      return "move";
    case AuditType::kSetTraining:
      return "set_training";
    case AuditType::kForward:
      return "forward";
    case AuditType::kDelete:
      return "delete";
    case AuditType::kRegistration:
      return "registration";
    case AuditType::kAnswer:
      return "answer";
    case AuditType::kOutcome:
      return "outcome";
    case AuditType::kSubscribe:
      return "subscribe";
    case AuditType::kUnsubscribe:
      return "unsubscribe";
    case AuditType::kDenied:
      return "denied";
    case AuditType::kRecovered:
      return "recovered";
    case AuditType::kRestore:
      return "restore";
    case AuditType::kRelease:
      return "release";
    case AuditType::kMoveOut:
      return "move_out";
    case AuditType::kMoveIn:
      return "move_in";
    case AuditType::kSetAside:
      return "set_aside";
  }
  return "unknown";
}

namespace audit_events {

std::string SpecJson(const ModuleSpec& spec) {
  return SpecObject(spec, kWholeSpec).dump(-1, ' ', false, kReplaceInvalidUtf8);
}

std::string SpecSha256(const ModuleSpec& spec) {
  return Sha256Hex(SpecJson(spec));
}

AuditRecord Build(const OperationContext& ctx, const ModuleName& module,
                  const ModuleSpec& spec, const BuildOptions& options,
                  size_t registrations, size_t blocked, bool all_or_nothing,
                  const absl::Status& result) {
  const std::string text = SpecJson(spec);
  Json recorded_spec = SpecObject(spec, kMaxRecordedSpecDepth);
  if (text.size() > kMaxRecordedSpecBytes) {
    recorded_spec = "omitted: larger than 64 KiB (spec_sha256 stands for it)";
  }
  return Change(AuditType::kBuild, ctx, module,
                {{"type", spec.type},
                 {"spec", std::move(recorded_spec)},
                 {"spec_sha256", Sha256Hex(text)},
                 {"seed", options.seed},
                 {"device", options.device.ToString()},
                 {"dtype", std::string(DTypeName(options.dtype))},
                 {"registrations", registrations},
                 {"blocked", blocked},
                 {"all_or_nothing", all_or_nothing}},
                result);
}

AuditRecord Register(const OperationContext& ctx, const ModuleName& module,
                     const std::string& path, const std::string& name,
                     const RegistrationEvent* event, bool removal,
                     const absl::Status& result) {
  Json details = {{"path", path}, {"name", name}};
  if (event != nullptr) {
    details["kind"] = std::string(EntryKindName(event->kind));
    details["action"] =
        removal ? "remove" : std::string(RegistrationActionName(event->action));
  }
  return Change(AuditType::kRegister, ctx, module, std::move(details), result);
}

AuditRecord LoadStateDict(const OperationContext& ctx, const ModuleName& module,
                          const LoadOptions& options,
                          const StateDict& state_dict,
                          const IncompatibleKeys* keys,
                          const absl::Status& result,
                          absl::string_view sha256) {
  uint64_t bytes = 0;
  for (const auto& item : state_dict.tensors) {
    if (item.value.defined()) bytes += item.value.nbytes();
  }
  Json details = {{"strict", options.strict},
                  {"atomic", options.atomic},
                  {"assign", options.assign},
                  {"keys", state_dict.tensors.size()},
                  {"bytes", bytes}};
  if (keys != nullptr) {
    PutKeys(details, "missing_keys", keys->missing_keys);
    PutKeys(details, "unexpected_keys", keys->unexpected_keys);
  }
  if (!sha256.empty()) details["sha256"] = std::string(sha256);
  return Change(AuditType::kLoadStateDict, ctx, module, std::move(details),
                result);
}

AuditRecord Move(const OperationContext& ctx, const ModuleName& module,
                 std::optional<Device> device, std::optional<DType> dtype,
                 bool convert_all, const absl::Status& result) {
  Json details = Json::object();
  if (device.has_value()) details["device"] = device->ToString();
  if (dtype.has_value()) details["dtype"] = std::string(DTypeName(*dtype));
  // Only when set: records of to() read as they always did.
  if (convert_all) details["convert_all"] = true;
  return Change(AuditType::kMove, ctx, module, std::move(details), result);
}

AuditRecord SetTraining(const OperationContext& ctx, const ModuleName& module,
                        bool training, const absl::Status& result) {
  return Change(AuditType::kSetTraining, ctx, module, {{"training", training}},
                result);
}

AuditRecord Forward(const OperationContext& ctx, const ModuleName& module,
                    const std::string& path, const absl::Status& result) {
  return Change(AuditType::kForward, ctx, module,
                {{"path", path}, {"training", true}}, result);
}

AuditRecord Delete(const OperationContext& ctx, const ModuleName& module,
                   const absl::Status& result) {
  return Change(AuditType::kDelete, ctx, module, Json::object(), result);
}

AuditRecord MoveOut(const OperationContext& ctx, const ModuleName& module,
                    const std::string& to_replica, uint64_t bytes,
                    const absl::Status& result) {
  return Change(AuditType::kMoveOut, ctx, module,
                {{"to_replica", to_replica}, {"bytes", bytes}}, result);
}

AuditRecord MoveIn(const OperationContext& ctx, const ModuleName& module,
                   const std::string& from_replica, uint64_t bytes,
                   const absl::Status& result) {
  return Change(AuditType::kMoveIn, ctx, module,
                {{"from_replica", from_replica}, {"bytes", bytes}}, result);
}

AuditRecord Registration(const OperationContext& ctx, const ModuleName& module,
                         const HookEvent& event, const SlotValue& value,
                         const std::string& sha256,
                         HookResult::Kind in_process) {
  AuditRecord r = Record(AuditType::kRegistration, ctx, module);
  r.details_json =
      Json{{"event_id", event.event_id},
           {"path", event.path},
           {"module_type", event.module_type},
           {"kind", std::string(EntryKindName(event.kind))},
           {"action", std::string(RegistrationActionName(event.action))},
           {"name", event.name},
           {"value", ValueJson(value, sha256)},
           {"in_process", DecisionName(in_process)}}
          .dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Answer(const AnswerFacts& facts) {
  AuditRecord r =
      facts.event != nullptr
          ? Record(AuditType::kAnswer, ContextOf(*facts.event),
                   ModuleOf(*facts.event))
          : Record(AuditType::kAnswer, OperationContext{}, ModuleName{});
  r.outcome = facts.outcome;
  Json details = {{"event_id", facts.event_id},
                  {"subscriber", facts.subscriber},
                  {"reason", facts.reason}};
  if (facts.dry_run) details["dry_run"] = true;
  if (!facts.problem.empty()) details["problem"] = facts.problem;
  if (facts.latency_ms.has_value()) details["latency_ms"] = *facts.latency_ms;
  if (facts.value != nullptr) {
    details["value"] = ValueJson(*facts.value, facts.value_sha256);
  }
  r.details_json = details.dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord StrayAnswers(const std::string& subscriber,
                         const AuditTally& tally) {
  AuditRecord r = Record(AuditType::kAnswer, OperationContext{}, ModuleName{});
  r.outcome = "ignored";
  Json kinds = Json::object();
  for (const auto& [kind, count] : tally.kinds) kinds[kind] = count;
  r.details_json =
      Json{{"subscriber", subscriber},
           {"aggregated", true},
           {"count", tally.count},
           {"kinds", std::move(kinds)},
           {"first_event_id", tally.first_id},
           {"last_event_id", tally.last_id},
           {"first", absl::FormatTime(absl::RFC3339_full, tally.first,
                                      absl::UTCTimeZone())},
           {"last", absl::FormatTime(absl::RFC3339_full, tally.last,
                                     absl::UTCTimeZone())}}
          .dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Outcome(const OperationContext& ctx, const ModuleName& module,
                    const HookEvent& event, const HookDecision& decision,
                    const std::string& sha256) {
  AuditRecord r = Record(AuditType::kOutcome, ctx, module);
  r.outcome = DecisionName(decision.kind);
  r.details_json =
      Json{{"event_id", event.event_id},
           {"path", event.path},
           {"kind", std::string(EntryKindName(event.kind))},
           {"name", event.name},
           {"reason", decision.reason},
           {"value", decision.blocked() ? Json(nullptr)
                                        : ValueJson(decision.value, sha256)}}
          .dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Subscribe(const OperationContext& ctx, const SubscriptionSpec& spec,
                      bool reconnected) {
  AuditRecord r = Record(AuditType::kSubscribe, ctx, ModuleName{});
  r.outcome = "ok";
  Json details = {
      {"subscriber", spec.name},
      {"mode", spec.mode == SubscriberMode::kIntercept ? "intercept"
               : spec.mode == SubscriberMode::kObserve ? "observe"
                                                       : "dry_run"},
      {"priority", spec.priority},
      {"timeout_ms", absl::ToInt64Milliseconds(spec.timeout)},
      {"failure_policy", spec.failure_policy == FailurePolicy::kFailClosed
                             ? "fail_closed"
                             : "fail_open"},
      {"reconnected", reconnected}};
  if (!spec.owner_identity.empty()) details["owner"] = spec.owner_identity;
  // What it selects and receives, so that the log says who was sent which
  // namespaces' events and tensor values. Each only when set: records of
  // subscriptions without filters or data keep their format.
  const SubscriptionFilter& f = spec.filter;
  Json filter = Json::object();
  if (!f.kinds.empty()) {
    filter["kinds"] = Json::array();
    for (EntryKind k : f.kinds) {
      filter["kinds"].push_back(std::string(EntryKindName(k)));
    }
  }
  if (!f.actions.empty()) {
    filter["actions"] = Json::array();
    for (RegistrationAction a : f.actions) {
      filter["actions"].push_back(std::string(RegistrationActionName(a)));
    }
  }
  if (!f.namespaces.empty()) filter["namespaces"] = f.namespaces;
  if (!f.module_type_glob.empty()) {
    filter["module_type_glob"] = f.module_type_glob;
  }
  if (!f.name_glob.empty()) filter["name_glob"] = f.name_glob;
  if (!filter.empty()) details["filter"] = std::move(filter);
  if (!spec.visible_namespaces.empty()) {
    details["visible_namespaces"] = spec.visible_namespaces;
  }
  if (spec.include_data) details["max_data_bytes"] = spec.max_data_bytes;
  r.details_json = details.dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Unsubscribe(const OperationContext& ctx,
                        const std::string& subscriber) {
  AuditRecord r = Record(AuditType::kUnsubscribe, ctx, ModuleName{});
  r.outcome = "ok";
  r.details_json = Json{{"subscriber", subscriber}}.dump(-1, ' ', false,
                                                         kReplaceInvalidUtf8);
  return r;
}

AuditRecord ReleaseName(const OperationContext& ctx,
                        const std::string& subscriber, const std::string& owner,
                        bool disconnected) {
  AuditRecord r = Record(AuditType::kRelease, ctx, ModuleName{});
  r.outcome = "ok";
  r.details_json = Json{
      {"subscriber", subscriber},
      {"owner", owner},
      {"disconnected",
       disconnected}}.dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Denied(const OperationContext& ctx, absl::string_view peer,
                   absl::string_view rpc, const ModuleName& module,
                   const absl::Status& status) {
  AuditRecord r = Record(AuditType::kDenied, ctx, module);
  r.outcome = "error";
  r.details_json = Json{{"rpc", std::string(rpc)},
                        {"peer", std::string(peer)},
                        {"error", ErrorJson(status)}}
                       .dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord DeniedAggregate(const DeniedCount& denied) {
  OperationContext ctx;
  ctx.identity = denied.identity;
  AuditRecord r = Record(AuditType::kDenied, ctx, denied.module);
  r.outcome = "error";
  r.details_json =
      Json{{"rpc", denied.rpc},
           {"peer", denied.peer},
           {"error", ErrorJson(denied.status)},
           {"aggregated", true},
           {"count", denied.count},
           {"first", absl::FormatTime(absl::RFC3339_full, denied.first,
                                      absl::UTCTimeZone())},
           {"last", absl::FormatTime(absl::RFC3339_full, denied.last,
                                     absl::UTCTimeZone())}}
          .dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord Recovered(const ModuleName& module, const ChangeNote& note) {
  OperationContext ctx;
  ctx.identity = note.identity;
  ctx.correlation_id = note.correlation_id;
  AuditRecord r = Record(AuditType::kRecovered, ctx, module);
  r.outcome = "ok";
  r.details_json = Json{
      {"change", note.type},
      {"reason",
       "the change was saved, but the server stopped before "
       "recording it"}}.dump(-1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

AuditRecord SetAside(const ModuleName& module, const std::string& owner,
                     const std::string& path, const absl::Status& result) {
  return Change(AuditType::kSetAside, OperationContext{}, module,
                {{"owner", owner}, {"path", path}}, result);
}

AuditRecord RestoreFailed(const absl::Status& error) {
  AuditRecord r = Record(AuditType::kRestore, OperationContext{}, ModuleName{});
  r.outcome = "error";
  r.details_json = Json{{"error", std::string(error.message())}}.dump(
      -1, ' ', false, kReplaceInvalidUtf8);
  return r;
}

}  // namespace audit_events
}  // namespace modelstate
