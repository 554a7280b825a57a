// The layer table (nn/layer_registry.h): one entry per type, the entry that
// builds a type is the one whose forward runs it, and the names, signatures
// and forwards the entries declare are what the builder and Forward() use.
#include "nn/layer_registry.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/forward.h"
#include "nn/module_spec.h"
#include "tests/testing/layer_examples.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::internal::AllLayers;
using ::modelstate::internal::FindLayer;
using ::modelstate::internal::IsBuildable;
using ::modelstate::internal::LayerDef;
using ::modelstate::testing::BuildFromJson;
using ::modelstate::testing::Filled;
using ::modelstate::testing::LayerExampleJson;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// The float32 elements of `t`.
std::vector<float> Read(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(LayerRegistryTest, EachTypeHasOneEntryFoundByItsName) {
  std::set<std::string> seen;
  for (const LayerDef& def : AllLayers()) {
    SCOPED_TRACE(def.type);
    EXPECT_TRUE(seen.insert(std::string(def.type)).second)
        << "registered twice";
    EXPECT_EQ(FindLayer(def.type), &def);
  }
  EXPECT_EQ(FindLayer("Custom"), nullptr);
  EXPECT_EQ(FindLayer(""), nullptr);
}

TEST(LayerRegistryTest, LayerTypesAreTheBuildableEntriesInTableOrder) {
  std::vector<std::string> buildable;
  for (const LayerDef& def : AllLayers()) {
    if (IsBuildable(def)) buildable.push_back(std::string(def.type));
    EXPECT_EQ(IsLayerType(def.type), IsBuildable(def)) << def.type;
  }
  EXPECT_THAT(LayerTypes(), ElementsAreArray(buildable));
  // PyTorch's layers first, the containers last.
  std::vector<std::string> types = LayerTypes();
  ASSERT_GE(types.size(), 4u);
  EXPECT_EQ(types.front(), "Identity");
  EXPECT_THAT(std::vector<std::string>(types.end() - 3, types.end()),
              ElementsAre("Sequential", "ModuleList", "ModuleDict"));
}

TEST(LayerRegistryTest, BuiltModulesCarryTheirEntrysNames) {
  for (const LayerDef& def : AllLayers()) {
    if (!IsBuildable(def)) continue;
    SCOPED_TRACE(def.type);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        BuildResult built,
        BuildFromJson(LayerExampleJson(std::string(def.type))));
    EXPECT_EQ(built.root->type_name(), def.type);
    EXPECT_EQ(built.root->qualified_name(), def.qualified_name);
  }
}

TEST(LayerRegistryTest, OnlyModuleListAndModuleDictLackAForward) {
  std::vector<std::string> without;
  for (const LayerDef& def : AllLayers()) {
    if (def.forward == nullptr) without.push_back(std::string(def.type));
  }
  EXPECT_THAT(without, ElementsAre("ModuleList", "ModuleDict"));
}

// MultiheadAttention's out_proj is a NonDynamicallyQuantizableLinear: the
// table runs it with Linear's forward, but specs cannot name the type.
TEST(LayerRegistryTest, OutProjRunsLinearsForwardButIsNoLibraryType) {
  EXPECT_FALSE(IsLayerType("NonDynamicallyQuantizableLinear"));
  const LayerDef* def = FindLayer("NonDynamicallyQuantizableLinear");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->forward, FindLayer("Linear")->forward);

  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult mha,
      BuildFromJson(R"({"type": "MultiheadAttention", "args": [2, 1]})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> out_proj,
                                  mha.root->GetSubmodule("out_proj"));
  EXPECT_EQ(out_proj->type_name(), "NonDynamicallyQuantizableLinear");
  // A handle to the parameter writes into its storage.
  Tensor weight = *out_proj->parameters().Find("weight");
  Tensor bias = *out_proj->parameters().Find("bias");
  MODELSTATE_ASSERT_OK(weight.CopyFrom(Filled(DType::kFloat32, {2, 2}, 1)));
  MODELSTATE_ASSERT_OK(bias.CopyFrom(Filled(DType::kFloat32, {2}, 0.5)));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> y,
      Forward(*out_proj, {Filled(DType::kFloat32, {1, 2}, 1.5)}));
  ASSERT_EQ(y.size(), 1u);
  EXPECT_THAT(Read(y[0]), ElementsAre(3.5, 3.5));

  // A spec of that type is a custom module (built from members), which
  // Forward() then runs as a Linear, as before the table.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult custom,
      BuildFromJson(R"({"type": "NonDynamicallyQuantizableLinear",
          "members": [
            {"parameter": {"name": "weight", "init": {"kind": "ones"},
                           "shape": [1, 2]}},
            {"parameter": {"name": "bias", "init": {"kind": "zeros"},
                           "shape": [1]}}]})"));
  EXPECT_EQ(custom.root->qualified_name(),
            "__main__.NonDynamicallyQuantizableLinear");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      y, Forward(*custom.root, {Filled(DType::kFloat32, {1, 2}, 2)}));
  EXPECT_THAT(Read(y[0]), ElementsAre(4));
  EXPECT_THAT(
      BuildFromJson(
          R"({"type": "NonDynamicallyQuantizableLinear", "args": [2, 2]})")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace modelstate
