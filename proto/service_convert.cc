#include "proto/service_convert.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/glob.h"
#include "base/status_macros.h"

namespace modelstate::convert {
namespace {

constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

bool IsIntegral(double v) {
  return std::isfinite(v) && std::floor(v) == v &&
         std::fabs(v) <= kMaxExactInteger;
}

// The entry a registration or removal request names: its module, the
// submodule's path and the entry's name.
template <typename Request, typename Args>
absl::Status ParseEntry(const Request& request, Args& args) {
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleName(request.module()));
  args.path = request.path();
  args.name = request.name();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModuleName> ParseModuleField(absl::string_view text) {
  return ParseModuleName(text);
}

absl::StatusOr<SpecValue> SpecValueFromProto(
    const google::protobuf::Value& value, absl::string_view field) {
  switch (value.kind_case()) {
    case google::protobuf::Value::kNullValue:
    case google::protobuf::Value::KIND_NOT_SET:
      return SpecValue(std::monostate());
    case google::protobuf::Value::kBoolValue:
      return SpecValue(value.bool_value());
    case google::protobuf::Value::kNumberValue: {
      double v = value.number_value();
      if (IsIntegral(v)) return SpecValue(static_cast<int64_t>(v));
      return SpecValue(v);
    }
    case google::protobuf::Value::kStringValue:
      return SpecValue(value.string_value());
    case google::protobuf::Value::kListValue: {
      // All integral: a tuple of ints; otherwise a tuple of floats.
      std::vector<double> numbers;
      bool integral = true;
      for (int i = 0; i < value.list_value().values_size(); ++i) {
        const google::protobuf::Value& e = value.list_value().values(i);
        if (e.kind_case() != google::protobuf::Value::kNumberValue) {
          return FieldError(absl::StrCat(field, "[", i, "]"),
                            "a list argument may only hold numbers");
        }
        numbers.push_back(e.number_value());
        integral = integral && IsIntegral(e.number_value());
      }
      if (!integral) return SpecValue(std::move(numbers));
      std::vector<int64_t> ints;
      for (double n : numbers) ints.push_back(static_cast<int64_t>(n));
      return SpecValue(std::move(ints));
    }
    case google::protobuf::Value::kStructValue:
      return FieldError(field, "an object is not a constructor argument");
  }
  return FieldError(field, "unsupported value");
}

absl::StatusOr<InitSpec> InitFromProto(const v1::InitSpec& proto,
                                       absl::string_view field) {
  InitSpec init;
  // An empty kind is the default, zeros.
  bool known = proto.kind().empty();
  for (uint8_t k = 0;
       !known && k <= static_cast<uint8_t>(InitSpec::Kind::kEmpty); ++k) {
    const auto kind = static_cast<InitSpec::Kind>(k);
    if (proto.kind() == InitKindName(kind)) {
      init.kind = kind;
      known = true;
    }
  }
  if (!known) {
    return FieldError(
        absl::StrCat(field, ".kind"),
        absl::StrCat(
            "'", proto.kind(),
            "' is not zeros, ones, constant, uniform, normal, "
            "kaiming_uniform, xavier_uniform, xavier_normal or empty"));
  }
  init.a = proto.a();
  init.b = proto.has_b() ? proto.b() : 1.0;
  if (init.kind == InitSpec::Kind::kNormal && init.b < 0) {
    return FieldError(
        absl::StrCat(field, ".b"),
        absl::StrCat("normal expects std >= 0.0, but found std ", init.b));
  }
  if (init.kind == InitSpec::Kind::kUniform && init.a > init.b) {
    return FieldError(field, absl::StrCat("uniform_ expects to return a [from, "
                                          "to) range, but found from=",
                                          init.a, " > to=", init.b));
  }
  if (proto.has_seed()) init.seed = proto.seed();
  return init;
}

absl::StatusOr<TensorSpec> TensorSpecFromProto(const v1::TensorSpec& proto,
                                               absl::string_view field) {
  TensorSpec spec;
  if (!proto.dtype().empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        spec.dtype,
        ParseDTypeField(proto.dtype(), absl::StrCat(field, ".dtype"),
                        std::nullopt));
  }
  spec.shape.assign(proto.shape().begin(), proto.shape().end());
  MODELSTATE_ASSIGN_OR_RETURN(
      spec.init, InitFromProto(proto.init(), absl::StrCat(field, ".init")));
  if (proto.has_data()) {
    v1::TensorProto data = proto.data();
    MODELSTATE_ASSIGN_OR_RETURN(
        spec.data,
        TensorFromProto(&data, absl::StrCat(field, ".data"), UINT64_MAX));
  }
  return spec;
}

absl::StatusOr<ModuleSpec> SpecFromProto(const v1::ModuleSpec& proto,
                                         absl::string_view field) {
  ModuleSpec spec;
  spec.type = proto.type();
  spec.ref = proto.ref();
  spec.has_extra_state = proto.extra_state();
  spec.custom = proto.custom();
  for (int i = 0; i < proto.args_size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(
        SpecValue v, SpecValueFromProto(proto.args(i),
                                        absl::StrCat(field, ".args[", i, "]")));
    spec.args.push_back(std::move(v));
  }
  // Protobuf maps have no order; keyword arguments need none.
  std::vector<std::string> keys;
  for (const auto& [key, value] : proto.kwargs()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (const std::string& key : keys) {
    MODELSTATE_ASSIGN_OR_RETURN(
        SpecValue v, SpecValueFromProto(proto.kwargs().at(key),
                                        absl::StrCat(field, ".kwargs.", key)));
    spec.kwargs.emplace_back(key, std::move(v));
  }
  for (int i = 0; i < proto.children_size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(
        ModuleSpec child,
        SpecFromProto(proto.children(i).spec(),
                      absl::StrCat(field, ".children[", i, "].spec")));
    spec.children.push_back({proto.children(i).name(), std::move(child)});
  }
  for (int i = 0; i < proto.members_size(); ++i) {
    const v1::Member& m = proto.members(i);
    std::string where = absl::StrCat(field, ".members[", i, "]");
    MemberSpec member;
    switch (m.entry_case()) {
      case v1::Member::kParameter:
      case v1::Member::kBuffer: {
        bool is_param = m.entry_case() == v1::Member::kParameter;
        const v1::TensorMember& t = is_param ? m.parameter() : m.buffer();
        std::string tf =
            absl::StrCat(where, is_param ? ".parameter" : ".buffer");
        member.kind = is_param ? EntryKind::kParameter : EntryKind::kBuffer;
        member.name = t.name();
        member.is_none = t.none();
        member.requires_grad = t.has_requires_grad() ? t.requires_grad() : true;
        member.persistent = t.has_persistent() ? t.persistent() : true;
        v1::TensorSpec ts;
        ts.set_dtype(t.dtype());
        *ts.mutable_shape() = t.shape();
        *ts.mutable_init() = t.init();
        if (t.has_data()) *ts.mutable_data() = t.data();
        if (!member.is_none) {
          MODELSTATE_ASSIGN_OR_RETURN(member.tensor,
                                      TensorSpecFromProto(ts, tf));
        }
        break;
      }
      case v1::Member::kModule:
        member.kind = EntryKind::kModule;
        member.name = m.module().name();
        member.is_none = m.module().none();
        if (!member.is_none) {
          MODELSTATE_ASSIGN_OR_RETURN(
              ModuleSpec child,
              SpecFromProto(m.module().spec(),
                            absl::StrCat(where, ".module.spec")));
          member.module = std::make_shared<ModuleSpec>(std::move(child));
        }
        break;
      case v1::Member::ENTRY_NOT_SET:
        return FieldError(where, "needs one of parameter, buffer or module");
    }
    spec.members.push_back(std::move(member));
  }
  for (const v1::Tie& tie : proto.ties()) {
    spec.ties.push_back({tie.target(), tie.source()});
  }
  return spec;
}

google::protobuf::Value AttrToValue(const AttrValue& value) {
  google::protobuf::Value out;
  struct Visitor {
    google::protobuf::Value& out;
    void operator()(std::monostate) { out.set_null_value({}); }
    void operator()(bool b) { out.set_bool_value(b); }
    void operator()(int64_t i) { out.set_number_value(static_cast<double>(i)); }
    void operator()(double d) { out.set_number_value(d); }
    void operator()(const std::string& s) { out.set_string_value(s); }
    void operator()(const std::vector<int64_t>& v) {
      for (int64_t i : v) {
        out.mutable_list_value()->add_values()->set_number_value(
            static_cast<double>(i));
      }
      if (v.empty()) out.mutable_list_value();
    }
    void operator()(const std::vector<double>& v) {
      for (double d : v)
        out.mutable_list_value()->add_values()->set_number_value(d);
      if (v.empty()) out.mutable_list_value();
    }
    void operator()(const Tensor& t) { out.set_string_value(t.DebugString()); }
  };
  std::visit(Visitor{out}, value);
  return out;
}

namespace {

void DescribeModule(const Module& module, bool with_hashes,
                    const std::string& path,
                    absl::flat_hash_map<const Module*, std::string>& seen,
                    v1::ModuleInfo* info) {
  seen.emplace(&module, path);
  info->set_type(module.type_name());
  info->set_qualified_type(module.qualified_name());
  info->set_training(module.is_training());
  info->set_version(module.version());
  for (const auto& item : module.attributes()) {
    (*info->mutable_attributes())[item.key] = AttrToValue(item.value);
  }
  for (const auto& item : module.parameters()) {
    v1::EntryInfo* e = info->add_parameters();
    e->set_name(item.key);
    if (item.value.defined()) {
      TensorInfoToProto(item.value, true, with_hashes, e->mutable_tensor());
    } else {
      e->set_is_none(true);
    }
  }
  for (const auto& item : module.buffers()) {
    v1::EntryInfo* e = info->add_buffers();
    e->set_name(item.key);
    if (item.value.defined()) {
      TensorInfoToProto(item.value, module.IsPersistentBuffer(item.key),
                        with_hashes, e->mutable_tensor());
    } else {
      e->set_is_none(true);
    }
  }
  for (const auto& item : module.children()) {
    v1::ChildInfo* c = info->add_children();
    c->set_name(item.key);
    if (item.value == nullptr) {
      c->set_is_none(true);
      continue;
    }
    auto it = seen.find(item.value.get());
    if (it != seen.end()) {
      c->set_same_as(it->second);
      continue;
    }
    std::string child_path = path.empty() ? item.key : path + "." + item.key;
    DescribeModule(*item.value, with_hashes, child_path, seen,
                   c->mutable_module());
  }
}

}  // namespace

void ModuleInfoToProto(const Module& module, bool with_hashes,
                       v1::ModuleInfo* info) {
  absl::flat_hash_map<const Module*, std::string> seen;
  DescribeModule(module, with_hashes, "", seen, info);
}

void ReportToProto(const RegistrationResult& result,
                   v1::RegistrationReport* report) {
  const RegistrationRecord& r = result.record;
  report->set_path(r.event.path);
  report->set_module_type(r.owner != nullptr ? r.owner->type_name() : "");
  report->set_kind(EntryKindToProto(r.event.kind));
  report->set_action(r.event.action == RegistrationAction::kRegister
                         ? v1::REGISTRATION_ACTION_REGISTER
                         : v1::REGISTRATION_ACTION_UNREGISTER);
  report->set_name(r.event.name);
  switch (result.final.kind) {
    case HookResult::Kind::kKeep:
      report->set_outcome(v1::OUTCOME_KEEP);
      break;
    case HookResult::Kind::kReplace:
      report->set_outcome(v1::OUTCOME_REPLACE);
      break;
    case HookResult::Kind::kBlock:
      report->set_outcome(v1::OUTCOME_BLOCK);
      break;
  }
  report->set_reason(result.final.reason);
  if (!result.final.blocked() && result.final.value.tensor.defined()) {
    TensorInfoToProto(result.final.value.tensor, result.final.value.persistent,
                      false, report->mutable_value());
  }
}

LoadOptions LoadOptionsFromProto(const v1::LoadOptions& proto) {
  LoadOptions options;
  options.strict = proto.has_strict() ? proto.strict() : true;
  options.atomic = proto.has_atomic() ? proto.atomic() : true;
  options.assign = proto.assign();
  return options;
}

void LoadResultToProto(const LoadResult& result,
                       v1::LoadStateDictResponse* response) {
  for (const std::string& k : result.keys.missing_keys)
    response->add_missing_keys(k);
  for (const std::string& k : result.keys.unexpected_keys) {
    response->add_unexpected_keys(k);
  }
  response->set_repr(result.keys.ToString());
}

absl::StatusOr<SubscriptionSpec> SubscriptionFromProto(
    const v1::Subscription& proto) {
  SubscriptionSpec spec;
  spec.name = proto.name();
  switch (proto.mode()) {
    case v1::Subscription::MODE_UNSPECIFIED:
    case v1::Subscription::MODE_INTERCEPT:
      spec.mode = SubscriberMode::kIntercept;
      break;
    case v1::Subscription::MODE_OBSERVE:
      spec.mode = SubscriberMode::kObserve;
      break;
    case v1::Subscription::MODE_DRY_RUN:
      spec.mode = SubscriberMode::kDryRun;
      break;
    default:
      return FieldError("subscription.mode",
                        absl::StrCat("unknown mode ", proto.mode()));
  }
  for (int k : proto.kinds()) {
    if (k < v1::ENTRY_KIND_PARAMETER || k > v1::ENTRY_KIND_MODULE) {
      return FieldError("subscription.kinds", absl::StrCat("unknown kind ", k));
    }
    spec.filter.kinds.push_back(static_cast<EntryKind>(k - 1));
  }
  for (int a : proto.actions()) {
    if (a < v1::REGISTRATION_ACTION_REGISTER ||
        a > v1::REGISTRATION_ACTION_UNREGISTER) {
      return FieldError("subscription.actions",
                        absl::StrCat("unknown action ", a));
    }
    spec.filter.actions.push_back(static_cast<RegistrationAction>(a - 1));
  }
  spec.filter.namespaces.assign(proto.namespaces().begin(),
                                proto.namespaces().end());
  spec.filter.module_type_glob = proto.module_type_glob();
  spec.filter.name_glob = proto.name_glob();
  spec.priority = proto.priority();
  // 0 leaves the server's default (Limits::subscriber_timeout).
  spec.timeout = absl::Milliseconds(proto.timeout_ms());
  spec.failure_policy = proto.failure_policy() == v1::Subscription::FAIL_OPEN
                            ? FailurePolicy::kFailOpen
                            : FailurePolicy::kFailClosed;
  spec.include_data = proto.include_data();
  if (proto.max_data_bytes() != 0) spec.max_data_bytes = proto.max_data_bytes();
  return spec;
}

void SubscriptionToProto(const SubscriptionSpec& spec,
                         v1::Subscription* proto) {
  proto->set_name(spec.name);
  proto->set_mode(
      spec.mode == SubscriberMode::kIntercept ? v1::Subscription::MODE_INTERCEPT
      : spec.mode == SubscriberMode::kObserve ? v1::Subscription::MODE_OBSERVE
                                              : v1::Subscription::MODE_DRY_RUN);
  for (EntryKind k : spec.filter.kinds) proto->add_kinds(EntryKindToProto(k));
  for (RegistrationAction a : spec.filter.actions) {
    proto->add_actions(a == RegistrationAction::kRegister
                           ? v1::REGISTRATION_ACTION_REGISTER
                           : v1::REGISTRATION_ACTION_UNREGISTER);
  }
  for (const std::string& ns : spec.filter.namespaces)
    proto->add_namespaces(ns);
  proto->set_module_type_glob(spec.filter.module_type_glob);
  proto->set_name_glob(spec.filter.name_glob);
  proto->set_priority(spec.priority);
  proto->set_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(spec.timeout)));
  proto->set_failure_policy(spec.failure_policy == FailurePolicy::kFailOpen
                                ? v1::Subscription::FAIL_OPEN
                                : v1::Subscription::FAIL_CLOSED);
  proto->set_include_data(spec.include_data);
  proto->set_max_data_bytes(spec.max_data_bytes);
}

absl::Status EventToProto(const HookEvent& event, v1::HookEventProto* proto) {
  proto->set_event_id(event.event_id);
  proto->set_correlation_id(event.correlation_id);
  proto->set_identity(event.identity);
  proto->set_namespace_(event.ns);
  proto->set_module(event.module);
  proto->set_path(event.path);
  proto->set_module_type(event.module_type);
  proto->set_kind(EntryKindToProto(event.kind));
  proto->set_action(event.action == RegistrationAction::kRegister
                        ? v1::REGISTRATION_ACTION_REGISTER
                        : v1::REGISTRATION_ACTION_UNREGISTER);
  proto->set_name(event.name);
  if (event.value.tensor.defined()) {
    TensorInfoToProto(event.value.tensor, event.value.persistent, false,
                      proto->mutable_value());
    proto->mutable_value()->set_sha256(event.value_sha256);
    if (event.data_included) {
      MODELSTATE_RETURN_IF_ERROR(
          TensorToProto(event.value.tensor, proto->mutable_data()));
    }
  } else if (event.value.module != nullptr) {
    proto->set_value_module_type(event.value.module->type_name());
  }
  for (const ChainStep& step : event.chain) {
    v1::ChainStepProto* c = proto->add_chain();
    c->set_subscriber(step.subscriber);
    c->set_verdict(step.verdict);
    c->set_reason(step.reason);
  }
  if (event.is_outcome) {
    proto->set_is_outcome(true);
    proto->set_outcome(
        event.outcome == HookResult::Kind::kKeep      ? v1::OUTCOME_KEEP
        : event.outcome == HookResult::Kind::kReplace ? v1::OUTCOME_REPLACE
                                                      : v1::OUTCOME_BLOCK);
    proto->set_outcome_reason(event.outcome_reason);
  }
  return absl::OkStatus();
}

SubscriberAnswer AnswerFromProto(v1::HookAnswer* proto,
                                 uint64_t max_tensor_bytes) {
  SubscriberAnswer answer;
  answer.event_id = proto->event_id();
  answer.reason = proto->reason();
  switch (proto->verdict()) {
    case v1::HookAnswer::APPROVE:
      answer.verdict = Verdict::kApprove;
      break;
    case v1::HookAnswer::MODIFY:
      answer.verdict = Verdict::kModify;
      break;
    case v1::HookAnswer::REJECT:
      answer.verdict = Verdict::kReject;
      break;
    default:
      answer.invalid = absl::StrCat("answer.verdict: ", proto->verdict(),
                                    " is not APPROVE, MODIFY or REJECT");
      return answer;
  }
  if (proto->has_replacement()) {
    absl::StatusOr<Tensor> t = TensorFromProto(
        proto->mutable_replacement(), "answer.replacement", max_tensor_bytes);
    if (!t.ok()) {
      answer.invalid = std::string(t.status().message());
      return answer;
    }
    answer.replacement = *std::move(t);
    if (proto->replacement().has_requires_grad()) {
      answer.replacement_requires_grad = proto->replacement().requires_grad();
    }
  } else if (proto->has_transform()) {
    const v1::TransformProto& tp = proto->transform();
    Transform t;
    if (tp.cast() != v1::DTYPE_UNSPECIFIED) {
      absl::StatusOr<DType> d =
          DTypeFromProto(tp.cast(), "answer.transform.cast");
      if (!d.ok()) {
        answer.invalid = std::string(d.status().message());
        return answer;
      }
      t.cast = *d;
    }
    if (!tp.device().empty()) {
      absl::StatusOr<Device> d = ParseDeviceField(
          tp.device(), "answer.transform.device", std::nullopt);
      if (!d.ok()) {
        answer.invalid = std::string(d.status().message());
        return answer;
      }
      t.device = *d;
    }
    if (tp.has_requires_grad()) t.requires_grad = tp.requires_grad();
    if (tp.has_persistent()) t.persistent = tp.persistent();
    if (tp.has_reinit()) {
      absl::StatusOr<InitSpec> init =
          InitFromProto(tp.reinit(), "answer.transform.reinit");
      if (!init.ok()) {
        answer.invalid = std::string(init.status().message());
        return answer;
      }
      t.reinit = *init;
    }
    answer.transform = t;
  }
  return answer;
}

void AuditRecordToProto(const AuditRecord& record,
                        v1::AuditRecordProto* proto) {
  proto->set_seq(record.seq);
  proto->set_time(absl::FormatTime("%Y-%m-%d%ET%H:%M:%E9SZ", record.time,
                                   absl::UTCTimeZone()));
  proto->set_identity(record.identity);
  proto->set_correlation_id(record.correlation_id);
  proto->set_type(record.type);
  proto->set_namespace_(record.ns);
  proto->set_module(record.module);
  proto->set_outcome(record.outcome);
  proto->set_details_json(record.details_json);
  proto->set_prev(record.prev);
  proto->set_hash(record.hash);
}

AuditRecord AuditRecordFromProto(const v1::AuditRecordProto& proto) {
  AuditRecord r;
  r.seq = proto.seq();
  std::string err;
  absl::ParseTime("%Y-%m-%d%ET%H:%M:%E*SZ", proto.time(), absl::UTCTimeZone(),
                  &r.time, &err);
  r.identity = proto.identity();
  r.correlation_id = proto.correlation_id();
  r.type = proto.type();
  r.ns = proto.namespace_();
  r.module = proto.module();
  r.outcome = proto.outcome();
  r.details_json = proto.details_json();
  r.prev = proto.prev();
  r.hash = proto.hash();
  return r;
}

absl::StatusOr<AuditQuery> AuditQueryFromProto(const v1::AuditFilter& filter,
                                               uint64_t after_seq,
                                               int32_t limit) {
  AuditQuery q;
  auto parse_time =
      [](const std::string& text,
         absl::string_view field) -> absl::StatusOr<std::optional<absl::Time>> {
    if (text.empty()) return std::optional<absl::Time>();
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, text, &t, &err)) {
      return FieldError(
          field, absl::StrCat("'", text, "' is not an RFC 3339 time: ", err));
    }
    return std::optional<absl::Time>(t);
  };
  MODELSTATE_ASSIGN_OR_RETURN(q.since,
                              parse_time(filter.since(), "filter.since"));
  MODELSTATE_ASSIGN_OR_RETURN(q.until,
                              parse_time(filter.until(), "filter.until"));
  q.ns = filter.namespace_();
  q.module = filter.module();
  q.identity = filter.identity();
  q.outcome = filter.outcome();
  q.type = filter.type();
  q.after_seq = after_seq;
  if (limit < 0) return FieldError("limit", "must not be negative");
  q.limit = limit == 0
                ? AuditQuery::kDefaultLimit
                : std::min(static_cast<size_t>(limit), AuditQuery::kMaxLimit);
  return q;
}

absl::StatusOr<BuildModuleArgs> BuildModuleArgsFromProto(
    const v1::BuildModuleRequest& request) {
  BuildModuleArgs args;
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleField(request.module()));
  MODELSTATE_ASSIGN_OR_RETURN(args.spec, SpecFromProto(request.spec()));
  args.seed = request.seed();
  MODELSTATE_ASSIGN_OR_RETURN(
      args.device, ParseDeviceField(request.device(), "device", Device::Cpu()));
  MODELSTATE_ASSIGN_OR_RETURN(
      args.dtype, ParseDTypeField(request.dtype(), "dtype", DType::kFloat32));
  args.all_or_nothing = request.all_or_nothing();
  return args;
}

void BuildOutcomeToProto(const ModuleName& module, const BuildOutcome& outcome,
                         v1::BuildModuleResponse* response) {
  response->set_module(module.full());
  for (const RegistrationResult& r : outcome.registrations) {
    ReportToProto(r, response->add_registrations());
  }
}

void ReportsToProto(const std::vector<RegistrationResult>& results,
                    v1::RegisterResponse* response) {
  for (const RegistrationResult& r : results) {
    ReportToProto(r, response->add_registrations());
  }
}

absl::StatusOr<RegisterTensorArgs> RegisterTensorArgsFromProto(
    const v1::RegisterTensorRequest& request, EntryKind kind,
    uint64_t max_tensor_bytes) {
  RegisterTensorArgs args;
  MODELSTATE_RETURN_IF_ERROR(ParseEntry(request, args));
  args.kind = kind;
  args.seed = request.seed();
  args.persistent = request.has_persistent() ? request.persistent() : true;
  args.requires_grad =
      request.has_requires_grad() ? request.requires_grad() : true;
  switch (request.value_case()) {
    case v1::RegisterTensorRequest::kTensor: {
      v1::TensorProto proto = request.tensor();
      MODELSTATE_ASSIGN_OR_RETURN(
          args.tensor, TensorFromProto(&proto, "tensor", max_tensor_bytes));
      break;
    }
    case v1::RegisterTensorRequest::kInit: {
      MODELSTATE_ASSIGN_OR_RETURN(args.init,
                                  TensorSpecFromProto(request.init(), "init"));
      break;
    }
    case v1::RegisterTensorRequest::kNone:
      break;
    case v1::RegisterTensorRequest::VALUE_NOT_SET:
      return FieldError("value", "one of tensor, init or none is required");
  }
  return args;
}

absl::StatusOr<RegisterSubmoduleArgs> RegisterSubmoduleArgsFromProto(
    const v1::RegisterSubmoduleRequest& request) {
  RegisterSubmoduleArgs args;
  MODELSTATE_RETURN_IF_ERROR(ParseEntry(request, args));
  switch (request.value_case()) {
    case v1::RegisterSubmoduleRequest::kSpec: {
      MODELSTATE_ASSIGN_OR_RETURN(args.spec, SpecFromProto(request.spec()));
      args.seed = request.seed();
      MODELSTATE_ASSIGN_OR_RETURN(
          args.device,
          ParseDeviceField(request.device(), "device", Device::Cpu()));
      MODELSTATE_ASSIGN_OR_RETURN(
          args.dtype,
          ParseDTypeField(request.dtype(), "dtype", DType::kFloat32));
      break;
    }
    case v1::RegisterSubmoduleRequest::kExistingPath:
      args.existing_path = request.existing_path();
      break;
    case v1::RegisterSubmoduleRequest::kNone:
      break;
    case v1::RegisterSubmoduleRequest::VALUE_NOT_SET:
      return FieldError("value",
                        "one of spec, existing_path or none is required");
  }
  return args;
}

absl::StatusOr<RemoveEntryArgs> RemoveEntryArgsFromProto(
    const v1::RemoveEntryRequest& request) {
  RemoveEntryArgs args;
  MODELSTATE_RETURN_IF_ERROR(ParseEntry(request, args));
  return args;
}

ListModulesArgs ListModulesArgsFromProto(
    const v1::ListModulesRequest& request) {
  ListModulesArgs args;
  args.ns = request.namespace_();
  args.page_size = request.page_size();
  args.page_token = request.page_token();
  return args;
}

void ModulePageToProto(const ModulePage& page,
                       v1::ListModulesResponse* response) {
  for (const ModuleSummary& m : page.modules) {
    v1::ModuleSummary* s = response->add_modules();
    s->set_module(m.name.full());
    s->set_type(m.type);
    s->set_num_parameters(m.num_parameters);
    s->set_total_bytes(m.total_bytes);
    for (const std::string& d : m.devices) s->add_devices(d);
  }
  response->set_next_page_token(page.next_page_token);
}

void ModuleLocationToProto(const ModuleName& module,
                           const std::vector<Device>& server_devices,
                           v1::GetModuleResponse* response) {
  response->set_module(module.full());
  for (const Device& d : server_devices) {
    response->add_server_devices(d.ToString());
  }
}

absl::StatusOr<GetStateDictArgs> GetStateDictArgsFromProto(
    const v1::GetStateDictRequest& request) {
  GetStateDictArgs args;
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleField(request.module()));
  args.chunk_bytes = request.chunk_bytes();
  if (request.target_dtype() != v1::DTYPE_UNSPECIFIED) {
    MODELSTATE_ASSIGN_OR_RETURN(
        args.target_dtype,
        DTypeFromProto(request.target_dtype(), "target_dtype"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckGlob(request.key_glob(), "key_glob"));
  args.filter.key_prefix = request.key_prefix();
  args.filter.key_glob = request.key_glob();
  switch (request.selection()) {
    case v1::GetStateDictRequest::SELECTION_PARAMETERS:
      args.filter.selection = SnapshotFilter::Selection::kParameters;
      break;
    case v1::GetStateDictRequest::SELECTION_BUFFERS:
      args.filter.selection = SnapshotFilter::Selection::kBuffers;
      break;
    case v1::GetStateDictRequest::SELECTION_STATE_DICT:
      break;
    default:
      return FieldError("selection",
                        absl::StrCat("unknown value ", request.selection()));
  }
  return args;
}

absl::StatusOr<LoadStateDictArgs> LoadStateDictArgsFromProto(
    const v1::LoadStart& start) {
  LoadStateDictArgs args;
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleField(start.module()));
  MODELSTATE_ASSIGN_OR_RETURN(args.layout, HeaderToLayout(start.header()));
  args.options = LoadOptionsFromProto(start.options());
  return args;
}

absl::StatusOr<MoveModuleArgs> MoveModuleArgsFromProto(
    const v1::MoveModuleRequest& request) {
  MoveModuleArgs args;
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleField(request.module()));
  if (!request.device().empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        args.device,
        ParseDeviceField(request.device(), "device", std::nullopt));
  }
  if (!request.dtype().empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        args.dtype, ParseDTypeField(request.dtype(), "dtype", std::nullopt));
  }
  args.convert_all = request.convert_all();
  if (args.convert_all && !args.dtype.has_value()) {
    return absl::InvalidArgumentError(
        "convert_all: needs the dtype every tensor converts to");
  }
  return args;
}

absl::StatusOr<ForwardArgs> ForwardArgsFromProto(
    const v1::ForwardRequest& request, uint64_t max_tensor_bytes) {
  ForwardArgs args;
  MODELSTATE_ASSIGN_OR_RETURN(args.module, ParseModuleField(request.module()));
  args.path = request.path();
  for (int i = 0; i < request.inputs_size(); ++i) {
    v1::TensorProto proto = request.inputs(i);
    if (proto.dtype() == v1::DTYPE_UNSPECIFIED && proto.shape_size() == 0 &&
        proto.data().empty()) {
      args.inputs.emplace_back();  // None
      continue;
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor input, TensorFromProto(&proto, absl::StrCat("inputs[", i, "]"),
                                      max_tensor_bytes));
    args.inputs.push_back(std::move(input));
  }
  if (request.has_training()) args.training = request.training();
  args.seed = request.seed();
  return args;
}

absl::Status ForwardOutputsToProto(const std::vector<Tensor>& outputs,
                                   v1::ForwardResponse* response) {
  for (const Tensor& out : outputs) {
    v1::TensorProto* proto = response->add_outputs();
    if (out.defined()) MODELSTATE_RETURN_IF_ERROR(TensorToProto(out, proto));
  }
  return absl::OkStatus();
}

void SubscribersToProto(const std::vector<SubscriberInfo>& subscribers,
                        v1::ListSubscribersResponse* response) {
  for (const SubscriberInfo& info : subscribers) {
    v1::SubscriberInfoProto* out = response->add_subscribers();
    out->set_subscriber_id(info.id);
    SubscriptionToProto(info.spec, out->mutable_subscription());
    out->set_order(info.order);
    out->set_pending_events(info.pending);
  }
}

void AuditPageToProto(const AuditPage& page, v1::QueryAuditResponse* response) {
  for (const AuditRecord& r : page.records) {
    AuditRecordToProto(r, response->add_records());
  }
  if (page.next_after_seq.has_value()) {
    response->set_next_after_seq(*page.next_after_seq);
  }
}

void VerificationToProto(const AuditVerification& verification,
                         v1::VerifyAuditResponse* response) {
  response->set_records(verification.records);
  response->set_ok(verification.ok);
  response->set_broken_seq(verification.broken_seq);
  response->set_broken_line(verification.broken_line);
  response->set_problem(verification.problem);
}

void HashesToProto(const std::vector<MerkleHash>& hashes,
                   google::protobuf::RepeatedPtrField<std::string>* out) {
  for (const MerkleHash& h : hashes) {
    out->Add(std::string(reinterpret_cast<const char*>(h.data()), h.size()));
  }
}

void InclusionToProto(const AuditInclusion& inclusion,
                      v1::GetInclusionProofResponse* response) {
  response->set_seq(inclusion.seq);
  response->set_tree_size(inclusion.tree_size);
  response->set_leaf_hash(
      std::string(reinterpret_cast<const char*>(inclusion.leaf_hash.data()),
                  inclusion.leaf_hash.size()));
  HashesToProto(inclusion.proof, response->mutable_proof());
  response->set_record_line(inclusion.record_line);
}

void DevicesToProto(const std::vector<DeviceDescription>& devices,
                    v1::ListDevicesResponse* response) {
  for (const DeviceDescription& d : devices) {
    v1::DeviceInfo* info = response->add_devices();
    info->set_device(d.device.ToString());
    info->set_description(d.description);
    info->set_total_bytes(d.total_bytes);
    info->set_free_bytes(d.free_bytes);
  }
}

}  // namespace modelstate::convert
