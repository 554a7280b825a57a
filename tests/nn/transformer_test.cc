// The transformer family's stacks (nn/layers/transformer.cc): module
// arguments as named children, copies of one built layer, Transformer's
// re-drawn matrices as the hooks see them, and argument errors. Values
// against real torch are in tests/python/{layers_match_torch,
// forward_matches_torch}.py.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/hooks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/forward.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<BuildResult> Build(const std::string& json,
                                  const HookRegistry* hooks = nullptr) {
  BuildOptions options;
  options.hooks = hooks;
  return BuildModule(SpecFromJson(json), options);
}

constexpr char kEncoder[] = R"({"type": "TransformerEncoder", "args": [3],
    "children": [{"name": "encoder_layer",
                  "spec": {"type": "TransformerEncoderLayer",
                           "args": [4, 2, 8]}}]})";

TEST(TransformerStackTest, CopiesHoldThePrototypesValuesAtTheirOwnPaths) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, Build(kEncoder));
  const Module& m = *built.root;
  StateDict sd = m.GetStateDict();
  for (const char* key : {"self_attn.in_proj_weight", "linear1.weight",
                          "linear2.bias", "norm2.weight"}) {
    SCOPED_TRACE(key);
    const Tensor* first = sd.tensors.Find(absl::StrCat("layers.0.", key));
    ASSERT_NE(first, nullptr);
    for (int i = 1; i < 3; ++i) {
      const Tensor* copy =
          sd.tensors.Find(absl::StrCat("layers.", i, ".", key));
      ASSERT_NE(copy, nullptr);
      EXPECT_TRUE(TensorsEqual(*copy, *first));
      EXPECT_FALSE(copy->is_same(*first));  // copies, not ties
    }
  }
  // `norm=None` is a plain attribute, not a None submodule.
  EXPECT_EQ(m.children().Find("norm"), nullptr);
  ASSERT_NE(m.attributes().Find("norm"), nullptr);
  // Each copy's entries go through the hooks at its own path, before the
  // modules are registered.
  std::vector<std::string> events;
  for (const RegistrationRecord& r : built.records) {
    const RegistrationEvent& e = r.event;
    const bool attention_weight = e.name == "in_proj_weight";
    const bool stack_module =
        e.kind == EntryKind::kModule && (e.path == "layers" || e.path.empty());
    if (attention_weight || stack_module) {
      events.push_back(absl::StrCat(e.path, ":", e.name));
    }
  }
  EXPECT_THAT(events,
              ElementsAre("layers.0.self_attn:in_proj_weight",
                          "layers.1.self_attn:in_proj_weight",
                          "layers.2.self_attn:in_proj_weight", "layers:0",
                          "layers:1", "layers:2", ":layers"));
}

TEST(TransformerStackTest, ModuleArgumentsAreNamedChildren) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "TransformerEncoder", "args": [2]})",
       "TransformerEncoder.__init__() missing 1 required positional "
       "argument: 'encoder_layer'"},
      {R"({"type": "TransformerDecoder", "args": [2], "children": [
           {"name": "layer", "spec": {"type": "ReLU"}}]})",
       "spec.children[0]: TransformerDecoder.__init__() got an unexpected "
       "keyword argument 'layer'"},
      {R"({"type": "TransformerEncoder", "children": [
           {"name": "encoder_layer", "spec": {"type": "ReLU"}}]})",
       "missing 1 required positional argument: 'num_layers'"},
      {R"({"type": "TransformerEncoder", "args": [-1], "children": [
           {"name": "encoder_layer", "spec": {"type": "ReLU"}}]})",
       "num_layers must be non-negative, got -1"},
      {R"({"type": "TransformerDecoder", "args": [1], "children": [
           {"name": "norm", "spec": {"type": "ReLU"}},
           {"name": "norm", "spec": {"type": "ReLU"}}]})",
       "got multiple values for argument 'norm'"},
      {R"({"type": "TransformerDecoder", "args": [1],
           "kwargs": {"mask_check": true}, "children": [
           {"name": "decoder_layer", "spec": {"type": "ReLU"}}]})",
       "unexpected keyword argument 'mask_check'"},
      {R"({"type": "Transformer", "kwargs": {"custom_encoder": 1}})",
       "custom_encoder takes a module"},
      {R"({"type": "TransformerDecoderLayer", "args": [4, 2],
           "kwargs": {"activation": "tanh"}})",
       "activation should be relu/gelu, not tanh"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(Build(c.spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr(c.message)));
  }
}

TEST(TransformerStackTest, HooksSeeTransformersRedrawnMatrices) {
  HookRegistry hooks;
  std::map<std::string, Tensor> seen;
  RemovableHandle handle =
      hooks.AddHook(EntryKind::kParameter, [&seen](const RegistrationEvent& e) {
        if (e.value.tensor.defined()) {
          seen[absl::StrCat(e.path, ".", e.name)] = e.value.tensor;
        }
        return HookResult::Keep();
      });
  const std::string spec =
      R"({"type": "Transformer", "args": [4, 2, 1, 1, 8]})";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, Build(spec, &hooks));
  StateDict sd = built.root->GetStateDict();
  EXPECT_EQ(seen.size(), sd.tensors.size());
  for (const auto& item : sd.tensors) {
    SCOPED_TRACE(item.key);
    ASSERT_TRUE(seen.count(item.key));
    EXPECT_TRUE(TensorsEqual(seen[item.key], item.value));
  }
  // The matrices were re-drawn one by one: the copies differ now.
  EXPECT_FALSE(
      TensorsEqual(*sd.tensors.Find("encoder.layers.0.linear1.weight"),
                   *sd.tensors.Find("decoder.layers.0.linear1.weight")));
  // The same seed gives the same values without hooks.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult again, Build(spec));
  testing::ExpectSameState(again.root->GetStateDict(), sd);
}

TEST(TransformerStackTest, TransformerChecksItsInputs) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built,
                                  Build(R"({"type": "Transformer",
                                   "args": [4, 2, 1, 1, 8]})"));
  const Tensor src = testing::Zeros({5, 2, 4});
  EXPECT_THAT(Forward(*built.root, {src, testing::Zeros({3, 3, 4})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the batch number of src and tgt must be equal"));
  EXPECT_THAT(Forward(*built.root, {src, testing::Zeros({3, 2, 5})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the feature number of src and tgt must be equal to "
                       "d_model"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out,
      Forward(*built.root, {src, testing::Zeros({3, 2, 4})}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{3, 2, 4}));
}

}  // namespace
}  // namespace modelstate
