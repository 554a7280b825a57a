#include "nn/forward.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;

std::shared_ptr<Module> Build(const std::string& json,
                              DType dtype = DType::kFloat32) {
  BuildOptions options;
  options.hooks = nullptr;
  options.dtype = dtype;
  absl::StatusOr<BuildResult> built =
      BuildModule(testing::SpecFromJson(json), options);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? built->root : nullptr;
}

Tensor Values(Shape shape, std::vector<double> values,
              DType dtype = DType::kFloat32) {
  absl::StatusOr<Tensor> t =
      Tensor::FromDoubles(dtype, std::move(shape), values);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::vector<double> Read(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    out.push_back(ReadElementAsDouble(t.raw_data(), t.dtype(), i));
  }
  return out;
}

// Sets a module entry's values in place.
void Set(Module& m, const std::string& name, std::vector<double> values) {
  Tensor t = m.parameters().Contains(name) ? *m.parameters().Find(name)
                                           : *m.buffers().Find(name);
  MODELSTATE_ASSERT_OK(
      t.CopyFrom(Values(t.shape(), std::move(values), t.dtype())));
}

// A Linear(2, 2) computing y = [x0 + 2 x1 + 1, 3 x0 - x1 - 1].
std::shared_ptr<Module> SmallLinear() {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 2]})");
  Set(*m, "weight", {1, 2, 3, -1});
  Set(*m, "bias", {1, -1});
  return m;
}

TEST(ForwardTest, LinearComputesAffineMap) {
  std::shared_ptr<Module> m = SmallLinear();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*m, {Values({2, 2}, {1, 1, 2, 0})}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(Read(out[0]), ElementsAre(4, 1, 3, 5));
}

TEST(ForwardTest, Float16ComputesInFloat32AndRoundsBack) {
  std::shared_ptr<Module> m = SmallLinear();
  MODELSTATE_ASSERT_OK(m->Half());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out,
      Forward(*m, {Values({1, 2}, {0.1, 0.2}, DType::kFloat16)}));
  EXPECT_EQ(out[0].dtype(), DType::kFloat16);
  // 0.1 and 0.2 as float16, then computed in float32 and rounded.
  float x0 = HalfBitsToFloat(FloatToHalfBits(0.1f));
  float x1 = HalfBitsToFloat(FloatToHalfBits(0.2f));
  EXPECT_THAT(Read(out[0]),
              ElementsAre(HalfBitsToFloat(FloatToHalfBits(x0 + 2 * x1 + 1)),
                          HalfBitsToFloat(FloatToHalfBits(3 * x0 - x1 - 1))));
}

TEST(ForwardTest, SequentialChainsChildren) {
  std::shared_ptr<Module> m = Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [2, 2]}},
      {"spec": {"type": "ReLU"}}]})");
  std::shared_ptr<Module> lin = *m->GetSubmodule("0");
  Set(*lin, "weight", {1, 2, 3, -1});
  Set(*lin, "bias", {1, -1});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*m, {Values({1, 2}, {-1, -1})}));
  EXPECT_THAT(Read(out[0]), ElementsAre(0, 0));  // [-2, -3] through ReLU
}

// ---------------------------------------------------------------------------
// Hooks.

TEST(ForwardHooksTest, PreHookReplacesInputAndForwardHookSeesIt) {
  std::shared_ptr<Module> m = SmallLinear();
  std::vector<double> seen_input;
  RemovableHandle pre = m->RegisterForwardPreHook(
      [](Module&, const std::vector<Tensor>&) -> ForwardHookResult {
        return std::vector<Tensor>{Values({1, 2}, {1, 0})};
      });
  RemovableHandle post = m->RegisterForwardHook(
      [&](Module&, const std::vector<Tensor>& in,
          const std::vector<Tensor>&) -> ForwardHookResult {
        seen_input = Read(in[0]);
        return std::nullopt;
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*m, {Values({1, 2}, {5, 5})}));
  EXPECT_THAT(Read(out[0]), ElementsAre(2, 2));
  EXPECT_THAT(seen_input, ElementsAre(1, 0));
  pre.Remove();
  post.Remove();
}

TEST(ForwardHooksTest, ForwardHookReplacesOutput) {
  std::shared_ptr<Module> m = SmallLinear();
  RemovableHandle h = m->RegisterForwardHook(
      [](Module&, const std::vector<Tensor>&,
         const std::vector<Tensor>& out) -> ForwardHookResult {
        std::vector<double> v = Read(out[0]);
        for (double& x : v) x *= 10;
        return std::vector<Tensor>{Values(out[0].shape(), v)};
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*m, {Values({1, 2}, {1, 0})}));
  EXPECT_THAT(Read(out[0]), ElementsAre(20, 20));
  h.Remove();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(out, Forward(*m, {Values({1, 2}, {1, 0})}));
  EXPECT_THAT(Read(out[0]), ElementsAre(2, 2));
}

TEST(ForwardHooksTest, GlobalHooksRunFirstThenRegistrationOrder) {
  std::shared_ptr<Module> m = SmallLinear();
  std::vector<std::string> order;
  auto pre = [&order](std::string name) {
    return [&order, name](Module&,
                          const std::vector<Tensor>&) -> ForwardHookResult {
      order.push_back(name);
      return std::nullopt;
    };
  };
  auto post = [&order](std::string name) {
    return [&order, name](Module&, const std::vector<Tensor>&,
                          const std::vector<Tensor>&) -> ForwardHookResult {
      order.push_back(name);
      return std::nullopt;
    };
  };
  RemovableHandle h1 = m->RegisterForwardPreHook(pre("module pre 1"));
  RemovableHandle h2 = RegisterGlobalForwardPreHook(pre("global pre 1"));
  RemovableHandle h3 = m->RegisterForwardPreHook(pre("module pre 2"));
  RemovableHandle h4 = m->RegisterForwardHook(post("module hook 1"));
  RemovableHandle h5 = RegisterGlobalForwardHook(post("global hook 1"));
  RemovableHandle h6 = RegisterGlobalForwardHook(post("global hook 2"));
  RemovableHandle h7 =
      m->RegisterForwardHook(post("module hook 0"), /*prepend=*/true);
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({1, 2}, {1, 0})}).status());
  EXPECT_THAT(order, ElementsAre("global pre 1", "module pre 1", "module pre 2",
                                 "global hook 1", "global hook 2",
                                 "module hook 0", "module hook 1"));
  for (RemovableHandle* h : {&h1, &h2, &h3, &h4, &h5, &h6, &h7}) h->Remove();
  order.clear();
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({1, 2}, {1, 0})}).status());
  EXPECT_TRUE(order.empty());
  h1.Remove();  // Twice: a no-op.
}

TEST(ForwardHooksTest, HooksFireForEverySubmoduleCall) {
  std::shared_ptr<Module> m = Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [2, 3]}},
      {"spec": {"type": "ReLU"}},
      {"spec": {"type": "Linear", "args": [3, 1]}}]})");
  std::vector<std::string> calls;
  RemovableHandle h = RegisterGlobalForwardHook(
      [&calls](Module& mod, const std::vector<Tensor>&,
               const std::vector<Tensor>&) -> ForwardHookResult {
        calls.push_back(mod.type_name());
        return std::nullopt;
      });
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({1, 2}, {1, 2})}).status());
  h.Remove();
  EXPECT_THAT(calls, ElementsAre("Linear", "ReLU", "Linear", "Sequential"));
}

TEST(ForwardHooksTest, HookErrorAbortsForward) {
  std::shared_ptr<Module> m = SmallLinear();
  RemovableHandle h = m->RegisterForwardPreHook(
      [](Module&, const std::vector<Tensor>&) -> ForwardHookResult {
        return absl::PermissionDeniedError("no forward today");
      });
  EXPECT_THAT(
      Forward(*m, {Values({1, 2}, {1, 0})}).status(),
      StatusIs(absl::StatusCode::kPermissionDenied, "no forward today"));
  h.Remove();
}

TEST(ForwardHooksTest, RemovingInsideAHookTakesEffectNextCall) {
  std::shared_ptr<Module> m = SmallLinear();
  int calls = 0;
  auto handle = std::make_shared<RemovableHandle>();
  *handle = m->RegisterForwardHook(
      [&calls, handle](Module&, const std::vector<Tensor>&,
                       const std::vector<Tensor>&) -> ForwardHookResult {
        ++calls;
        handle->Remove();
        return std::nullopt;
      });
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({1, 2}, {1, 0})}).status());
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({1, 2}, {1, 0})}).status());
  EXPECT_EQ(calls, 1);
}

// ---------------------------------------------------------------------------
// BatchNorm's buffers.

TEST(ForwardTest, BatchNormTrainingUpdatesRunningStatistics) {
  std::shared_ptr<Module> m = Build(R"({"type": "BatchNorm1d", "args": [2]})");
  m->Train();
  // Channel 0: {1, 3} (mean 2, biased var 1, unbiased 2); channel 1: {0, 0}.
  Tensor x = Values({2, 2}, {1, 0, 3, 0});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out, Forward(*m, {x}));
  EXPECT_THAT(Read(out[0]), Pointwise(DoubleNear(1e-3), {-1.0, 0.0, 1.0, 0.0}));
  EXPECT_THAT(Read(*m->buffers().Find("running_mean")),
              Pointwise(DoubleNear(1e-6), {0.2, 0.0}));
  EXPECT_THAT(Read(*m->buffers().Find("running_var")),
              Pointwise(DoubleNear(1e-6), {0.9 + 0.2, 0.9}));
  EXPECT_THAT(Read(*m->buffers().Find("num_batches_tracked")), ElementsAre(1));

  // Eval uses the buffers and leaves them alone.
  m->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(out, Forward(*m, {x}));
  EXPECT_NEAR(Read(out[0])[0], (1 - 0.2) / std::sqrt(1.1 + 1e-5), 1e-6);
  EXPECT_THAT(Read(*m->buffers().Find("num_batches_tracked")), ElementsAre(1));
}

TEST(ForwardTest, BatchNormMomentumNoneIsCumulativeAverage) {
  std::shared_ptr<Module> m = Build(
      R"({"type": "BatchNorm1d", "args": [1], "kwargs": {"momentum": null}})");
  m->Train();
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({2, 1}, {1, 3})}).status());
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({2, 1}, {5, 7})}).status());
  // The plain average of the batch means (2 and 6) and unbiased variances.
  EXPECT_THAT(Read(*m->buffers().Find("running_mean")),
              Pointwise(DoubleNear(1e-6), {4.0}));
  EXPECT_THAT(Read(*m->buffers().Find("running_var")),
              Pointwise(DoubleNear(1e-6), {2.0}));
  EXPECT_THAT(Read(*m->buffers().Find("num_batches_tracked")), ElementsAre(2));
}

TEST(ForwardTest, BatchNormWithoutRunningStatsUsesBatchStatsInEval) {
  std::shared_ptr<Module> m = Build(
      R"({"type": "BatchNorm1d", "args": [1],
          "kwargs": {"track_running_stats": false}})");
  m->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*m, {Values({2, 1}, {1, 3})}));
  EXPECT_THAT(Read(out[0]), Pointwise(DoubleNear(1e-3), {-1.0, 1.0}));
}

// ---------------------------------------------------------------------------
// Dropout.

TEST(ForwardTest, DropoutIsIdentityInEvalAndSeededInTraining) {
  std::shared_ptr<Module> m = Build(R"({"type": "Dropout", "args": [0.5]})");
  Tensor x = Values({1000}, std::vector<double>(1000, 1.0));
  m->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out, Forward(*m, {x}));
  EXPECT_TRUE(out[0].is_same(x));
  m->Train();
  ForwardOptions options;
  options.seed = 7;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> a,
                                  Forward(*m, {x}, options));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> b,
                                  Forward(*m, {x}, options));
  EXPECT_EQ(Read(a[0]), Read(b[0]));
  int kept = 0;
  for (double v : Read(a[0])) {
    EXPECT_TRUE(v == 0.0 || v == 2.0) << v;
    kept += v != 0.0;
  }
  EXPECT_GT(kept, 400);
  EXPECT_LT(kept, 600);
}

// ---------------------------------------------------------------------------
// Errors.

TEST(ForwardErrorsTest, LinearShapeMismatch) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [4, 3]})");
  EXPECT_THAT(
      Forward(*m, {Values({2, 5}, std::vector<double>(10, 0))}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x3)"));
}

TEST(ForwardErrorsTest, DTypeMismatch) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 3]})");
  EXPECT_THAT(
      Forward(*m, {Values({1, 2}, {1, 2}, DType::kFloat64)}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("expected scalar type Double but found Float")));
  EXPECT_THAT(Forward(*m, {Values({1, 2}, {1, 2}, DType::kInt64)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "\"Linear\" not implemented for 'Long'"));
}

TEST(ForwardErrorsTest, BatchNormInputDims) {
  std::shared_ptr<Module> m = Build(R"({"type": "BatchNorm2d", "args": [3]})");
  EXPECT_THAT(
      Forward(*m, {Values({1, 3, 2}, std::vector<double>(6, 0))}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "expected 4D input (got 3D input)"));
  std::shared_ptr<Module> bn1 =
      Build(R"({"type": "BatchNorm1d", "args": [4]})");
  EXPECT_THAT(
      Forward(*bn1, {Values({1, 4}, std::vector<double>(4, 0))}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "Expected more than 1 value per channel when training, got "
               "input size torch.Size([1, 4])"));
}

TEST(ForwardErrorsTest, ConvChannels) {
  std::shared_ptr<Module> m = Build(R"({"type": "Conv2d", "args": [3, 8, 3]})");
  EXPECT_THAT(
      Forward(*m, {Values({1, 4, 5, 5}, std::vector<double>(100, 0))}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "Given groups=1, weight of size [8, 3, 3, 3], expected "
               "input[1, 4, 5, 5] to have 3 channels, but got 4 channels "
               "instead"));
  EXPECT_THAT(
      Forward(*m, {Values({4, 5}, std::vector<double>(20, 0))}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "Expected 3D (unbatched) or 4D (batched) input to "
               "conv2d, but got input of size: [4, 5]"));
}

TEST(ForwardErrorsTest, EmbeddingIndices) {
  std::shared_ptr<Module> m =
      Build(R"({"type": "Embedding", "args": [10, 3]})");
  EXPECT_THAT(Forward(*m, {Values({2}, {1, 10}, DType::kInt64)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "index out of range in self"));
  EXPECT_THAT(Forward(*m, {Values({2}, {1, 2})}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'indices' to have one of the following "
                                 "scalar types: Long, Int; but got "
                                 "torch.FloatTensor instead")));
}

TEST(ForwardErrorsTest, ContainersWithoutForward) {
  std::shared_ptr<Module> m = Build(R"({"type": "ModuleList", "children": [
      {"spec": {"type": "ReLU"}}]})");
  EXPECT_THAT(Forward(*m, {Values({1}, {1})}).status(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       "Module [ModuleList] is missing the required "
                       "\"forward\" function"));
}

TEST(ForwardErrorsTest, MetaTensors) {
  BuildOptions options;
  options.hooks = nullptr;
  options.device = Device{DeviceType::kMeta, 0};
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildModule(
          testing::SpecFromJson(R"({"type": "Linear", "args": [2, 2]})"),
          options));
  EXPECT_THAT(Forward(*built.root, {Values({1, 2}, {1, 2})}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ForwardErrorsTest, WrongNumberOfInputs) {
  std::shared_ptr<Module> m = SmallLinear();
  EXPECT_THAT(Forward(*m, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("takes 1 tensor arguments but 0 were given")));
}

// What _BatchNorm.forward does in training with one running statistic None
// (torch 1.13): the other still moves, num_batches_tracked still counts.
TEST(TorchParityTest, BatchNormLearnsIntoTheRunningStatsItHas) {
  std::shared_ptr<Module> m = Build(R"({"type": "BatchNorm1d", "args": [2]})");
  MODELSTATE_ASSERT_OK(m->RegisterBuffer("running_mean", Tensor()).status());
  // Batch mean [2, 4], unbiased variance [2, 8]; momentum 0.1.
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({2, 2}, {1, 2, 3, 6})}).status());
  EXPECT_THAT(Read(*m->buffers().Find("running_var")),
              Pointwise(DoubleNear(1e-6), {1.1, 1.7}));
  EXPECT_THAT(Read(*m->buffers().Find("num_batches_tracked")), ElementsAre(1));
}

// With momentum None the factor is 1 / num_batches_tracked, or 0 when the
// counter itself is None: nothing moves.
TEST(TorchParityTest, BatchNormWithoutACounterHasNoCumulativeAverage) {
  std::shared_ptr<Module> m = Build(
      R"({"type": "BatchNorm1d", "args": [2], "kwargs": {"momentum": null}})");
  MODELSTATE_ASSERT_OK(
      m->RegisterBuffer("num_batches_tracked", Tensor()).status());
  MODELSTATE_ASSERT_OK(Forward(*m, {Values({2, 2}, {1, 2, 3, 6})}).status());
  EXPECT_THAT(Read(*m->buffers().Find("running_mean")), ElementsAre(0, 0));
  EXPECT_THAT(Read(*m->buffers().Find("running_var")), ElementsAre(1, 1));
}

// ATen refuses one value per channel only; an empty batch normalizes to an
// empty output and is still counted.
TEST(TorchParityTest, BatchNormTakesAnEmptyBatch) {
  std::shared_ptr<Module> m = Build(R"({"type": "BatchNorm2d", "args": [3]})");
  absl::StatusOr<std::vector<Tensor>> out =
      Forward(*m, {Values({0, 3, 2, 2}, {})});
  MODELSTATE_ASSERT_OK(out.status());
  EXPECT_EQ((*out)[0].shape(), (Shape{0, 3, 2, 2}));
  EXPECT_THAT(Read(*m->buffers().Find("num_batches_tracked")), ElementsAre(1));
  EXPECT_THAT(Read(*m->buffers().Find("running_var")), ElementsAre(1, 1, 1));
}

// embedding_renorm_ measures rows with torch.norm: the largest magnitude for
// inf, the count of non-zeros for 0.
TEST(TorchParityTest, EmbeddingMaxNormUsesTorchsNorms) {
  for (double p : {std::numeric_limits<double>::infinity(), 0.0}) {
    ModuleSpec spec = testing::SpecFromJson(
        R"({"type": "Embedding", "args": [3, 2], "kwargs": {"max_norm": 1.0}})");
    spec.kwargs.emplace_back("norm_type", p);
    BuildOptions options;
    options.hooks = nullptr;
    absl::StatusOr<BuildResult> built = BuildModule(spec, options);
    MODELSTATE_ASSERT_OK(built.status());
    Module& m = *built->root;
    Set(m, "weight", {3, 4, 0.5, -2, 0.1, 0.2});
    MODELSTATE_ASSERT_OK(
        Forward(m, {Values({2}, {0, 1}, DType::kInt64)}).status());
    // inf: norms 4 and 2; 0: two non-zeros in each row. Row 2 is not looked
    // up and keeps its values.
    const double s0 = std::isinf(p) ? 4 : 2, s1 = 2;
    EXPECT_THAT(Read(*m.parameters().Find("weight")),
                Pointwise(DoubleNear(1e-5),
                          {3 / s0, 4 / s0, 0.5 / s1, -2 / s1, 0.1, 0.2}))
        << "norm_type " << p;
  }
}

// torch.norm of nothing is 0 for every p, negative ones included.
TEST(TorchParityTest, PairwiseDistanceOfEmptyRowsIsZero) {
  for (double p : {-1.0, -std::numeric_limits<double>::infinity(), 0.0, 2.0}) {
    ModuleSpec spec = testing::SpecFromJson(R"({"type": "PairwiseDistance"})");
    spec.kwargs.emplace_back("p", p);
    BuildOptions options;
    options.hooks = nullptr;
    absl::StatusOr<BuildResult> built = BuildModule(spec, options);
    MODELSTATE_ASSERT_OK(built.status());
    absl::StatusOr<std::vector<Tensor>> out =
        Forward(*built->root, {Values({3, 0}, {}), Values({3, 0}, {})});
    MODELSTATE_ASSERT_OK(out.status());
    EXPECT_THAT(Read((*out)[0]), ElementsAre(0, 0, 0)) << "p " << p;
  }
}

// PyTorch leaves a Conv's bias uninitialised when the weight has no fan-in;
// here it is zero, so that a build never returns heap contents.
TEST(TorchParityTest, ConvWithoutFanInHasAZeroBias) {
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<Module> m =
        Build(R"({"type": "Conv2d", "args": [0, 4, 3]})");
    EXPECT_THAT(Read(*m->parameters().Find("bias")), ElementsAre(0, 0, 0, 0));
  }
  std::shared_ptr<Module> none_out =
      Build(R"({"type": "Conv2d", "args": [2, 0, 3]})");
  EXPECT_THAT(
      Forward(*none_out, {Values({1, 2, 4, 4}, std::vector<double>(32, 1))})
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "Given groups=1, expected weight to be at least 1 at dimension "
               "0, but got weight of size [0, 2, 3, 3] instead"));
}

}  // namespace
}  // namespace modelstate
