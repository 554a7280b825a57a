// File: policy.h
// Declarative registration policies: an ordered list of rules, each with a
// match (kind, action, module type, name, path, module, dtype, shape) and an
// action (approve, reject, or modify with a transform). The first matching
// rule decides; unmatched events get the default action. This is what
// `modelstatectl subscribe --policy rules.json` runs as a remote
// interceptor.
//
// File format (JSON):
//   {
//     "subscription": {"name": "float32-only", "priority": 10,
//                      "timeout_ms": 5000, "failure_policy": "FAIL_CLOSED",
//                      "kinds": ["ENTRY_KIND_BUFFER"]},
//     "rules": [
//       {"match": {"kind": "buffer", "name": "temp_buffer"},
//        "action": "reject", "reason": "Blocking temporary buffer"},
//       {"match": {"dtype": ["float64", "float16"]},
//        "action": "modify", "transform": {"cast": "float32"}}
//     ],
//     "default": "approve"
//   }
// "subscription" is the Subscription message in protobuf's JSON mapping.
// Match fields (all optional; a list matches any of its items): "kind"
// (parameter, buffer, module), "action" (register, unregister), "type" and
// "name" and "path" and "module" (globs with * and ?; "module" is
// "namespace/name"), "dtype" (any spelling), "shape" (exact, e.g. [3, 4]).
// "transform" fields: "cast" (dtype), "device", "requires_grad",
// "persistent", "reinit" ({"kind": "uniform"|"normal"|"constant"|"zeros"|
// "ones", "a", "b", "seed"}). "log": true prints every event the rule
// matches.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(Policy policy, Policy::FromJson(text));
//   v1::HookAnswer answer = policy.Decide(event);
#ifndef MODELSTATE_CLIENT_POLICY_H_
#define MODELSTATE_CLIENT_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::client {

struct PolicyRule {
  std::vector<v1::EntryKind> kinds;
  std::vector<v1::RegistrationAction> actions;
  std::vector<std::string> type_globs;
  std::vector<std::string> name_globs;
  std::vector<std::string> path_globs;
  std::vector<std::string> module_globs;
  std::vector<DType> dtypes;
  std::optional<std::vector<int64_t>> shape;
  v1::HookAnswer::Verdict verdict = v1::HookAnswer::APPROVE;
  std::string reason;
  std::optional<v1::TransformProto> transform;
  bool log = false;
};

// Immutable after FromJson; thread-safe.
class Policy {
 public:
  // INVALID_ARGUMENT naming the offending rule and field.
  static absl::StatusOr<Policy> FromJson(const std::string& text);

  const v1::Subscription& subscription() const { return subscription_; }
  const std::vector<PolicyRule>& rules() const { return rules_; }

  // The answer for `event`, and (when a rule asks to log it) a line
  // describing the event and the decision.
  v1::HookAnswer Decide(const v1::HookEventProto& event,
                        std::string* log_line = nullptr) const;

 private:
  v1::Subscription subscription_;
  std::vector<PolicyRule> rules_;
  v1::HookAnswer::Verdict default_verdict_ = v1::HookAnswer::APPROVE;
};

// "encoder.0.weight: parameter float32[256, 784] in Linear (team/mlp)".
std::string DescribeEvent(const v1::HookEventProto& event);

}  // namespace modelstate::client

#endif  // MODELSTATE_CLIENT_POLICY_H_
