// File: spec_json.h
// Test helper: a ModuleSpec from JSON text shaped like the service's spec
// files (the proto's JSON mapping), so tests can state module trees
// compactly.
//
// Example:
//   ModuleSpec spec = SpecFromJson(R"({"type": "Linear", "args": [5, 5]})");
//   absl::StatusOr<BuildResult> built =
//       BuildFromJson(R"({"type": "Linear", "args": [5, 5]})");
#ifndef MODELSTATE_TESTS_TESTING_SPEC_JSON_H_
#define MODELSTATE_TESTS_TESTING_SPEC_JSON_H_

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/module_spec.h"

namespace modelstate::testing {

inline SpecValue SpecValueFromJson(const nlohmann::json& j) {
  if (j.is_null()) return std::monostate();
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  std::vector<int64_t> ints;
  std::vector<double> floats;
  bool integral = true;
  for (const auto& e : j) {
    integral = integral && e.is_number_integer();
    floats.push_back(e.get<double>());
    if (e.is_number_integer()) ints.push_back(e.get<int64_t>());
  }
  if (!integral) return floats;
  return ints;
}

inline InitSpec InitFromJson(const nlohmann::json& j) {
  static const std::pair<const char*, InitSpec::Kind> kKinds[] = {
      {"zeros", InitSpec::Kind::kZeros},
      {"ones", InitSpec::Kind::kOnes},
      {"constant", InitSpec::Kind::kConstant},
      {"uniform", InitSpec::Kind::kUniform},
      {"normal", InitSpec::Kind::kNormal},
      {"kaiming_uniform", InitSpec::Kind::kKaimingUniform},
      {"xavier_uniform", InitSpec::Kind::kXavierUniform},
      {"xavier_normal", InitSpec::Kind::kXavierNormal},
      {"empty", InitSpec::Kind::kEmpty}};
  InitSpec init;
  std::string kind = j.value("kind", "zeros");
  bool found = false;
  for (const auto& [name, k] : kKinds) {
    if (kind == name) {
      init.kind = k;
      found = true;
    }
  }
  EXPECT_TRUE(found) << "unknown init kind " << kind;
  init.a = j.value("a", 0.0);
  init.b = j.value("b", 1.0);
  if (j.contains("seed")) init.seed = j["seed"].get<uint64_t>();
  return init;
}

inline ModuleSpec SpecFromJsonValue(const nlohmann::json& j) {
  ModuleSpec spec;
  spec.type = j.value("type", "");
  spec.ref = j.value("ref", "");
  spec.has_extra_state = j.value("extra_state", false);
  spec.custom = j.value("custom", false);
  if (j.contains("args")) {
    for (const auto& a : j["args"]) spec.args.push_back(SpecValueFromJson(a));
  }
  if (j.contains("kwargs")) {
    for (const auto& [k, v] : j["kwargs"].items()) {
      spec.kwargs.emplace_back(k, SpecValueFromJson(v));
    }
  }
  if (j.contains("children")) {
    for (const auto& c : j["children"]) {
      spec.children.push_back(
          {c.value("name", ""), SpecFromJsonValue(c["spec"])});
    }
  }
  if (j.contains("members")) {
    for (const auto& m : j["members"]) {
      MemberSpec member;
      const nlohmann::json* body = nullptr;
      if (m.contains("parameter")) {
        member.kind = EntryKind::kParameter;
        body = &m["parameter"];
      } else if (m.contains("buffer")) {
        member.kind = EntryKind::kBuffer;
        body = &m["buffer"];
      } else {
        member.kind = EntryKind::kModule;
        body = &m["module"];
      }
      member.name = body->value("name", "");
      member.is_none = body->value("none", false);
      member.requires_grad = body->value("requires_grad", true);
      member.persistent = body->value("persistent", true);
      if (body->contains("dtype")) {
        absl::StatusOr<DType> dt =
            ParseDType((*body)["dtype"].get<std::string>());
        EXPECT_TRUE(dt.ok()) << dt.status();
        if (dt.ok()) member.tensor.dtype = *dt;
      }
      if (body->contains("shape")) {
        member.tensor.shape = (*body)["shape"].get<std::vector<int64_t>>();
      }
      if (body->contains("init"))
        member.tensor.init = InitFromJson((*body)["init"]);
      if (member.kind == EntryKind::kModule && body->contains("spec")) {
        member.module =
            std::make_shared<ModuleSpec>(SpecFromJsonValue((*body)["spec"]));
      }
      spec.members.push_back(std::move(member));
    }
  }
  if (j.contains("ties")) {
    for (const auto& t : j["ties"]) {
      spec.ties.push_back(
          {t["target"].get<std::string>(), t["source"].get<std::string>()});
    }
  }
  return spec;
}

inline ModuleSpec SpecFromJson(const std::string& text) {
  return SpecFromJsonValue(nlohmann::json::parse(text));
}

// The module `text` describes, built with no global registration hooks
// (the layer tests check layers, not hooks).
inline absl::StatusOr<BuildResult> BuildFromJson(const std::string& text) {
  BuildOptions options;
  options.hooks = nullptr;
  return BuildModule(SpecFromJson(text), options);
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_SPEC_JSON_H_
