// Module::LoadStateDict in assign mode: an atomic load validates every entry
// (shape, None, the dtype a parameter requiring grad accepts) and reads every
// value before it installs the first one, so a failed load changes nothing;
// a non-atomic load installs what it can, as PyTorch does.
#include "core/module.h"

#include <map>
#include <memory>
#include <string>
#include <utility>

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

}  // namespace
}  // namespace modelstate
