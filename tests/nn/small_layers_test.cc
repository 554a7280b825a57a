// The last torch.nn layers of issue 18 (nn/layers/activation.cc,
// dropout.cc, pixel_shuffle.cc, normalization.cc, distance.cc, fold.cc,
// LPPool in pooling.cc): torch's
// constructor and forward checks with its texts, and the values that need
// no torch to know. Values against real torch are in
// tests/python/{layers_match_torch,forward_matches_torch}.py.
#include <set>
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor Ones(Shape shape) { return Filled(DType::kFloat32, shape, 1.0); }

Tensor Values(Shape shape, std::vector<double> values) {
  absl::StatusOr<Tensor> t =
      Tensor::FromDoubles(DType::kFloat32, std::move(shape), values);
  EXPECT_TRUE(t.ok());
  return *t;
}

std::vector<float> Read(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(SmallLayersTest, ConstructorChecksAreTorchs) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "Hardtanh", "args": [2, 1]})",
       "AssertionError: Hardtanh's max_val (1) must be greater than its "
       "min_val (2)"},
      {R"({"type": "Hardtanh", "kwargs": {"min_value": 3}})",
       "must be greater than its min_val (3)"},
      {R"({"type": "Threshold", "args": [0.1]})",
       "missing 1 required positional argument: 'value'"},
      {R"({"type": "CELU", "args": ["a"]})", "alpha"},
      {R"({"type": "GLU", "args": [1.5]})", "dim"},
      {R"({"type": "Softshrink", "kwargs": {"lambda": 1}})", "lambda"},
      {R"({"type": "FeatureAlphaDropout", "args": [2]})",
       "dropout probability has to be between 0 and 1, but got 2"},
      {R"({"type": "ChannelShuffle"})",
       "missing 1 required positional argument: 'groups'"},
      {R"({"type": "LocalResponseNorm", "kwargs": {"alpha": 1}})",
       "missing 1 required positional argument: 'size'"},
      {R"({"type": "PairwiseDistance", "kwargs": {"keepdim": 1}})", "keepdim"},
      {R"({"type": "LPPool2d", "args": [2]})",
       "missing 1 required positional argument: 'kernel_size'"},
      {R"({"type": "LPPool1d", "args": [2, 0]})", "kernel_size"},
      {R"({"type": "Fold", "args": [[4, 5]]})",
       "missing 1 required positional argument: 'kernel_size'"},
      {R"({"type": "Unfold", "args": [2.5]})", "kernel_size"},
      {R"({"type": "CosineSimilarity", "args": [1, 1e-8, 3]})",
       "takes from 1 to 3 positional arguments but 4 were given"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(SmallLayersTest, ForwardChecksInputsWithTorchsTexts) {
  struct Case {
    const char* spec;
    std::vector<Tensor> inputs;
    const char* message;
  } cases[] = {
      {R"({"type": "CELU", "args": [0.0]})",
       {Ones({3})},
       "ZeroDivisionError: alpha cannot be 0 for CELU"},
      {R"({"type": "Softshrink", "args": [-1]})",
       {Ones({3})},
       "lambda must be greater or equal to 0, but found to be -1."},
      {R"({"type": "GLU"})",
       {Ones({3, 5})},
       "Halving dimension must be even, but dimension 1 is size 5"},
      {R"({"type": "GLU"})",
       {Ones({})},
       "glu does not support scalars because halving size must be even"},
      {R"({"type": "GLU", "args": [3]})",
       {Ones({3, 4})},
       "Dimension out of range (expected to be in range of [-2, 1], but got "
       "3)"},
      {R"({"type": "Softmax2d"})",
       {Ones({3, 4})},
       "Softmax2d requires a 3D or 4D tensor as input"},
      {R"({"type": "FeatureAlphaDropout", "args": [0.5]})",
       {Ones({3})},
       "Feature dropout requires at least 2 dimensions in the input"},
      {R"({"type": "ChannelShuffle", "args": [2]})",
       {Ones({3, 4})},
       "channel_shuffle expects input with > 2 dims, but got input with "
       "sizes [3, 4]"},
      {R"({"type": "ChannelShuffle", "args": [3]})",
       {Ones({3, 4, 2})},
       "Number of channels must be divisible by groups. Got 4 channels and 3 "
       "groups."},
      {R"({"type": "ChannelShuffle", "args": [0]})",
       {Ones({3, 4, 2})},
       "Number of groups to divide channels in must be positive. Value of "
       "groups:0"},
      {R"({"type": "LocalResponseNorm", "args": [2]})",
       {Ones({3, 4})},
       "Expected 3D or higher dimensionality                          input "
       "(got 2 dimensions)"},
      {R"({"type": "LocalResponseNorm", "args": [0]})",
       {Ones({3, 4, 5})},
       "kernel size should be greater than zero, but got kH: 0 kW: 1"},
      {R"({"type": "CosineSimilarity"})",
       {Ones({3, 4}), Ones({2, 4})},
       "The size of tensor a (3) must match the size of tensor b (2) at "
       "non-singleton dimension 0"},
      {R"({"type": "CosineSimilarity", "args": [2]})",
       {Ones({3, 4}), Ones({1, 4})},
       "Dimension out of range (expected to be in range of [-2, 1], but got "
       "2)"},
      {R"({"type": "LPPool2d", "args": [2, 2]})",
       {Ones({3, 4})},
       "non-empty 3D or 4D (batch mode) tensor expected for input, but got: "
       "[3, 4]"},
      {R"({"type": "LPPool1d", "args": [2, 4]})",
       {Ones({1, 2, 3})},
       "Output size is too small"},
      {R"({"type": "Unfold", "args": [5]})",
       {Ones({1, 3, 4, 4})},
       "Given input with spatial size (4, 4), kernel_size=(5, 5), "
       "dilation=(1, 1), padding=(0, 0), calculated shape of the array of "
       "sliding blocks as (0, 0), but its components must be at least one."},
      {R"({"type": "Unfold", "args": [2], "kwargs": {"stride": 0}})",
       {Ones({1, 3, 4, 4})},
       "stride should be greater than zero, but got stride_height: 0 "
       "stride_width: 0"},
      {R"({"type": "Unfold", "args": [2], "kwargs": {"padding": -1}})",
       {Ones({1, 3, 4, 4})},
       "padding should be non-negative, but got pad_height: -1 pad_width: -1"},
      {R"({"type": "Unfold", "args": [2]})",
       {Ones({1, 1, 3, 4, 4})},
       "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and "
       "other non-zero dimensions for input, but got: [1, 1, 3, 4, 4]"},
      {R"({"type": "Fold", "args": [[4, 5], 2]})",
       {Ones({1, 6, 12})},
       "Expected size of input's dimension 1 to be divisible by the product "
       "of kernel_size, but got input.size(1)=6 and kernel_size=(2, 2)."},
      {R"({"type": "Fold", "args": [[4, 5], 2]})",
       {Ones({1, 12, 11})},
       "Given output_size=(4, 5), kernel_size=(2, 2), dilation=(1, 1), "
       "padding=(0, 0), stride=(1, 1), expected size of input's dimension 2 "
       "to match the calculated number of sliding blocks 3 * 4 = 12, but got "
       "input.size(2)=11."},
      {R"({"type": "Fold", "args": [[4, 5], 2]})",
       {Ones({1, 12, 12, 1})},
       "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch "
       "size and non-zero dimensions for input, but got: [1, 12, 12, 1]"},
      {R"({"type": "PairwiseDistance"})",
       {Ones({3, 4})},
       "PairwiseDistance.forward() takes 2 tensor arguments but 1 were given"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, BuildFromJson(c.spec));
    built.root->Train(true);
    EXPECT_THAT(
        Forward(*built.root, c.inputs),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(SmallLayersTest, AttributesAreTorchs) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult relu6,
                                  BuildFromJson(R"({"type": "ReLU6"})"));
  EXPECT_THAT(relu6.root->attributes().Keys(),
              ElementsAre("min_val", "max_val", "inplace"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult pd,
      BuildFromJson(R"({"type": "PairwiseDistance", "args": [1]})"));
  // torch keeps `p` as `norm`.
  EXPECT_THAT(pd.root->attributes().Keys(),
              ElementsAre("norm", "eps", "keepdim"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lrn,
      BuildFromJson(R"({"type": "LocalResponseNorm", "args": [3]})"));
  EXPECT_THAT(lrn.root->attributes().Keys(),
              ElementsAre("size", "alpha", "beta", "k"));
}

TEST(SmallLayersTest, ChannelShuffleInterleavesGroups) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildFromJson(R"({"type": "ChannelShuffle", "args": [2]})"));
  // Channels (0 1 2 | 3 4 5) become 0 3 1 4 2 5.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out,
      Forward(*built.root, {Values({1, 6, 1}, {0, 1, 2, 3, 4, 5})}));
  EXPECT_THAT(Read(out[0]), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST(SmallLayersTest, FoldSumsWhatUnfoldSpreads) {
  // Unfold then Fold with overlapping 2x2 blocks: each pixel comes back
  // times the number of blocks covering it (1 2 1 / 2 4 2 / 1 2 1).
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult unfold, BuildFromJson(R"({"type": "Unfold", "args": [2]})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult fold, BuildFromJson(R"({"type": "Fold", "args": [3, 2]})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> cols,
                                  Forward(*unfold.root, {Ones({1, 1, 3, 3})}));
  EXPECT_EQ(cols[0].shape(), (Shape{1, 4, 4}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> back,
                                  Forward(*fold.root, cols));
  EXPECT_THAT(Read(back[0]), ElementsAre(1, 2, 1, 2, 4, 2, 1, 2, 1));
}

TEST(SmallLayersTest, FeatureAlphaDropoutDropsWholeChannels) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildFromJson(R"({"type": "FeatureAlphaDropout", "args": [0.5]})"));
  // Eval mode: the input comes back.
  built.root->Train(false);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> eval,
                                  Forward(*built.root, {Ones({4, 8, 16})}));
  EXPECT_THAT(Read(eval[0]), ::testing::Each(1.0f));
  // Training mode: each (batch, channel) row is one value throughout, kept
  // (a) or dropped (b), and both occur among 32 rows.
  built.root->Train(true);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*built.root, {Ones({4, 8, 16})}));
  const std::vector<float> y = Read(out[0]);
  std::set<float> values;
  for (int row = 0; row < 32; ++row) {
    for (int i = 1; i < 16; ++i) EXPECT_EQ(y[row * 16 + i], y[row * 16]);
    values.insert(y[row * 16]);
  }
  EXPECT_EQ(values.size(), 2u);
}

}  // namespace
}  // namespace modelstate
