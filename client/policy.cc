#include "client/policy.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/glob.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "proto/convert.h"

namespace modelstate::client {
namespace {

absl::Status RuleError(size_t i, absl::string_view field,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("rules[", i, "].", field, ": ", what));
}

// A string or a list of strings.
absl::StatusOr<std::vector<std::string>> Strings(const nlohmann::json& j,
                                                 size_t i,
                                                 absl::string_view field) {
  std::vector<std::string> out;
  if (j.is_string()) {
    out.push_back(j.get<std::string>());
  } else if (j.is_array()) {
    for (const auto& e : j) {
      if (!e.is_string()) return RuleError(i, field, "expected strings");
      out.push_back(e.get<std::string>());
    }
  } else {
    return RuleError(i, field, "expected a string or a list of strings");
  }
  return out;
}

bool AnyGlob(const std::vector<std::string>& globs, const std::string& text) {
  if (globs.empty()) return true;
  for (const std::string& g : globs) {
    if (GlobMatch(g, text)) return true;
  }
  return false;
}

absl::StatusOr<v1::TransformProto> TransformFromJson(const nlohmann::json& j,
                                                     size_t i) {
  v1::TransformProto t;
  if (!j.is_object()) return RuleError(i, "transform", "expected an object");
  for (const auto& [key, value] : j.items()) {
    if (key == "cast") {
      if (!value.is_string())
        return RuleError(i, "transform.cast", "expected a dtype");
      absl::StatusOr<DType> d = ParseDType(value.get<std::string>());
      if (!d.ok()) return RuleError(i, "transform.cast", d.status().message());
      t.set_cast(convert::DTypeToProto(*d));
    } else if (key == "device") {
      if (!value.is_string())
        return RuleError(i, "transform.device", "expected a device");
      t.set_device(value.get<std::string>());
    } else if (key == "requires_grad") {
      if (!value.is_boolean())
        return RuleError(i, "transform.requires_grad", "expected a bool");
      t.set_requires_grad(value.get<bool>());
    } else if (key == "persistent") {
      if (!value.is_boolean())
        return RuleError(i, "transform.persistent", "expected a bool");
      t.set_persistent(value.get<bool>());
    } else if (key == "reinit") {
      if (!value.is_object())
        return RuleError(i, "transform.reinit", "expected an object");
      v1::InitSpec* init = t.mutable_reinit();
      std::string kind = value.value("kind", "");
      if (kind != "zeros" && kind != "ones" && kind != "constant" &&
          kind != "uniform" && kind != "normal") {
        return RuleError(i, "transform.reinit.kind",
                         absl::StrCat("'", kind,
                                      "' is not zeros, ones, constant, uniform "
                                      "or normal"));
      }
      init->set_kind(kind);
      if (value.contains("a")) init->set_a(value["a"].get<double>());
      if (value.contains("b")) init->set_b(value["b"].get<double>());
      if (value.contains("seed")) init->set_seed(value["seed"].get<uint64_t>());
    } else {
      return RuleError(i, absl::StrCat("transform.", key), "unknown field");
    }
  }
  return t;
}

// Adds one item of the match field `key` to `rule`.
absl::Status AddMatchItem(const std::string& key, const std::string& item,
                          size_t i, const std::string& field,
                          PolicyRule& rule) {
  if (key == "kind") {
    if (item == "parameter") {
      rule.kinds.push_back(v1::ENTRY_KIND_PARAMETER);
    } else if (item == "buffer") {
      rule.kinds.push_back(v1::ENTRY_KIND_BUFFER);
    } else if (item == "module") {
      rule.kinds.push_back(v1::ENTRY_KIND_MODULE);
    } else {
      return RuleError(
          i, field,
          absl::StrCat("'", item, "' is not parameter, buffer or module"));
    }
  } else if (key == "action") {
    if (item == "register") {
      rule.actions.push_back(v1::REGISTRATION_ACTION_REGISTER);
    } else if (item == "unregister") {
      rule.actions.push_back(v1::REGISTRATION_ACTION_UNREGISTER);
    } else {
      return RuleError(
          i, field, absl::StrCat("'", item, "' is not register or unregister"));
    }
  } else if (key == "type") {
    rule.type_globs.push_back(item);
  } else if (key == "name") {
    rule.name_globs.push_back(item);
  } else if (key == "path") {
    rule.path_globs.push_back(item);
  } else if (key == "module") {
    rule.module_globs.push_back(item);
  } else if (key == "dtype") {
    absl::StatusOr<DType> d = ParseDType(item);
    if (!d.ok()) return RuleError(i, field, d.status().message());
    rule.dtypes.push_back(*d);
  } else {
    return RuleError(i, field, "unknown field");
  }
  return absl::OkStatus();
}

// The "match" object of rule `i`.
absl::Status ParseMatch(const nlohmann::json& match, size_t i,
                        PolicyRule& rule) {
  if (!match.is_object()) return RuleError(i, "match", "expected an object");
  for (const auto& [key, value] : match.items()) {
    std::string field = absl::StrCat("match.", key);
    if (key == "shape") {
      if (!value.is_array())
        return RuleError(i, field, "expected a list of ints");
      std::vector<int64_t> shape;
      for (const auto& d : value) {
        if (!d.is_number_integer())
          return RuleError(i, field, "expected a list of ints");
        shape.push_back(d.get<int64_t>());
      }
      rule.shape = std::move(shape);
      continue;
    }
    absl::StatusOr<std::vector<std::string>> items = Strings(value, i, field);
    if (!items.ok()) return items.status();
    for (const std::string& item : *items) {
      MODELSTATE_RETURN_IF_ERROR(AddMatchItem(key, item, i, field, rule));
    }
  }
  return absl::OkStatus();
}

// Rule `i` of the "rules" list.
absl::StatusOr<PolicyRule> ParseRule(const nlohmann::json& r, size_t i) {
  if (!r.is_object()) return RuleError(i, "", "expected an object");
  PolicyRule rule;
  MODELSTATE_RETURN_IF_ERROR(
      ParseMatch(r.value("match", nlohmann::json::object()), i, rule));
  std::string action = r.value("action", "approve");
  if (action == "approve") {
    rule.verdict = v1::HookAnswer::APPROVE;
  } else if (action == "reject") {
    rule.verdict = v1::HookAnswer::REJECT;
  } else if (action == "modify") {
    rule.verdict = v1::HookAnswer::MODIFY;
    if (!r.contains("transform")) {
      return RuleError(i, "transform", "a modify rule needs a transform");
    }
  } else {
    return RuleError(
        i, "action",
        absl::StrCat("'", action, "' is not approve, reject or modify"));
  }
  if (r.contains("transform")) {
    absl::StatusOr<v1::TransformProto> t = TransformFromJson(r["transform"], i);
    if (!t.ok()) return t.status();
    rule.transform = *t;
  }
  rule.reason = r.value("reason", "");
  rule.log = r.value("log", false);
  for (const auto& [key, value] : r.items()) {
    if (key != "match" && key != "action" && key != "transform" &&
        key != "reason" && key != "log") {
      return RuleError(i, key, "unknown field");
    }
  }
  return rule;
}

}  // namespace

absl::StatusOr<Policy> Policy::FromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("policy: not a JSON object");
  }
  Policy policy;
  for (const auto& [key, value] : j.items()) {
    if (key != "subscription" && key != "rules" && key != "default") {
      return absl::InvalidArgumentError(
          absl::StrCat("policy: unknown field '", key, "'"));
    }
  }
  if (j.contains("subscription")) {
    google::protobuf::util::JsonParseOptions options;
    auto status = google::protobuf::util::JsonStringToMessage(
        j["subscription"].dump(), &policy.subscription_, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("subscription: ", status.message().as_string()));
    }
  }
  std::string def = j.value("default", "approve");
  if (def == "approve") {
    policy.default_verdict_ = v1::HookAnswer::APPROVE;
  } else if (def == "reject") {
    policy.default_verdict_ = v1::HookAnswer::REJECT;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("default: '", def, "' is not approve or reject"));
  }
  if (!j.contains("rules")) return policy;
  if (!j["rules"].is_array())
    return absl::InvalidArgumentError("rules: expected a list");
  for (size_t i = 0; i < j["rules"].size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(PolicyRule rule, ParseRule(j["rules"][i], i));
    policy.rules_.push_back(std::move(rule));
  }
  return policy;
}

std::string DescribeEvent(const v1::HookEventProto& event) {
  std::string what =
      event.has_value()
          ? absl::StrCat(
                DTypeName(convert::DTypeFromProto(event.value().dtype(), "")
                              .value_or(DType::kFloat32)),
                "[", absl::StrJoin(event.value().shape(), ", "), "]")
      : event.value_module_type().empty() ? std::string("None")
                                          : event.value_module_type();
  std::string kind = event.kind() == v1::ENTRY_KIND_PARAMETER ? "parameter"
                     : event.kind() == v1::ENTRY_KIND_BUFFER  ? "buffer"
                                                              : "module";
  std::string key = event.path().empty()
                        ? event.name()
                        : absl::StrCat(event.path(), ".", event.name());
  return absl::StrCat(
      key, ": ",
      event.action() == v1::REGISTRATION_ACTION_UNREGISTER ? "unregister " : "",
      kind, " ", what, " in ", event.module_type(), " (", event.namespace_(),
      "/", event.module(), ")");
}

v1::HookAnswer Policy::Decide(const v1::HookEventProto& event,
                              std::string* log_line) const {
  v1::HookAnswer answer;
  answer.set_event_id(event.event_id());
  std::string key = event.path().empty()
                        ? event.name()
                        : absl::StrCat(event.path(), ".", event.name());
  std::string module = absl::StrCat(event.namespace_(), "/", event.module());
  for (const PolicyRule& rule : rules_) {
    auto in = [](const auto& list, const auto& v) {
      return list.empty() ||
             std::find(list.begin(), list.end(), v) != list.end();
    };
    if (!in(rule.kinds, event.kind()) || !in(rule.actions, event.action()) ||
        !AnyGlob(rule.type_globs, event.module_type()) ||
        !AnyGlob(rule.name_globs, event.name()) ||
        !AnyGlob(rule.path_globs, key) || !AnyGlob(rule.module_globs, module)) {
      continue;
    }
    if (!rule.dtypes.empty() || rule.shape.has_value()) {
      if (!event.has_value()) continue;
      absl::StatusOr<DType> dtype =
          convert::DTypeFromProto(event.value().dtype(), "");
      if (!rule.dtypes.empty() && (!dtype.ok() || !in(rule.dtypes, *dtype)))
        continue;
      if (rule.shape.has_value() &&
          std::vector<int64_t>(event.value().shape().begin(),
                               event.value().shape().end()) != *rule.shape) {
        continue;
      }
    }
    answer.set_verdict(rule.verdict);
    answer.set_reason(rule.reason);
    if (rule.verdict == v1::HookAnswer::MODIFY && rule.transform.has_value()) {
      *answer.mutable_transform() = *rule.transform;
    }
    if (rule.log && log_line != nullptr) {
      *log_line = absl::StrCat(DescribeEvent(event), " -> ",
                               v1::HookAnswer::Verdict_Name(rule.verdict),
                               rule.reason.empty() ? "" : ": ", rule.reason);
    }
    return answer;
  }
  answer.set_verdict(default_verdict_);
  return answer;
}

}  // namespace modelstate::client
