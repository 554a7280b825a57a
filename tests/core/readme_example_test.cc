// The core example of README.md, verbatim between the markers, so that the
// documented code keeps compiling and doing what the README says.
#include <optional>
#include <vector>

#include "core/hooks.h"
#include "core/module.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"

namespace {

TEST(ReadmeExampleTest, CoreQuickStartWorks) {
  using namespace modelstate;  // NOLINT: as in the README
  // --- README example begins ---
  // Block any buffer named "temp_buffer", process-wide.
  RemovableHandle no_temp =
      HookRegistry::Global().AddBufferHook([](const RegistrationEvent& e) {
        if (e.name == "temp_buffer") return HookResult::Block("no temporaries");
        return HookResult::Keep();
      });

  // nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
  ModuleSpec mlp = ModuleSpec::Layer("Sequential");
  mlp.children.push_back(
      {"", ModuleSpec::Layer("Linear", {int64_t{784}, int64_t{256}})});
  mlp.children.push_back({"", ModuleSpec::Layer("ReLU")});
  mlp.children.push_back(
      {"", ModuleSpec::Layer("Linear", {int64_t{256}, int64_t{10}})});

  BuildOptions options;
  options.seed = 0;  // the values torch.manual_seed(0) gives
  absl::StatusOr<BuildResult> built = BuildModule(mlp, options);
  if (!built.ok()) return;  // INVALID_ARGUMENT naming the spec field
  std::shared_ptr<Module> model = built->root;

  StateDict sd =
      model->GetStateDict();  // "0.weight", "0.bias", "2.weight", ...
  absl::Status half = model->To(std::nullopt, DType::kFloat16);
  absl::StatusOr<LoadResult> loaded =
      model->LoadStateDict(sd);  // float32 -> float16
  absl::StatusOr<RegistrationOutcome> blocked = model->RegisterBuffer(
      "temp_buffer", *Tensor::Zeros(DType::kFloat32, {1}));
  // blocked->decision.blocked() == true; the module has no such buffer.
  no_temp.Remove();
  // --- README example ends ---
  ASSERT_TRUE(half.ok());
  ASSERT_TRUE(loaded.ok());
  ASSERT_TRUE(blocked.ok());
  EXPECT_TRUE(blocked->decision.blocked());
  EXPECT_FALSE(model->buffers().Contains("temp_buffer"));
  EXPECT_EQ(
      sd.tensors.Keys(),
      (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(model->parameters().size(), 0u);
  EXPECT_EQ((*model->GetSubmodule("0"))->parameters().Find("weight")->dtype(),
            DType::kFloat16);
}

}  // namespace
