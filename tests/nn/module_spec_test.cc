// The builder: PyTorch's construction order for hooks, constructor argument
// binding with Python's error texts, every library layer, refs and ties,
// limits, and the meta device.
#include "nn/module_spec.h"

#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/hooks.h"
#include "core/module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/layer_examples.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::LayerExampleArgs;
using ::modelstate::testing::LayerExampleJson;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<BuildResult> Build(const std::string& json,
                                  const HookRegistry* hooks = nullptr,
                                  BuildOptions options = {}) {
  options.hooks = hooks;
  return BuildModule(SpecFromJson(json), options);
}

// Records "<path>:<kind>:<name>:<action>" for every event.
class EventLog {
 public:
  EventLog() {
    for (EntryKind kind :
         {EntryKind::kParameter, EntryKind::kBuffer, EntryKind::kModule}) {
      handles_.push_back(
          hooks_.AddHook(kind, [this](const RegistrationEvent& e) {
            events_.push_back(absl::StrCat(e.path, ":", EntryKindName(e.kind),
                                           ":", e.name, ":",
                                           RegistrationActionName(e.action)));
            return HookResult::Keep();
          }));
    }
  }
  const HookRegistry* hooks() const { return &hooks_; }
  const std::vector<std::string>& events() const { return events_; }

 private:
  HookRegistry hooks_;
  std::vector<RemovableHandle> handles_;
  std::vector<std::string> events_;
};

TEST(ModuleBuilderTest, HooksFireInPyTorchsConstructionOrder) {
  EventLog log;
  ASSERT_THAT(Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [3, 2]}},
      {"spec": {"type": "Linear", "args": [3, 2], "kwargs": {"bias": false}}},
      {"spec": {"type": "BatchNorm1d", "args": [4],
                "kwargs": {"track_running_stats": false}}}]})",
                    log.hooks()),
              IsOk());
  // Children are constructed before the container registers them; None
  // registrations are unregister events (SEMANTICS H3).
  EXPECT_THAT(
      log.events(),
      ElementsAre(
          "0:parameter:weight:register", "0:parameter:bias:register",
          "1:parameter:weight:register", "1:parameter:bias:unregister",
          "2:parameter:weight:register", "2:parameter:bias:register",
          "2:buffer:running_mean:unregister", "2:buffer:running_var:unregister",
          "2:buffer:num_batches_tracked:unregister", ":module:0:register",
          ":module:1:register", ":module:2:register"));
}

TEST(ModuleBuilderTest, CustomModulesRegisterMembersInOrderWithPaths) {
  EventLog log;
  ASSERT_THAT(Build(R"({"type": "Encoder", "members": [
      {"module": {"name": "layers", "spec": {"type": "ModuleList", "children": [
          {"spec": {"type": "LayerNorm", "args": [4]}}]}}},
      {"buffer": {"name": "scale", "shape": [1], "init": {"kind": "ones"}}}]})",
                    log.hooks()),
              IsOk());
  EXPECT_THAT(log.events(),
              ElementsAre("layers.0:parameter:weight:register",
                          "layers.0:parameter:bias:register",
                          "layers:module:0:register", ":module:layers:register",
                          ":buffer:scale:register"));
}

TEST(ModuleBuilderTest, MultiheadAttentionRegistersOutProjInsideItsOwnInit) {
  EventLog log;
  ASSERT_THAT(
      Build(R"({"type": "MultiheadAttention", "args": [8, 2]})", log.hooks()),
      IsOk());
  EXPECT_THAT(log.events(), ElementsAre(":parameter:in_proj_weight:register",
                                        ":parameter:q_proj_weight:unregister",
                                        ":parameter:k_proj_weight:unregister",
                                        ":parameter:v_proj_weight:unregister",
                                        ":parameter:in_proj_bias:register",
                                        "out_proj:parameter:weight:register",
                                        "out_proj:parameter:bias:register",
                                        ":module:out_proj:register"));
}

TEST(ModuleBuilderTest, HooksSeeInitialisedValuesAndTheirChangesStick) {
  HookRegistry hooks;
  RemovableHandle h = hooks.AddParameterHook([](const RegistrationEvent& e) {
    // Re-initialise Linear weights in [-0.05, 0.05] (a seed example).
    if (e.name != "weight" || e.module->type_name() != "Linear") {
      return HookResult::Keep();
    }
    Tensor t = *e.value.tensor.Clone();
    float* data = static_cast<float*>(*t.MutableDataForOverwrite());
    for (int64_t i = 0; i < t.numel(); ++i) data[i] = 0.05f;
    return HookResult::Replace(t);
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      Build(R"({"type": "Linear", "args": [4, 4]})", &hooks));
  const Tensor& w = *built.root->parameters().Find("weight");
  EXPECT_EQ(w.data<float>()[0], 0.05f);
  // The bias was left alone and keeps PyTorch's default init.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult plain, Build(R"({"type": "Linear", "args": [4, 4]})"));
  EXPECT_TRUE(TensorsEqual(*built.root->parameters().Find("bias"),
                           *plain.root->parameters().Find("bias")));
}

TEST(ModuleBuilderTest, SameSeedSameValuesOtherSeedOtherValues) {
  BuildOptions a;
  a.seed = 7;
  const std::string spec = R"({"type": "Conv2d", "args": [3, 4, 3]})";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult x, Build(spec, nullptr, a));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult y, Build(spec, nullptr, a));
  a.seed = 8;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult z, Build(spec, nullptr, a));
  EXPECT_TRUE(TensorsEqual(*x.root->parameters().Find("weight"),
                           *y.root->parameters().Find("weight")));
  EXPECT_FALSE(TensorsEqual(*x.root->parameters().Find("weight"),
                            *z.root->parameters().Find("weight")));
}

TEST(ModuleBuilderTest, ArgumentsBindLikePython) {
  EXPECT_THAT(Build(R"({"type": "Linear", "args": [3]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "spec (Linear): Linear.__init__() missing 1 required "
                       "positional argument: 'out_features'"));
  EXPECT_THAT(Build(R"({"type": "Linear"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing 2 required positional arguments: "
                                 "'in_features' and 'out_features'")));
  EXPECT_THAT(
      Build(R"({"type": "Conv2d"})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("missing 3 required positional arguments: "
                         "'in_channels', 'out_channels', and 'kernel_size'")));
  EXPECT_THAT(
      Build(R"({"type": "Linear", "args": [1, 2, true, null, null, 9]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Linear.__init__() takes from 3 to 6 positional "
                         "arguments but 7 were given")));
  EXPECT_THAT(
      Build(R"({"type": "Linear", "args": [1, 2], "kwargs": {"foo": 1}})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("got an unexpected keyword argument 'foo'")));
  EXPECT_THAT(
      Build(
          R"({"type": "Linear", "args": [1, 2], "kwargs": {"in_features": 1}})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("got multiple values for argument 'in_features'")));
  EXPECT_THAT(
      Build(R"({"type": "Linear", "args": ["a", 2]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("argument 'in_features' must be an int, got str")));
  EXPECT_THAT(
      Build(R"({"type": "Tanh", "args": [1]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Tanh.__init__() takes 1 positional argument but "
                         "2 were given")));
}

TEST(ModuleBuilderTest, LayerValidationUsesPyTorchsTexts) {
  struct Case {
    const char* spec;
    const char* message;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"({"type": "Linear", "args": [-1, 2]})",
           "Trying to create tensor with negative dimension -1: [2, -1]"},
          {R"({"type": "Conv2d", "args": [3, 4, 3], "kwargs": {"groups": 2}})",
           "in_channels must be divisible by groups"},
          {R"({"type": "Conv2d", "args": [4, 3, 3], "kwargs": {"groups": 2}})",
           "out_channels must be divisible by groups"},
          {R"({"type": "Conv2d", "args": [4, 4, 3], "kwargs": {"groups": 0}})",
           "groups must be a positive integer"},
          {R"({"type": "Conv1d", "args": [4, 4, 3], "kwargs": {"padding": "full"}})",
           "Invalid padding string 'full', should be one of {'valid', 'same'}"},
          {R"({"type": "Conv1d", "args": [4, 4, 3],
                "kwargs": {"padding": "same", "stride": 2}})",
           "padding='same' is not supported for strided convolutions"},
          {R"({"type": "ConvTranspose2d", "args": [4, 4, 3],
                "kwargs": {"padding_mode": "reflect"}})",
           "Only \"zeros\" padding mode is supported for ConvTranspose2d"},
          {R"({"type": "Embedding", "args": [4, 2], "kwargs": {"padding_idx": 4}})",
           "Padding_idx must be within num_embeddings"},
          {R"({"type": "Embedding", "args": [4, 2], "kwargs": {"padding_idx": -5}})",
           "Padding_idx must be within num_embeddings"},
          {R"({"type": "GroupNorm", "args": [3, 4]})",
           "num_channels must be divisible by num_groups"},
          {R"({"type": "Dropout", "args": [1.5]})",
           "dropout probability has to be between 0 and 1, but got 1.5"},
          {R"({"type": "MultiheadAttention", "args": [10, 3]})",
           "embed_dim must be divisible by num_heads"},
      }) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(Build(c.spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr(c.message)));
  }
}

TEST(ModuleBuilderTest, ErrorsNameTheSpecField) {
  EXPECT_THAT(Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "ReLU"}},
      {"spec": {"type": "Linear", "args": [2]}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.children[1] (Linear): ")));
  EXPECT_THAT(
      Build(R"({"type": "Net", "members": [
      {"parameter": {"name": "ok", "shape": [1]}},
      {"parameter": {"name": "a.b", "shape": [1]}}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "spec.members[1] (parameter 'a.b'): parameter name can't "
               "contain \".\""));
  EXPECT_THAT(Build(R"({"type": "Net", "members": [
      {"parameter": {"name": "w", "shape": [1]}},
      {"buffer": {"name": "w", "shape": [1]}}]})"),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("attribute 'w' already exists")));
  EXPECT_THAT(Build(R"({"type": "Net", "members": [
      {"parameter": {"name": "w", "shape": [2, -3]}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension -3")));
  EXPECT_THAT(Build(R"({"type": ""})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "spec.type: must not be empty"));
  EXPECT_THAT(Build(R"({"type": "Linear", "args": [2, 2], "children": [
      {"spec": {"type": "ReLU"}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("configured by 'args' and 'kwargs' only")));
  EXPECT_THAT(
      Build(
          R"({"type": "ModuleDict", "children": [{"spec": {"type": "ReLU"}}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("a ModuleDict child needs a name")));
}

TEST(ModuleBuilderTest, UnknownTypesAreErrorsNotEmptyModules) {
  // A typo, with or without arguments, names the field and the closest
  // library type.
  for (const char* spec :
       {R"({"type": "Linaer"})", R"({"type": "Linaer", "args": [2, 3]})",
        R"({"type": "Linaer", "kwargs": {"bias": true}})"}) {
    SCOPED_TRACE(spec);
    EXPECT_THAT(Build(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "spec.type: unknown layer type 'Linaer'; did you mean "
                         "'Linear'? A custom module lists its 'members', or "
                         "sets 'custom': true when it has none"));
  }
  EXPECT_THAT(Build(R"({"type": "sequential", "children": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("did you mean 'Sequential'?")));
  // Inside a tree, the path says where.
  EXPECT_THAT(Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "ReLU"}}, {"spec": {"type": "Convv2d"}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.children[1].type: unknown layer type "
                                 "'Convv2d'; did you mean 'Conv2d'?")));
  EXPECT_THAT(Build(R"({"type": "Net", "members": [{"module": {"name": "m",
      "spec": {"type": "Quux"}}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.members[0].module.type: unknown "
                                 "layer type 'Quux'. A custom module")));
  // torch.nn's own names say why the library leaves them out.
  EXPECT_THAT(Build(R"({"type": "LazyLinear", "args": [3]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("torch.nn.LazyLinear is not in modelstate's "
                                 "library (lazy modules have no shapes")));
  EXPECT_THAT(
      Build(R"({"type": "CrossEntropyLoss"})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(it is a loss")));
}

TEST(ModuleBuilderTest, EmptyCustomModulesAreAskedForExplicitly) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult empty,
                                  Build(R"({"type": "Host", "custom": true})"));
  EXPECT_EQ(empty.root->type_name(), "Host");
  EXPECT_TRUE(empty.root->GetStateDict().tensors.empty());
  // Members, ties or an extra state make a custom module on their own.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult with_state, Build(R"({"type": "Net", "extra_state": true})"));
  EXPECT_EQ(with_state.root->type_name(), "Net");
  // `custom` wins over a library type's name: a class of one's own called
  // Linear, with a parameter Linear does not have.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult own,
                                  Build(R"({"type": "Linear", "custom": true,
          "members": [{"parameter": {"name": "scale", "shape": [2]}}]})"));
  EXPECT_EQ(own.root->qualified_name(), "__main__.Linear");
  EXPECT_EQ(own.root->GetStateDict().tensors.size(), 1u);
  EXPECT_THAT(Build(R"({"type": "Host", "custom": true, "args": [1]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a custom module is built from 'members'")));
  EXPECT_THAT(Build(R"({"type": "Net", "members": [
      {"module": {"name": "a", "spec": {"type": "ReLU"}}},
      {"module": {"name": "b", "spec": {"ref": "a", "custom": true}}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must not have any other field")));
}

TEST(ModuleBuilderTest, BuildOptionsAreValidated) {
  BuildOptions o;
  o.dtype = DType::kInt64;
  EXPECT_THAT(Build(R"({"type": "ReLU"})", nullptr, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("floating point dtype, got int64")));
  o = {};
  o.device = Device::Cuda(0);
  EXPECT_THAT(
      Build(R"({"type": "ReLU"})", nullptr, o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cpu or meta")));
}

TEST(ModuleBuilderTest, FactoryDTypeAppliesToFloatingTensorsOnly) {
  BuildOptions o;
  o.dtype = DType::kFloat16;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult bn,
      Build(R"({"type": "BatchNorm2d", "args": [3]})", nullptr, o));
  EXPECT_EQ(bn.root->parameters().Find("weight")->dtype(), DType::kFloat16);
  EXPECT_EQ(bn.root->buffers().Find("num_batches_tracked")->dtype(),
            DType::kInt64);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lin,
      Build(
          R"({"type": "Linear", "args": [2, 2], "kwargs": {"dtype": "float64"}})",
          nullptr, o));
  EXPECT_EQ(lin.root->parameters().Find("weight")->dtype(), DType::kFloat64);
}

TEST(ModuleBuilderTest, EveryLibraryLayerBuildsWithItsDefaults) {
  for (const std::string& type : LayerTypes()) {
    SCOPED_TRACE(type);
    std::string json = LayerExampleJson(type);
    ASSERT_FALSE(json.empty()) << "add the new layer to layer_examples.h";
    MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, Build(json));
    EXPECT_EQ(built.root->type_name(), type);
  }
  EXPECT_EQ(LayerTypes().size(), LayerExampleArgs().size());
}

TEST(ModuleBuilderTest, RefsShareModulesAndTiesShareParameters) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult shared,
                                  Build(R"({"type": "Sequential",
      "children": [{"spec": {"type": "Linear", "args": [2, 2]}}, {"spec": {"ref": "0"}}]})"));
  EXPECT_EQ(*shared.root->children().Find("0"),
            *shared.root->children().Find("1"));
  EXPECT_THAT(
      Build(R"({"type": "Sequential", "children": [{"spec": {"ref": "5"}}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("ref '5' names no earlier child")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult tied,
                                  Build(R"({"type": "Tied", "members": [
      {"module": {"name": "a", "spec": {"type": "Linear", "args": [2, 2]}}},
      {"module": {"name": "b", "spec": {"type": "Linear", "args": [2, 2]}}}],
      "ties": [{"target": "b.weight", "source": "a.weight"}]})"));
  EXPECT_TRUE(
      (*tied.root->GetSubmodule("a"))
          ->parameters()
          .Find("weight")
          ->is_same(
              *(*tied.root->GetSubmodule("b"))->parameters().Find("weight")));
  EXPECT_THAT(Build(R"({"type": "Tied", "members": [],
      "ties": [{"target": "w", "source": "nothing.here"}]})"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("spec.ties[0]")));
}

TEST(ModuleBuilderTest, LimitsAreEnforcedAndNamed) {
  BuildOptions o;
  o.limits.max_depth = 2;
  EXPECT_THAT(
      Build(R"({"type": "Sequential", "children": [{"spec":
      {"type": "Sequential", "children": [{"spec": {"type": "ReLU"}}]}}]})",
            nullptr, o),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_depth")));
  o = {};
  o.limits.max_entries = 3;
  EXPECT_THAT(
      Build(R"({"type": "BatchNorm1d", "args": [2]})", nullptr, o),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_entries")));
  o = {};
  o.limits.max_tensor_bytes = 1000;
  EXPECT_THAT(Build(R"({"type": "Linear", "args": [100, 100]})", nullptr, o),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_tensor_bytes")));
  o = {};
  o.limits.max_total_bytes = 100 * 100 * 4;
  EXPECT_THAT(Build(R"({"type": "Linear", "args": [100, 100]})", nullptr, o),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_total_bytes")));
}

// `depth` custom modules, each holding the one below as "a" and again as
// "b" (a ref): 2^depth paths to the Linear at the bottom.
std::string DiamondJson(int depth) {
  std::string json = R"({"type": "Linear", "args": [1, 1]})";
  for (int i = 0; i < depth; ++i) {
    json = absl::StrCat(
        R"({"type": "N", "members": [{"module": {"name": "a",
        "spec": )",
        json, R"(}}, {"module": {"name": "b", "spec": {"ref": "a"}}}]})");
  }
  return json;
}

TEST(ModuleBuilderTest, SharedSubmodulesCountOncePerPath) {
  // state_dict lists a shared submodule's entries under every path: 40
  // levels would be 2^41 keys from 42 modules, and state_dict or
  // load_state_dict would run the server out of memory.
  EXPECT_THAT(Build(DiamondJson(40)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("a shared submodule counts once per path")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult small, Build(DiamondJson(3)));
  // 14 submodule paths below the root, 8 paths to the Linear's 2 tensors.
  EXPECT_EQ(TraversalEntries(*small.root), 14u + 16u);
  EXPECT_EQ(small.root->GetStateDict().tensors.size(), 16u);
  BuildOptions o;
  o.limits.max_entries = 29;
  EXPECT_THAT(Build(DiamondJson(3), nullptr, o),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("would have 30 state_dict keys")));
  o.limits.max_entries = 30;
  EXPECT_THAT(Build(DiamondJson(3), nullptr, o), IsOk());
  // Far beyond 64 bits: the count saturates instead of wrapping.
  o = {};
  o.limits.max_depth = 100;
  EXPECT_THAT(Build(DiamondJson(70), nullptr, o),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("more than 18446744073709551615")));
}

TEST(ModuleBuilderTest, InstanceNormRefusesAnOldCheckpointsRunningStats) {
  // torch's _InstanceNorm: running stats in a state_dict without _metadata
  // (pre-0.4.0) for an InstanceNorm that does not track them are an error,
  // even with strict=False, and are not listed as unexpected.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built, Build(R"({"type": "Sequential", "children": [{"spec":
          {"type": "InstanceNorm1d", "args": [3], "kwargs": {"affine": true}}}]})"));
  StateDict old;
  old.tensors.Set("0.weight", testing::Filled(DType::kFloat32, {3}, 2));
  old.tensors.Set("0.bias", testing::Filled(DType::kFloat32, {3}, 1));
  old.tensors.Set("0.running_mean", testing::Filled(DType::kFloat32, {3}, 0));
  old.tensors.Set("0.running_var", testing::Filled(DType::kFloat32, {3}, 1));
  old.tensors.Set("0.zz", testing::Filled(DType::kFloat32, {1}, 0));
  const std::string text =
      "Error(s) in loading state_dict for Sequential:\n\t"
      "Unexpected key(s) in state_dict: \"0.zz\". \n\t"
      "Unexpected running stats buffer(s) \"0.running_mean\" and "
      "\"0.running_var\" for InstanceNorm1d with track_running_stats=False. "
      "If state_dict is a checkpoint saved before 0.4.0, this may be expected "
      "because InstanceNorm1d does not track running stats by default since "
      "0.4.0. Please remove these keys from state_dict. If the running stats "
      "are actually needed, instead set track_running_stats=True in "
      "InstanceNorm1d to enable them. See the documentation of InstanceNorm1d "
      "for details.";
  LoadOptions strict;
  EXPECT_THAT(built.root->LoadStateDict(old, strict),
              StatusIs(absl::StatusCode::kFailedPrecondition, text));
  LoadOptions lenient;
  lenient.strict = false;
  EXPECT_THAT(
      built.root->LoadStateDict(old, lenient),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Error(s) in loading state_dict for Sequential:\n\t"
                         "Unexpected running stats buffer(s)")));
  // With _metadata (any version) they are ordinary unexpected keys.
  old.metadata.emplace();
  old.metadata->Set("0", 1);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(LoadResult loaded,
                                  built.root->LoadStateDict(old, lenient));
  EXPECT_THAT(loaded.keys.unexpected_keys,
              ElementsAre("0.running_mean", "0.running_var", "0.zz"));
}

long MaxRssKb() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(ModuleBuilderTest, MetaBuildsOfATrillionParametersAllocateNothing) {
  BuildOptions o;
  o.device = Device::Meta();
  long rss_before = MaxRssKb();
  auto start = std::chrono::steady_clock::now();
  // 1000 x Linear(31623, 31623) ~ 1.0e12 parameters.
  std::string json = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&json, i ? "," : "",
                    R"({"spec": {"type": "Linear", "args": [31623, 31623]}})");
  }
  json += "]}";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, Build(json, nullptr, o));
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  int64_t params = 0;
  for (const auto& [name, t] : built.root->NamedParameters()) {
    params += t.numel();
    ASSERT_EQ(t.storage(), nullptr);
    ASSERT_TRUE(t.device().is_meta());
  }
  EXPECT_GT(params, int64_t{1'000'000'000'000});
  EXPECT_LT(MaxRssKb() - rss_before, 100 * 1024);  // < 100 MiB
  EXPECT_LT(seconds, 10.0);  // generous: sanitizer builds are slow
}

}  // namespace
}  // namespace modelstate
