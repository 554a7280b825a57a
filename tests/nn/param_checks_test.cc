// Forward on a layer whose entries were changed after the build
// (RegisterParameter / RegisterBuffer accept None and tensors of any shape)
// or whose size attributes the kernels divide by are out of range: a clear
// status naming the entry or argument, never a read past a tensor's storage
// or a division by zero (nn/layers/param_check.h). Also EmbeddingBag's
// offsets and the constructor checks of Conv, RNN and LPPool.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/forward.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildFromJson;
using ::modelstate::testing::Filled;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

Tensor Ones(Shape shape) { return Filled(DType::kFloat32, shape, 1.0); }

Tensor Longs(std::vector<double> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  absl::StatusOr<Tensor> t = Tensor::FromDoubles(DType::kInt64, {n}, values);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : Tensor();
}

// What is done to one entry before the forward.
enum class Change { kNone, kShape };

struct EntryCase {
  const char* spec;
  const char* owner;  // the submodule holding the entry ("" for the root)
  const char* entry;
  bool buffer;
  Change change;
  Shape shape;  // for kShape
  std::vector<Tensor> inputs;
  const char* message;
};

// Builds `c.spec` (eval mode), replaces its entry and runs forward.
absl::Status RunChanged(const EntryCase& c) {
  absl::StatusOr<BuildResult> built = BuildFromJson(c.spec);
  if (!built.ok()) return built.status();
  built->root->Eval();
  absl::StatusOr<std::shared_ptr<Module>> owner =
      built->root->GetSubmodule(c.owner);
  if (!owner.ok()) return owner.status();
  Tensor value;
  if (c.change == Change::kShape) {
    value = Ones(c.shape);
    if (!c.buffer) {
      absl::StatusOr<Tensor> p = MakeParameter(value);
      if (!p.ok()) return p.status();
      value = *p;
    }
  }
  absl::StatusOr<RegistrationOutcome> registered =
      c.buffer ? (*owner)->RegisterBuffer(c.entry, value)
               : (*owner)->RegisterParameter(c.entry, value);
  if (!registered.ok()) return registered.status();
  return Forward(*built->root, c.inputs).status();
}

TEST(ParamChecksTest, NoneEntryIsFailedPreconditionNamingIt) {
  const EntryCase cases[] = {
      {R"({"type": "Embedding", "args": [10, 4]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Longs({1, 2})},
       "Embedding.weight is None, expected a 2-d tensor"},
      {R"({"type": "EmbeddingBag", "args": [10, 4]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Longs({1, 2}), Longs({0})},
       "EmbeddingBag.weight is None"},
      {R"({"type": "Conv2d", "args": [2, 3, 3]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({1, 2, 8, 8})},
       "Conv2d.weight is None, expected a 4-d tensor"},
      {R"({"type": "ConvTranspose2d", "args": [2, 3, 3]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({1, 2, 4, 4})},
       "ConvTranspose2d.weight is None, expected a 4-d tensor"},
      {R"({"type": "Linear", "args": [3, 4]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({2, 3})},
       "Linear.weight is None"},
      {R"({"type": "Bilinear", "args": [3, 4, 5]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({2, 3}), Ones({2, 4})},
       "Bilinear.weight is None, expected a 3-d tensor"},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "",
       "in_proj_weight",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.in_proj_weight is None, expected a tensor of "
       "shape [12, 4]"},
      {R"({"type": "MultiheadAttention", "args": [4, 2],
           "kwargs": {"kdim": 3, "vdim": 5}})",
       "",
       "k_proj_weight",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 4}), Ones({2, 1, 3}), Ones({2, 1, 5})},
       "MultiheadAttention.k_proj_weight is None, expected a tensor of "
       "shape [4, 3]"},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "out_proj",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.out_proj.weight is None"},
      {R"({"type": "MultiheadAttention", "args": [4, 2],
           "kwargs": {"add_bias_kv": true}})",
       "",
       "bias_v",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.bias_v is None"},
      {R"({"type": "PReLU", "args": [2]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({1, 2, 3})},
       "PReLU.weight is None"},
      {R"({"type": "LSTM", "args": [5, 20]})",
       "",
       "weight_hh_l0",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 5})},
       "LSTM.weight_hh_l0 is None, expected a tensor of shape [80, 20]"},
      {R"({"type": "GRUCell", "args": [5, 20]})",
       "",
       "weight_ih",
       false,
       Change::kNone,
       {},
       {Ones({1, 5})},
       "GRUCell.weight_ih is None"},
  };
  for (const EntryCase& c : cases) {
    SCOPED_TRACE(c.spec);
    SCOPED_TRACE(c.entry);
    EXPECT_THAT(RunChanged(c), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr(c.message)));
  }
}

TEST(ParamChecksTest, RunningStatsHalfNoneInEvalIsTorchsError) {
  const EntryCase cases[] = {
      {R"({"type": "BatchNorm1d", "args": [4]})",
       "",
       "running_var",
       true,
       Change::kNone,
       {},
       {Ones({2, 4})},
       "running_var must be defined in evaluation mode"},
      {R"({"type": "InstanceNorm1d", "args": [4],
           "kwargs": {"track_running_stats": true}})",
       "",
       "running_mean",
       true,
       Change::kNone,
       {},
       {Ones({2, 4, 3})},
       "Expected running_mean and running_var to be defined when "
       "use_input_stats is false (InstanceNorm1d.running_mean is None)"},
  };
  for (const EntryCase& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(RunChanged(c), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr(c.message)));
  }
}

TEST(ParamChecksTest, OptionalEntriesMayBeNone) {
  // PyTorch's functional forms take None for these: forward runs.
  const EntryCase cases[] = {
      {R"({"type": "Linear", "args": [3, 4]})",
       "",
       "bias",
       false,
       Change::kNone,
       {},
       {Ones({2, 3})},
       ""},
      {R"({"type": "Conv2d", "args": [2, 3, 3]})",
       "",
       "bias",
       false,
       Change::kNone,
       {},
       {Ones({1, 2, 5, 5})},
       ""},
      {R"({"type": "LayerNorm", "args": [4]})",
       "",
       "weight",
       false,
       Change::kNone,
       {},
       {Ones({2, 4})},
       ""},
      {R"({"type": "GroupNorm", "args": [2, 4]})",
       "",
       "bias",
       false,
       Change::kNone,
       {},
       {Ones({2, 4, 3})},
       ""},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "",
       "in_proj_bias",
       false,
       Change::kNone,
       {},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       ""},
      {R"({"type": "LSTMCell", "args": [5, 20]})",
       "",
       "bias_hh",
       false,
       Change::kNone,
       {},
       {Ones({1, 5})},
       ""},
  };
  for (const EntryCase& c : cases) {
    SCOPED_TRACE(c.spec);
    SCOPED_TRACE(c.entry);
    MODELSTATE_EXPECT_OK(RunChanged(c));
  }
}

TEST(ParamChecksTest, EntryOfAnotherShapeIsFailedPreconditionNamingIt) {
  const EntryCase cases[] = {
      {R"({"type": "Conv2d", "args": [2, 3, 3]})",
       "",
       "weight",
       false,
       Change::kShape,
       {3},
       {Ones({1, 2, 8, 8})},
       "Conv2d.weight has shape [3], expected a 4-d tensor"},
      {R"({"type": "Conv1d", "args": [2, 3, 3]})",
       "",
       "bias",
       false,
       Change::kShape,
       {2},
       {Ones({1, 2, 8})},
       "Conv1d.bias has shape [2], expected [3]"},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "",
       "in_proj_weight",
       false,
       Change::kShape,
       {2},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.in_proj_weight has shape [2], expected [12, 4]"},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "out_proj",
       "bias",
       false,
       Change::kShape,
       {1},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.out_proj.bias has shape [1], expected [4]"},
      {R"({"type": "LayerNorm", "args": [64]})",
       "",
       "weight",
       false,
       Change::kShape,
       {1},
       {Ones({1, 64})},
       "LayerNorm.weight has shape [1], expected [64]"},
      {R"({"type": "Embedding", "args": [10, 4]})",
       "",
       "weight",
       false,
       Change::kShape,
       {10},
       {Longs({1, 2})},
       "Embedding.weight has shape [10], expected a 2-d tensor"},
      {R"({"type": "EmbeddingBag", "args": [10, 4]})",
       "",
       "weight",
       false,
       Change::kShape,
       {10},
       {Longs({1, 2}), Longs({0})},
       "EmbeddingBag.weight has shape [10], expected a 2-d tensor"},
      {R"({"type": "Bilinear", "args": [3, 4, 5]})",
       "",
       "bias",
       false,
       Change::kShape,
       {2},
       {Ones({2, 3}), Ones({2, 4})},
       "Bilinear.bias has shape [2], expected [5]"},
      {R"({"type": "BatchNorm2d", "args": [4]})",
       "",
       "running_mean",
       true,
       Change::kShape,
       {2},
       {Ones({2, 4, 3, 3})},
       "BatchNorm2d.running_mean has shape [2], expected [4]"},
      {R"({"type": "BatchNorm1d", "args": [4]})",
       "",
       "num_batches_tracked",
       true,
       Change::kShape,
       {0},
       {Ones({2, 4})},
       "BatchNorm1d.num_batches_tracked has shape [0], expected []"},
      {R"({"type": "InstanceNorm2d", "args": [4], "kwargs": {"affine": true}})",
       "",
       "weight",
       false,
       Change::kShape,
       {3},
       {Ones({1, 4, 3, 3})},
       "InstanceNorm2d.weight has shape [3], expected [4]"},
      {R"({"type": "GroupNorm", "args": [2, 4]})",
       "",
       "weight",
       false,
       Change::kShape,
       {2},
       {Ones({2, 4, 3})},
       "GroupNorm.weight has shape [2], expected [4]"},
      {R"({"type": "PReLU", "args": [2]})",
       "",
       "weight",
       false,
       Change::kShape,
       {1},
       {Ones({1, 2, 3})},
       "PReLU.weight has shape [1], expected [2]"},
      {R"({"type": "LSTM", "args": [5, 20]})",
       "",
       "weight_hh_l0",
       false,
       Change::kShape,
       {3},
       {Ones({3, 1, 5})},
       "LSTM.weight_hh_l0 has shape [3], expected [80, 20]"},
      {R"({"type": "RNNCell", "args": [5, 20]})",
       "",
       "bias_ih",
       false,
       Change::kShape,
       {3},
       {Ones({1, 5})},
       "RNNCell.bias_ih has shape [3], expected [20]"},
  };
  for (const EntryCase& c : cases) {
    SCOPED_TRACE(c.spec);
    SCOPED_TRACE(c.entry);
    EXPECT_THAT(RunChanged(c), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr(c.message)));
  }
}

// F.linear, F.embedding and F.conv*d take their extents from the weight,
// so PyTorch runs a layer whose weight was replaced by one of another shape
// (only the bias must agree): so does forward, with PyTorch's errors where
// the input no longer fits.
TEST(ParamChecksTest, AWeightOfAnotherShapeRunsAsInPyTorch) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult linear,
      BuildFromJson(R"({"type": "Linear", "args": [3, 4]})"));
  linear.root->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor w, MakeParameter(Ones({7, 3})));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor b, MakeParameter(Ones({7})));
  MODELSTATE_ASSERT_OK(linear.root->RegisterParameter("weight", w).status());
  MODELSTATE_ASSERT_OK(linear.root->RegisterParameter("bias", b).status());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*linear.root, {Ones({2, 3})}));
  EXPECT_TRUE(TensorsEqual(out[0], Filled(DType::kFloat32, {2, 7}, 4.0)));
  EXPECT_THAT(Forward(*linear.root, {Ones({2, 4})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mat1 and mat2 shapes cannot be multiplied "
                                 "(2x4 and 3x7)")));

  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult conv,
      BuildFromJson(R"({"type": "Conv2d", "args": [2, 3, 3]})"));
  conv.root->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(w, MakeParameter(Ones({5, 2, 1, 1})));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(b, MakeParameter(Ones({5})));
  MODELSTATE_ASSERT_OK(conv.root->RegisterParameter("weight", w).status());
  MODELSTATE_ASSERT_OK(conv.root->RegisterParameter("bias", b).status());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(out,
                                  Forward(*conv.root, {Ones({1, 2, 8, 8})}));
  EXPECT_TRUE(TensorsEqual(out[0], Filled(DType::kFloat32, {1, 5, 8, 8}, 3.0)));

  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult bag,
      BuildFromJson(R"({"type": "EmbeddingBag", "args": [10, 4]})"));
  bag.root->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(w, MakeParameter(Ones({2, 4})));
  MODELSTATE_ASSERT_OK(bag.root->RegisterParameter("weight", w).status());
  MODELSTATE_ASSERT_OK(
      Forward(*bag.root, {Longs({0, 1}), Longs({0})}).status());
  EXPECT_THAT(Forward(*bag.root, {Longs({1, 2}), Longs({0})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("index out of range in self")));
}

TEST(ParamChecksTest, TransformerLayerReportsItsSubmodulesEntry) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildFromJson(R"({"type": "TransformerEncoderLayer", "args": [4, 2],
                "kwargs": {"dim_feedforward": 8}})"));
  built.root->Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> linear,
                                  built.root->GetSubmodule("linear1"));
  MODELSTATE_ASSERT_OK(linear->RegisterParameter("weight", Tensor()));
  EXPECT_THAT(Forward(*built.root, {Ones({3, 1, 4})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("Linear.weight is None")));
}

TEST(ParamChecksTest, CustomModuleUnderALibraryNameFailsCleanly) {
  // Forward dispatches by type name, so a custom module named like a layer
  // runs that layer's forward (layer_registry_test: a custom
  // NonDynamicallyQuantizableLinear runs as a Linear). One without the
  // layer's attributes or entries gets FAILED_PRECONDITION naming what is
  // missing, not a read of a weight it does not have.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildFromJson(R"({"type": "Embedding", "custom": true})"));
  EXPECT_THAT(
      Forward(*built.root, {Longs({1, 2})}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Embedding.weight is None, expected a 2-d tensor")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult linear,
      BuildFromJson(R"({"type": "Linear", "custom": true})"));
  EXPECT_THAT(
      Forward(*linear.root, {Ones({1, 2})}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Linear.weight is None, expected a 2-d tensor")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult with_bias, BuildFromJson(R"({"type": "Linear", "custom": true,
          "members": [
            {"parameter": {"name": "weight", "init": {"kind": "ones"},
                           "shape": [3, 2]}},
            {"parameter": {"name": "bias", "init": {"kind": "zeros"},
                           "shape": [2]}}]})"));
  EXPECT_THAT(Forward(*with_bias.root, {Ones({1, 2})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("Linear.bias has shape [2], expected [3]")));
}

TEST(ParamChecksTest, EmbeddingBagOffsetsMustStayInTheInputInOrder) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildFromJson(R"({"type": "EmbeddingBag", "args": [10, 4],
                                   "kwargs": {"mode": "sum"}})"));
  const Tensor input = Longs({1, 2, 3});
  struct Case {
    std::vector<double> offsets;
    const char* message;
  } cases[] = {
      {{0, 50000000, 3},
       "offsets[1] can not be greater than input's length (3), but got "
       "offsets[1] of 50000000"},
      {{0, 2, 1},
       "offsets has to be non-decreasing, but got offsets[2] of 1 after "
       "offsets[1] of 2"},
      {{0, -1, 3},
       "offsets has to be non-decreasing, but got offsets[1] of -1 after "
       "offsets[0] of 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(
        Forward(*built.root, {input, Longs(c.offsets)}),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  // Empty bags (equal offsets) stay allowed.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out,
      Forward(*built.root, {input, Longs({0, 1, 1, 3})}));
  EXPECT_EQ(out[0].shape(), (Shape{4, 4}));
}

TEST(ParamChecksTest, SizeArgumentsAreCheckedAtBuild) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "Conv2d", "args": [2, 2, 3], "kwargs": {"stride": 0}})",
       "Conv2d: argument 'stride' must be at least 1, got 0"},
      {R"({"type": "Conv2d", "args": [2, 2, 3], "kwargs": {"dilation": 0}})",
       "Conv2d: argument 'dilation' must be at least 1, got 0"},
      {R"({"type": "Conv2d", "args": [2, 2, 3], "kwargs": {"padding": -2}})",
       "Conv2d: argument 'padding' must be at least 0, got -2"},
      {R"({"type": "Conv2d", "args": [2, 2, 0]})",
       "Conv2d: argument 'kernel_size' must be at least 1, got 0"},
      {R"({"type": "Conv1d", "args": [2, 2, 3], "kwargs": {"stride": [0]}})",
       "Conv1d: argument 'stride' must be at least 1, got 0"},
      {R"({"type": "ConvTranspose2d", "args": [2, 2, 3],
           "kwargs": {"stride": 0}})",
       "ConvTranspose2d: argument 'stride' must be at least 1, got 0"},
      {R"({"type": "ConvTranspose2d", "args": [2, 2, 3],
           "kwargs": {"output_padding": -1}})",
       "ConvTranspose2d: argument 'output_padding' must be at least 0, got -1"},
      {R"({"type": "RNN", "args": [4, 5], "kwargs": {"num_layers": 0}})",
       "RNN: argument 'num_layers' must be at least 1, got 0"},
      {R"({"type": "LSTM", "args": [4, 5, 0]})",
       "LSTM: argument 'num_layers' must be at least 1, got 0"},
      {R"({"type": "LPPool2d", "args": [0, 2]})",
       "LPPool2d: argument 'norm_type' must not be 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(ParamChecksTest, ZeroSizesTorchCannotInitialiseAreRefusedAtBuild) {
  // torch 1.13's constructors raise ZeroDivisionError for these (verified
  // with torch: Bilinear's 1 / math.sqrt(in1_features), xavier_uniform_ of
  // a [0, 0] weight, embed_dim // num_heads, num_channels % num_groups).
  struct Case {
    const char* spec;
    const char* message;
  } refused[] = {
      {R"({"type": "Bilinear", "args": [0, 4, 2]})",
       "Bilinear: argument 'in1_features' must not be 0 (reset_parameters "
       "computes 1 / math.sqrt(in1_features): ZeroDivisionError: float "
       "division by zero)"},
      {R"({"type": "Bilinear", "args": [0, 0, 2], "kwargs": {"bias": false}})",
       "Bilinear: argument 'in1_features' must not be 0"},
      {R"({"type": "MultiheadAttention", "args": [0, 1]})",
       "MultiheadAttention: argument 'embed_dim' must not be 0 "
       "(_reset_parameters' xavier_uniform_ raises ZeroDivisionError: float "
       "division by zero)"},
      {R"({"type": "MultiheadAttention", "args": [0, 1],
           "kwargs": {"kdim": 4, "vdim": 4}})",
       "argument 'embed_dim' must not be 0"},
      {R"({"type": "MultiheadAttention", "args": [4, 0]})",
       "MultiheadAttention: argument 'num_heads' must not be 0 (embed_dim // "
       "num_heads raises ZeroDivisionError: integer division or modulo by "
       "zero)"},
      {R"({"type": "TransformerEncoderLayer", "args": [0, 1]})",
       "argument 'embed_dim' must not be 0"},
      {R"({"type": "TransformerDecoderLayer", "args": [0, 1]})",
       "argument 'embed_dim' must not be 0"},
      {R"({"type": "Transformer", "kwargs": {"d_model": 0, "nhead": 1}})",
       "argument 'embed_dim' must not be 0"},
      {R"({"type": "GroupNorm", "args": [0, 4]})",
       "GroupNorm: argument 'num_groups' must not be 0 (num_channels % "
       "num_groups raises ZeroDivisionError: integer modulo by zero)"},
      // The init rules: xavier_* of a tensor without fans.
      {R"({"type": "Net", "members": [{"parameter": {"name": "w",
           "shape": [0, 0], "init": {"kind": "xavier_uniform", "a": 1.0}}}]})",
       "ZeroDivisionError: float division by zero (fan_in + fan_out is 0)"},
      {R"({"type": "Net", "members": [{"buffer": {"name": "b",
           "shape": [0, 3, 0], "init": {"kind": "xavier_normal", "a": 1.0}}}]})",
       "ZeroDivisionError: float division by zero (fan_in + fan_out is 0)"},
  };
  for (const Case& c : refused) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  // The zero sizes torch 1.13 builds (kaiming_* skip a zero-element tensor,
  // Embedding draws normal_, in2_features only sizes the weight).
  for (const char* spec : {
           R"({"type": "Bilinear", "args": [4, 0, 2]})",
           R"({"type": "Bilinear", "args": [4, 4, 0]})",
           R"({"type": "Linear", "args": [0, 4]})",
           R"({"type": "Conv2d", "args": [0, 4, 3]})",
           R"({"type": "Embedding", "args": [0, 3]})",
           R"({"type": "MultiheadAttention", "args": [4, 1],
               "kwargs": {"kdim": 0, "vdim": 0}})",
           R"({"type": "TransformerEncoderLayer", "args": [4, 1],
               "kwargs": {"dim_feedforward": 0}})",
           R"({"type": "GroupNorm", "args": [1, 0]})",
           R"({"type": "Net", "members": [{"parameter": {"name": "w",
               "shape": [0, 3], "init": {"kind": "xavier_uniform",
               "a": 1.0}}}]})",
       }) {
    SCOPED_TRACE(spec);
    MODELSTATE_EXPECT_OK(BuildFromJson(spec).status());
  }
}

TEST(ParamChecksTest, SizeAttributesAreCheckedAtForward) {
  // A module restored or built another way may hold what the build refuses.
  struct Case {
    const char* spec;
    const char* attr;
    AttrValue value;
    std::vector<Tensor> inputs;
    const char* message;
  } cases[] = {
      {R"({"type": "Conv2d", "args": [2, 2, 3]})",
       "stride",
       std::vector<int64_t>{0, 0},
       {Ones({1, 2, 8, 8})},
       "Conv2d.stride is [0, 0]: non-positive stride is not supported"},
      {R"({"type": "Conv2d", "args": [2, 2, 3]})",
       "dilation",
       std::vector<int64_t>{1, 0},
       {Ones({1, 2, 8, 8})},
       "Conv2d.dilation is [1, 0]: dilation should be greater than zero"},
      {R"({"type": "Conv2d", "args": [2, 2, 3]})",
       "groups",
       int64_t{0},
       {Ones({1, 2, 8, 8})},
       "Conv2d.groups is 0"},
      {R"({"type": "Conv2d", "args": [2, 2, 3]})",
       "padding",
       std::vector<int64_t>{-2, 0},
       {Ones({1, 2, 8, 8})},
       "negative padding is not supported"},
      {R"({"type": "ConvTranspose2d", "args": [2, 2, 3]})",
       "stride",
       std::vector<int64_t>{0, 0},
       {Ones({1, 2, 4, 4})},
       "ConvTranspose2d.stride is [0, 0]: non-positive stride"},
      {R"({"type": "GroupNorm", "args": [2, 4]})",
       "num_groups",
       int64_t{0},
       {Ones({2, 4, 3})},
       "GroupNorm.num_groups is 0"},
      {R"({"type": "MultiheadAttention", "args": [4, 2]})",
       "num_heads",
       int64_t{0},
       {Ones({3, 1, 4}), Ones({3, 1, 4}), Ones({3, 1, 4})},
       "MultiheadAttention.num_heads is 0"},
      {R"({"type": "RNN", "args": [4, 5]})",
       "num_layers",
       int64_t{0},
       {Ones({3, 1, 4})},
       "RNN.num_layers is 0"},
      {R"({"type": "LPPool1d", "args": [2, 2]})",
       "norm_type",
       0.0,
       {Ones({1, 2, 8})},
       "LPPool1d.norm_type is 0: float division by zero"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    SCOPED_TRACE(c.attr);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, BuildFromJson(c.spec));
    built.root->Eval();
    built.root->SetPlainAttribute(c.attr, c.value);
    EXPECT_THAT(
        Forward(*built.root, c.inputs),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(c.message)));
  }
}

}  // namespace
}  // namespace modelstate
