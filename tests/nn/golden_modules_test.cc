// Every module case of shared/golden/modules.json (made by real PyTorch
// 1.13), rebuilt from a ModuleSpec and compared field by field: state_dict
// entries and metadata, keep_vars, every named_* traversal, to(float16), and
// the load_state_dict scenarios.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/module_spec.h"
#include "tests/testing/golden.h"
#include "tests/testing/golden_models.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::Golden;
using ::modelstate::testing::GoldenModelSpecs;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAreArray;

std::vector<std::string> Names(
    const std::vector<std::pair<std::string, Tensor>>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) out.push_back(item.first);
  return out;
}

std::vector<std::string> GoldenStrings(const nlohmann::json& j) {
  return j.get<std::vector<std::string>>();
}

std::shared_ptr<Module> BuildCase(const std::string& name) {
  BuildOptions options;
  options.seed = 0;
  options.hooks = nullptr;
  absl::StatusOr<BuildResult> built =
      BuildModule(SpecFromJson(GoldenModelSpecs().at(name)), options);
  EXPECT_TRUE(built.ok()) << name << ": " << built.status();
  return built.ok() ? built->root : nullptr;
}

// PyTorch's sentinel_state_dict: the module's keys, floating entries filled
// with 0.5, others with 7; a plain dict (no metadata).
StateDict Sentinel(const Module& m) {
  StateDict d;
  for (const auto& item : m.GetStateDict().tensors) {
    const Tensor& t = item.value;
    if (item.key.size() >= 12 &&
        item.key.substr(item.key.size() - 12) == "_extra_state") {
      d.tensors.Set(item.key, t);
      continue;
    }
    absl::StatusOr<Tensor> s = Tensor::Full(
        t.dtype(), t.shape(), IsFloatingPoint(t.dtype()) ? 0.5 : 7.0);
    EXPECT_TRUE(s.ok());
    d.tensors.Set(item.key, *s);
  }
  return d;
}

// True if `value` equals `offered` converted to value's dtype.
bool HoldsValue(const Tensor& value, const Tensor& offered) {
  if (value.shape() != offered.shape() || value.numel() == 0) return false;
  absl::StatusOr<Tensor> converted = offered.To(value.device(), value.dtype());
  return converted.ok() && TensorsEqual(value, *converted);
}

// make_golden.py's keys_holding_sentinel.
std::vector<std::string> KeysHoldingSentinel(const Module& m,
                                             const StateDict& loaded) {
  StateDict sentinel = Sentinel(m);
  std::vector<std::string> out;
  for (const auto& item : m.GetStateDict().tensors) {
    const Tensor* src = loaded.tensors.Find(item.key);
    if (src == nullptr) src = sentinel.tensors.Find(item.key);
    if (src != nullptr && HoldsValue(item.value, *src)) out.push_back(item.key);
  }
  return out;
}

class GoldenModulesTest : public ::testing::TestWithParam<std::string> {
 protected:
  const nlohmann::json& Case() const {
    return Golden("modules.json")["cases"][GetParam()];
  }
};

std::vector<std::string> AllCases() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Golden("modules.json")["cases"].items()) {
    names.push_back(name);
  }
  return names;
}

TEST(GoldenModulesCoverageTest, EveryGoldenCaseHasASpec) {
  std::set<std::string> golden;
  for (const std::string& name : AllCases()) golden.insert(name);
  std::set<std::string> ours;
  for (const auto& [name, spec] : GoldenModelSpecs()) ours.insert(name);
  EXPECT_EQ(golden, ours);
}

TEST_P(GoldenModulesTest, StateDictEntriesMatch) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->type_name(), Case()["class_name"].get<std::string>());
  StateDict sd = m->GetStateDict();
  const nlohmann::json& entries = Case()["state_dict"];
  ASSERT_EQ(sd.tensors.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    const auto& item = sd.tensors.at(i);
    SCOPED_TRACE(item.key);
    EXPECT_EQ(item.key, e["key"].get<std::string>());
    if (e["kind"] == "extra_state") continue;
    EXPECT_EQ(item.value.shape(), e["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(DTypeName(item.value.dtype()), e["dtype"].get<std::string>());
    EXPECT_EQ(item.value.requires_grad(), e["requires_grad"].get<bool>());
    bool is_param = e["kind"] == "parameter";
    auto [owner_path, name] = [&] {
      size_t dot = item.key.rfind('.');
      return dot == std::string::npos
                 ? std::make_pair(std::string(), item.key)
                 : std::make_pair(item.key.substr(0, dot),
                                  item.key.substr(dot + 1));
    }();
    absl::StatusOr<std::shared_ptr<Module>> owner = m->GetSubmodule(owner_path);
    ASSERT_TRUE(owner.ok());
    EXPECT_EQ((*owner)->parameters().Contains(name), is_param);
  }
  EXPECT_THAT(sd.tensors.Keys(),
              ElementsAreArray(GoldenStrings(Case()["state_dict_keys"])));
}

TEST_P(GoldenModulesTest, StateDictMetadataMatches) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  for (const auto& [prefix, field] :
       {std::make_pair(std::string(), std::string("state_dict_metadata")),
        std::make_pair(std::string("pfx."),
                       std::string("state_dict_metadata_with_prefix_pfx"))}) {
    StateDict sd = m->GetStateDict(prefix);
    ASSERT_TRUE(sd.metadata.has_value());
    std::map<std::string, int> ours;
    for (const auto& item : *sd.metadata) ours[item.key] = item.value;
    std::map<std::string, int> golden;
    for (const auto& [k, v] : Case()[field].items()) {
      golden[k] = v["version"].get<int>();
    }
    EXPECT_EQ(ours, golden) << field;
  }
  EXPECT_THAT(m->GetStateDict("pfx.").tensors.Keys(),
              ElementsAreArray(
                  GoldenStrings(Case()["state_dict_keys_with_prefix_pfx"])));
}

TEST_P(GoldenModulesTest, KeepVarsReturnsTheModulesOwnTensors) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  StateDict kept = m->GetStateDict("", /*keep_vars=*/true);
  StateDict detached = m->GetStateDict();
  for (const auto& [key, type] : Case()["state_dict_keep_vars_types"].items()) {
    SCOPED_TRACE(key);
    const Tensor* t = kept.tensors.Find(key);
    ASSERT_NE(t, nullptr);
    if (type == "dict") continue;  // extra state
    EXPECT_EQ(t->is_parameter(), type == "Parameter");
    // Detached entries share storage but are other tensor objects.
    const Tensor* d = detached.tensors.Find(key);
    ASSERT_NE(d, nullptr);
    EXPECT_FALSE(d->is_same(*t));
    EXPECT_FALSE(d->is_parameter());
    if (t->numel() > 0) {
      EXPECT_TRUE(d->SharesStorageWith(*t));
    }
  }
}

TEST_P(GoldenModulesTest, NamedParametersAndBuffersMatch) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  const nlohmann::json& c = Case();
  EXPECT_THAT(Names(m->NamedParameters()),
              ElementsAreArray(GoldenStrings(c["named_parameters"])));
  EXPECT_THAT(Names(m->NamedParameters("", true, /*remove_duplicate=*/false)),
              ElementsAreArray(GoldenStrings(
                  c["named_parameters_remove_duplicate_false_2x"])));
  EXPECT_THAT(
      Names(m->NamedParameters("", /*recurse=*/false)),
      ElementsAreArray(GoldenStrings(c["named_parameters_recurse_false"])));
  EXPECT_THAT(
      Names(m->NamedParameters("pfx")),
      ElementsAreArray(GoldenStrings(c["named_parameters_prefix_pfx"])));
  for (const auto& [name, t] : m->NamedParameters()) {
    EXPECT_EQ(t.requires_grad(), c["parameter_requires_grad"][name].get<bool>())
        << name;
  }
  EXPECT_THAT(Names(m->NamedBuffers()),
              ElementsAreArray(GoldenStrings(c["named_buffers"])));
  EXPECT_THAT(
      Names(m->NamedBuffers("", /*recurse=*/false)),
      ElementsAreArray(GoldenStrings(c["named_buffers_recurse_false"])));
  std::vector<std::pair<std::string, Tensor>> params = m->NamedParameters();
  EXPECT_EQ(static_cast<int>(params.size()), c["num_parameters"].get<int>());
  int64_t elements = 0;
  for (const auto& [name, t] : params) elements += t.numel();
  EXPECT_EQ(elements, c["num_parameter_elements"].get<int64_t>());
}

TEST_P(GoldenModulesTest, NamedModulesAndChildrenMatch) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  const nlohmann::json& c = Case();
  auto pairs = [](const auto& items) {
    std::vector<std::vector<std::string>> out;
    for (const auto& [name, module] : items) {
      out.push_back({name, module->type_name()});
    }
    return out;
  };
  EXPECT_EQ(pairs(m->NamedModules()),
            c["named_modules"].get<std::vector<std::vector<std::string>>>());
  EXPECT_EQ(pairs(m->NamedModules("", /*remove_duplicate=*/false)),
            c["named_modules_remove_duplicate_false"]
                .get<std::vector<std::vector<std::string>>>());
  std::vector<std::string> rooted;
  for (const auto& [name, module] : m->NamedModules("root")) {
    rooted.push_back(name);
  }
  EXPECT_THAT(rooted,
              ElementsAreArray(GoldenStrings(c["named_modules_prefix_root"])));
  std::vector<std::string> children;
  for (const auto& [name, module] : m->NamedChildren())
    children.push_back(name);
  EXPECT_THAT(children, ElementsAreArray(GoldenStrings(c["named_children"])));
}

TEST_P(GoldenModulesTest, ToFloat16MatchesPyTorch) {
  std::shared_ptr<Module> m = BuildCase(GetParam());
  ASSERT_NE(m, nullptr);
  const nlohmann::json& golden = Case()["after_to_float16"];
  std::vector<std::pair<std::string, Tensor>> params_before =
      m->NamedParameters();
  std::map<std::string, bool> grad_before;
  for (const auto& [n, t] : params_before) grad_before[n] = t.requires_grad();
  std::vector<std::pair<std::string, Tensor>> buffers_before =
      m->NamedBuffers();

  MODELSTATE_ASSERT_OK(m->To(std::nullopt, DType::kFloat16));

  StateDict converted = m->GetStateDict();
  for (const auto& [key, dtype] : golden["dtypes"].items()) {
    const Tensor* t = converted.tensors.Find(key);
    ASSERT_NE(t, nullptr) << key;
    EXPECT_EQ(DTypeName(t->dtype()), dtype.get<std::string>()) << key;
  }
  std::vector<std::pair<std::string, Tensor>> params_after =
      m->NamedParameters();
  ASSERT_EQ(params_after.size(), params_before.size());
  bool same_objects = true;
  bool grads_kept = true;
  for (size_t i = 0; i < params_after.size(); ++i) {
    same_objects &= params_after[i].second.is_same(params_before[i].second);
    grads_kept &= params_after[i].second.requires_grad() ==
                  grad_before[params_after[i].first];
  }
  EXPECT_EQ(same_objects, golden["parameters_same_object"].get<bool>());
  EXPECT_EQ(grads_kept, golden["requires_grad_preserved"].get<bool>());
  std::vector<std::pair<std::string, Tensor>> buffers_after = m->NamedBuffers();
  for (size_t i = 0; i < buffers_after.size(); ++i) {
    const std::string& name = buffers_after[i].first;
    EXPECT_EQ(buffers_after[i].second.is_same(buffers_before[i].second),
              golden["buffers_same_object"][name].get<bool>())
        << name;
  }
}

// Runs one scenario of modules.json -> load_state_dict on a fresh module,
// with PyTorch's non-atomic behaviour, and checks the outcome.
void ExpectScenario(const std::string& case_name, const std::string& scenario,
                    const nlohmann::json& golden, const StateDict& offered,
                    bool strict, std::shared_ptr<Module> m) {
  SCOPED_TRACE(scenario);
  LoadOptions options;
  options.strict = strict;
  options.atomic = false;
  absl::StatusOr<LoadResult> result = m->LoadStateDict(offered, options);
  if (golden["raised"].is_null()) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->keys.missing_keys,
              GoldenStrings(golden["result"]["missing_keys"]));
    EXPECT_EQ(result->keys.unexpected_keys,
              GoldenStrings(golden["result"]["unexpected_keys"]));
    EXPECT_EQ(result->keys.ToString(),
              golden["result"]["repr"].get<std::string>());
  } else {
    EXPECT_EQ(golden["raised"].get<std::string>(), "RuntimeError");
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 golden["message"].get<std::string>()));
    if (golden.contains("keys_copied_despite_error")) {
      EXPECT_EQ(KeysHoldingSentinel(*m, offered),
                GoldenStrings(golden["keys_copied_despite_error"]));
    }
    // The same load in the default atomic mode changes nothing.
    std::shared_ptr<Module> fresh = BuildCase(case_name);
    StateDict before = fresh->GetStateDict();
    LoadOptions atomic = options;
    atomic.atomic = true;
    EXPECT_THAT(fresh->LoadStateDict(offered, atomic),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         golden["message"].get<std::string>()));
    for (const auto& item : fresh->GetStateDict().tensors) {
      const Tensor* old = before.tensors.Find(item.key);
      ASSERT_NE(old, nullptr);
      EXPECT_TRUE(TensorsEqual(item.value, *old)) << item.key;
    }
  }
}

TEST_P(GoldenModulesTest, LoadStateDictScenariosMatch) {
  const std::string name = GetParam();
  const nlohmann::json& scenarios = Case()["load_state_dict"];
  for (const auto& [scenario, golden] : scenarios.items()) {
    std::shared_ptr<Module> m = BuildCase(name);
    ASSERT_NE(m, nullptr);
    StateDict offered;
    bool strict = scenario.find("nonstrict") == std::string::npos;
    if (scenario.rfind("missing_first_key", 0) == 0) {
      offered = Sentinel(*m);
      ASSERT_TRUE(
          offered.tensors.Erase(golden["dropped_key"].get<std::string>()));
    } else if (scenario.rfind("extra_", 0) == 0) {
      offered = Sentinel(*m);
      MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor z,
                                      Tensor::Zeros(DType::kFloat32, {1}));
      offered.tensors.Set(golden["added_key"].get<std::string>(), z);
    } else if (scenario.rfind("shape_mismatch", 0) == 0) {
      offered = Sentinel(*m);
      std::string key = golden["key"].get<std::string>();
      const Tensor& old = *offered.tensors.Find(key);
      Shape shape = old.shape();
      if (shape.empty()) {
        shape = {2, 2};
      } else {
        shape[0] += 1;
      }
      MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor grown,
                                      Tensor::Zeros(old.dtype(), shape));
      offered.tensors.Set(key, grown);
    } else if (scenario == "float64_into_module") {
      StateDict kept = m->GetStateDict("", /*keep_vars=*/true);
      for (const auto& item : m->GetStateDict().tensors) {
        Tensor v = item.value;
        if (IsFloatingPoint(v.dtype())) {
          MODELSTATE_ASSERT_OK_AND_ASSIGN(v, v.To(v.device(), DType::kFloat64));
        }
        offered.tensors.Set(item.key, v);
      }
      offered.metadata = m->GetStateDict().metadata;
      ExpectScenario(name, scenario, golden, offered, strict, m);
      StateDict after = m->GetStateDict("", /*keep_vars=*/true);
      for (const auto& [key, dtype] : golden["resulting_dtypes"].items()) {
        EXPECT_EQ(DTypeName(after.tensors.Find(key)->dtype()),
                  dtype.get<std::string>());
        EXPECT_TRUE(after.tensors.Find(key)->is_same(*kept.tensors.Find(key)))
            << "load must keep the module's tensor objects";
      }
      continue;
    } else if (scenario == "roundtrip_own_state_dict") {
      offered = m->GetStateDict();
    } else {
      ADD_FAILURE() << "unhandled scenario " << scenario;
      continue;
    }
    ExpectScenario(name, scenario, golden, offered, strict, m);
  }
}

INSTANTIATE_TEST_SUITE_P(AllGoldenModules, GoldenModulesTest,
                         ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace modelstate
