// Module::LoadStateDict in assign mode: an atomic load validates every entry
// (shape, None, the dtype a parameter requiring grad accepts) and reads every
// value before it installs the first one, so a failed load changes nothing;
// a non-atomic load installs what it can, as PyTorch does.
#include "core/module.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::Filled;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;

std::shared_ptr<Module> Linear32() {
  BuildOptions options;
  options.seed = 0;
  options.hooks = nullptr;
  absl::StatusOr<BuildResult> built = BuildModule(
      SpecFromJson(R"({"type": "Linear", "args": [3, 2]})"), options);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? built->root : nullptr;
}

// Registrations without the process-wide hooks.
RegistrationContext NoHooks() {
  RegistrationContext ctx;
  ctx.hooks = nullptr;
  return ctx;
}

LoadOptions Assign(bool atomic = true) {
  LoadOptions options;
  options.assign = true;
  options.atomic = atomic;
  return options;
}

StateDict Dict(std::vector<std::pair<std::string, Tensor>> entries) {
  StateDict sd;
  for (auto& [key, tensor] : entries) sd.tensors.Set(key, std::move(tensor));
  return sd;
}

// The identity of every tensor in the module's state_dict, by key.
std::map<std::string, const void*> Identities(const Module& m) {
  std::map<std::string, const void*> out;
  for (const auto& item :
       m.GetStateDict(/*prefix=*/"", /*keep_vars=*/true).tensors) {
    out[item.key] = item.value.identity();
  }
  return out;
}

TEST(AssignLoadTest, InstallsTheCheckpointsTensorsWithTheirDtype) {
  std::shared_ptr<Module> lin = Linear32();
  Tensor weight = Filled(DType::kFloat64, {2, 3}, 1.5);
  Tensor bias = Filled(DType::kFloat16, {2}, -2.0);
  absl::StatusOr<LoadResult> loaded = lin->LoadStateDict(
      Dict({{"weight", weight}, {"bias", bias}}), Assign(), NoHooks());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tensor& installed = *lin->parameters().Find("weight");
  EXPECT_EQ(installed.dtype(), DType::kFloat64);
  EXPECT_TRUE(installed.is_parameter());
  EXPECT_TRUE(installed.requires_grad());
  EXPECT_TRUE(TensorsEqual(installed, weight));
  EXPECT_EQ(lin->parameters().Find("bias")->dtype(), DType::kFloat16);
  ASSERT_EQ(loaded->registrations.size(), 2u);
  EXPECT_EQ(loaded->registrations[0].first, "weight");
  EXPECT_EQ(loaded->registrations[1].first, "bias");
}

// PyTorch wraps the value in Parameter(t, requires_grad=True), which raises
// for an integer dtype; the good weight before it must not be installed.
TEST(AssignLoadTest, AtomicLoadRejectsAnIntegerParameterAndInstallsNothing) {
  std::shared_ptr<Module> lin = Linear32();
  std::map<std::string, const void*> before = Identities(*lin);
  StateDict before_values = lin->GetStateDict();
  absl::StatusOr<LoadResult> loaded =
      lin->LoadStateDict(Dict({{"weight", Filled(DType::kFloat32, {2, 3}, 7.0)},
                               {"bias", Filled(DType::kInt64, {2}, 1.0)}}),
                         Assign(), NoHooks());
  EXPECT_THAT(
      loaded,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "Error(s) in loading state_dict for Linear:\n\t"
               "While copying the parameter named \"bias\", whose dimensions "
               "in the model are torch.Size([2]) and whose dimensions in the "
               "checkpoint are torch.Size([2]), an exception occurred : "
               "('Only Tensors of floating point and complex dtype can "
               "require gradients',)."));
  EXPECT_EQ(Identities(*lin), before);
  testing::ExpectSameState(lin->GetStateDict(), before_values);
}

// Every entry is checked before the first installation: a size mismatch in
// the last entry and an unexpected key leave the first untouched.
TEST(AssignLoadTest, AtomicLoadRejectsShapesAndKeysAndInstallsNothing) {
  std::shared_ptr<Module> lin = Linear32();
  std::map<std::string, const void*> before = Identities(*lin);
  absl::StatusOr<LoadResult> loaded =
      lin->LoadStateDict(Dict({{"weight", Filled(DType::kFloat32, {2, 3}, 7.0)},
                               {"bias", Filled(DType::kFloat32, {3}, 1.0)},
                               {"extra", Filled(DType::kFloat32, {1}, 1.0)}}),
                         Assign(), NoHooks());
  EXPECT_THAT(loaded,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "Error(s) in loading state_dict for Linear:\n\t"
                       "Unexpected key(s) in state_dict: \"extra\". \n\t"
                       "size mismatch for bias: copying a param with shape "
                       "torch.Size([3]) from checkpoint, the shape in current "
                       "model is torch.Size([2])."));
  EXPECT_EQ(Identities(*lin), before);
}

// A source whose bytes for one key cannot be read (a failing disk, a
// corrupted staged file).
class FailingSource : public LoadSource {
 public:
  explicit FailingSource(std::string failing_key)
      : failing_key_(std::move(failing_key)) {}
  absl::Status CopyInto(const std::string& key, Tensor& target) override {
    if (key == failing_key_) return absl::DataLossError("checksum mismatch");
    return target.CopyFrom(Filled(target.dtype(), target.shape(), 3.0));
  }
  absl::StatusOr<Tensor> Read(const std::string& key) override {
    if (key == failing_key_) return absl::DataLossError("checksum mismatch");
    return Filled(DType::kFloat32, key == "weight" ? Shape{2, 3} : Shape{2},
                  3.0);
  }

 private:
  std::string failing_key_;
};

StateDict DescribedLinear() {
  absl::StatusOr<Tensor> weight =
      Tensor::Empty(DType::kFloat32, {2, 3}, Device::Meta());
  absl::StatusOr<Tensor> bias =
      Tensor::Empty(DType::kFloat32, {2}, Device::Meta());
  EXPECT_TRUE(weight.ok() && bias.ok());
  return Dict({{"weight", *weight}, {"bias", *bias}});
}

TEST(AssignLoadTest, AtomicLoadThatCannotReadAValueInstallsNothing) {
  std::shared_ptr<Module> lin = Linear32();
  std::map<std::string, const void*> before = Identities(*lin);
  FailingSource source("bias");
  LoadOptions options = Assign();
  options.source = &source;
  absl::StatusOr<LoadResult> loaded =
      lin->LoadStateDict(DescribedLinear(), options, NoHooks());
  EXPECT_THAT(loaded,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr(
                           "While copying the parameter named \"bias\", whose "
                           "dimensions in the model are torch.Size([2]) and "
                           "whose dimensions in the checkpoint are "
                           "torch.Size([2]), an exception occurred : "
                           "('checksum mismatch',).")));
  EXPECT_EQ(Identities(*lin), before);
}

// atomic=false is PyTorch's own behaviour: what can be installed is, and the
// failures are reported together.
TEST(AssignLoadTest, NonAtomicLoadInstallsTheEntriesThatCanBeRead) {
  std::shared_ptr<Module> lin = Linear32();
  std::map<std::string, const void*> before = Identities(*lin);
  FailingSource source("bias");
  LoadOptions options = Assign(/*atomic=*/false);
  options.source = &source;
  absl::StatusOr<LoadResult> loaded =
      lin->LoadStateDict(DescribedLinear(), options, NoHooks());
  EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kFailedPrecondition,
                               ::testing::HasSubstr("checksum mismatch")));
  std::map<std::string, const void*> after = Identities(*lin);
  EXPECT_NE(after["weight"], before["weight"]);
  EXPECT_EQ(after["bias"], before["bias"]);
  EXPECT_TRUE(TensorsEqual(*lin->parameters().Find("weight"),
                           Filled(DType::kFloat32, {2, 3}, 3.0)));
}

// Two modules holding the same parameter, float buffer and int64 buffer,
// and sharing one submodule with a float buffer of its own.
std::shared_ptr<Module> TiedTree() {
  std::shared_ptr<Module> root = Module::Create("Root");
  std::shared_ptr<Module> shared = Module::Create("Shared");
  EXPECT_TRUE(
      shared->RegisterBuffer("s", Filled(DType::kFloat32, {3}, 1)).ok());
  absl::StatusOr<Tensor> w =
      MakeParameter(Filled(DType::kFloat32, {2, 3}, 1), false);
  EXPECT_TRUE(w.ok());
  Tensor f = Filled(DType::kFloat32, {4}, 1);
  Tensor i = Filled(DType::kInt64, {2}, 1);
  for (const char* name : {"a", "b"}) {
    std::shared_ptr<Module> m = Module::Create("Holder");
    EXPECT_TRUE(m->RegisterParameter("w", *w).ok());
    EXPECT_TRUE(m->RegisterBuffer("f", f).ok());
    EXPECT_TRUE(m->RegisterBuffer("i", i).ok());
    EXPECT_TRUE(m->RegisterModule("sh", shared).ok());
    EXPECT_TRUE(root->RegisterModule(name, m).ok());
  }
  return root;
}

const Tensor& Entry(const Module& root, const char* child, const char* name) {
  const Module& m = **root.children().Find(child);
  const Tensor* t = m.parameters().Find(name);
  return t != nullptr ? *t : *m.buffers().Find(name);
}

// torch 1.13 (checked with it): to() keeps a parameter's object through
// set_data, so ties survive a dtype change; to('meta') makes a new
// Parameter per slot, and every buffer that changes becomes a new tensor per
// slot, so those ties break. A shared submodule stays shared either way.
TEST(ModuleToTest, TiesBreakWhereTorchMakesNewObjects) {
  std::shared_ptr<Module> root = TiedTree();
  MODELSTATE_ASSERT_OK(root->To(std::nullopt, DType::kFloat64));
  EXPECT_TRUE(Entry(*root, "a", "w").is_same(Entry(*root, "b", "w")));
  EXPECT_EQ(Entry(*root, "a", "w").dtype(), DType::kFloat64);
  EXPECT_FALSE(Entry(*root, "a", "f").is_same(Entry(*root, "b", "f")));
  EXPECT_EQ(Entry(*root, "b", "f").dtype(), DType::kFloat64);
  EXPECT_TRUE(Entry(*root, "a", "i").is_same(Entry(*root, "b", "i")));
  EXPECT_EQ(root->NamedParameters().size(), 1u);
  EXPECT_EQ(root->NamedBuffers().size(), 4u);  // a.f, a.i, a.sh.s, b.f

  root = TiedTree();
  MODELSTATE_ASSERT_OK(root->To(Device::Meta(), std::nullopt));
  const Tensor& aw = Entry(*root, "a", "w");
  const Tensor& bw = Entry(*root, "b", "w");
  EXPECT_FALSE(aw.is_same(bw));
  EXPECT_TRUE(aw.device().is_meta() && bw.device().is_meta());
  EXPECT_TRUE(aw.is_parameter() && bw.is_parameter());
  EXPECT_FALSE(aw.requires_grad() || bw.requires_grad());
  EXPECT_FALSE(Entry(*root, "a", "f").is_same(Entry(*root, "b", "f")));
  EXPECT_FALSE(Entry(*root, "a", "i").is_same(Entry(*root, "b", "i")));
  EXPECT_EQ(root->NamedParameters().size(), 2u);
  EXPECT_EQ(root->NamedBuffers().size(), 5u);
  EXPECT_EQ(root->NamedModules().size(), 4u);  // "", a, a.sh, b

  // On meta, a dtype change keeps parameter objects again.
  MODELSTATE_ASSERT_OK(root->Half());
  EXPECT_EQ(root->NamedParameters().size(), 2u);
  EXPECT_EQ(Entry(*root, "a", "w").dtype(), DType::kFloat16);
}

// RegisterModule refuses a child that holds the module it is registered in
// (PyTorch would make a cycle that named_modules' memo alone survives),
// found through shared submodules too, and stores nothing.
TEST(RegisterModuleTest, RefusesACycleThroughAnyPathAndStoresNothing) {
  std::shared_ptr<Module> top = Module::Create("Top");
  std::shared_ptr<Module> mid = Module::Create("Mid");
  std::shared_ptr<Module> leaf = Module::Create("Leaf");
  MODELSTATE_ASSERT_OK(top->RegisterModule("mid", mid).status());
  MODELSTATE_ASSERT_OK(mid->RegisterModule("leaf", leaf).status());
  // A chain of diamonds: each level holds the one below twice, so a walk
  // without a memo would take 2^40 steps.
  std::shared_ptr<Module> below = top;
  for (int i = 0; i < 40; ++i) {
    std::shared_ptr<Module> level = Module::Create("Level");
    MODELSTATE_ASSERT_OK(level->RegisterModule("x", below).status());
    MODELSTATE_ASSERT_OK(level->RegisterModule("y", below).status());
    below = level;
  }
  const std::string cyclic = "would make the module tree cyclic";
  EXPECT_THAT(leaf->RegisterModule("up", below),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(
                           "Registering 'up' in Leaf would make the module "
                           "tree cyclic")));
  EXPECT_THAT(leaf->RegisterModule("self", leaf),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(cyclic)));
  EXPECT_THAT(mid->RegisterModule("top", top),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(cyclic)));
  EXPECT_TRUE(leaf->NamedChildren().empty());
  EXPECT_EQ(mid->NamedChildren().size(), 1u);
  // Sharing without a cycle is allowed: the leaf again under the top, and
  // the whole chain under a new root.
  MODELSTATE_ASSERT_OK(top->RegisterModule("again", leaf).status());
  std::shared_ptr<Module> root = Module::Create("Root");
  MODELSTATE_ASSERT_OK(root->RegisterModule("chain", below).status());
  EXPECT_EQ(root->NamedModules().size(), 44u);  // root, 40 levels, 3
}

// The names every module's class has (dir(nn.Module())) are shared by all
// modules; a module's own come on top, listed with them, once and sorted.
TEST(ClassAttributeTest, EveryModulesNamesAndItsOwnAreListedSortedOnce) {
  std::shared_ptr<Module> bare = Module::Create("Bare");
  std::vector<std::string> names = bare->ClassAttributeNames();
  EXPECT_EQ(names.size(), 101u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(bare->HasClassAttribute("__call__"));
  EXPECT_FALSE(bare->HasClassAttribute("in_features"));
  EXPECT_THAT(bare->RegisterParameter("forward", Tensor()),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       ::testing::HasSubstr("attribute 'forward' already "
                                            "exists")));
  std::shared_ptr<Module> own = Module::Create("Own");
  own->AddClassAttributes({"in_features", "forward", "aaa"});
  std::vector<std::string> with_own = own->ClassAttributeNames();
  EXPECT_EQ(with_own.size(), 103u);  // "forward" was one already
  EXPECT_TRUE(std::is_sorted(with_own.begin(), with_own.end()));
  EXPECT_EQ(with_own.front(), "T_destination");  // uppercase sorts first
  EXPECT_TRUE(own->HasClassAttribute("in_features"));
  EXPECT_FALSE(bare->HasClassAttribute("aaa"));
  EXPECT_THAT(own->RegisterBuffer("aaa", Tensor()),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_TRUE(own->GetAttr("in_features").ok());
}

}  // namespace
}  // namespace modelstate
