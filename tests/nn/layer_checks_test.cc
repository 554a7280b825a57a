// Layers added for issue 18 besides the recurrent and transformer ones
// (nn/layers/conv.cc, embedding.cc, normalization.cc, activation.cc):
// torch's constructor checks and forward's input checks with torch's
// texts. Values against real torch are in
// tests/python/{layers_match_torch,forward_matches_torch}.py.
#include <string>
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

Tensor Ints(std::vector<double> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  absl::StatusOr<Tensor> t = Tensor::FromDoubles(DType::kInt64, {n}, values);
  EXPECT_TRUE(t.ok());
  return *t;
}

TEST(LayerChecksTest, ConstructorChecksAreTorchs) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "Conv3d", "args": [3, 4, 3], "kwargs": {"groups": 2}})",
       "in_channels must be divisible by groups"},
      {R"({"type": "Conv3d", "args": [2, 4, [3, 3]]})", "kernel_size"},
      {R"({"type": "ConvTranspose1d", "args": [2, 4, 3],
           "kwargs": {"padding_mode": "reflect"}})",
       "Only \"zeros\" padding mode is supported for ConvTranspose1d"},
      {R"({"type": "ConvTranspose3d", "args": [2, 4, 3],
           "kwargs": {"padding": "same"}})",
       "padding"},
      {R"({"type": "EmbeddingBag", "args": [10, 3],
           "kwargs": {"padding_idx": 10}})",
       "Padding_idx must be within num_embeddings"},
      {R"({"type": "EmbeddingBag", "args": [10, 3],
           "kwargs": {"padding_idx": -11}})",
       "Padding_idx must be within num_embeddings"},
      {R"({"type": "InstanceNorm2d", "args": []})",
       "missing 1 required positional argument: 'num_features'"},
      {R"({"type": "PReLU", "args": [-1]})",
       "Trying to create tensor with negative dimension -1"},
      {R"({"type": "LeakyReLU", "args": ["x"]})", "negative_slope"},
      {R"({"type": "Dropout2d", "args": [1.5]})",
       "dropout probability has to be between 0 and 1, but got 1.5"},
      {R"({"type": "AlphaDropout", "args": [-0.5]})",
       "dropout probability has to be between 0 and 1, but got -0.5"},
      {R"({"type": "Unflatten", "args": [1, 4]})",
       "unflattened_size must be a tuple of ints, but found type int"},
      {R"({"type": "Unflatten", "args": ["features", [2, 2]]})", "named dim"},
      {R"({"type": "MaxPool3d", "args": [0]})", "kernel_size"},
      {R"({"type": "AvgPool1d", "args": [[2, 2]]})", "kernel_size"},
      {R"({"type": "PixelShuffle", "args": []})",
       "missing 1 required positional argument: 'upscale_factor'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(LayerChecksTest, EntriesAreTorchs) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult norm,
      BuildFromJson(R"({"type": "InstanceNorm1d", "args": [3]})"));
  // affine and track_running_stats default to False: every entry is None.
  EXPECT_TRUE(norm.root->GetStateDict().tensors.Keys().empty());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult tracked,
                                  BuildFromJson(R"({"type": "InstanceNorm3d",
      "args": [3], "kwargs": {"affine": true, "track_running_stats": true}})"));
  EXPECT_THAT(tracked.root->GetStateDict().tensors.Keys(),
              ElementsAre("weight", "bias", "running_mean", "running_var",
                          "num_batches_tracked"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult conv,
                                  BuildFromJson(R"({"type": "ConvTranspose3d",
      "args": [4, 6, [1, 2, 3]], "kwargs": {"groups": 2}})"));
  EXPECT_EQ(conv.root->parameters().Find("weight")->shape(),
            (Shape{4, 3, 1, 2, 3}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult prelu, BuildFromJson(R"({"type": "PReLU", "args": [4]})"));
  const Tensor& w = *prelu.root->parameters().Find("weight");
  EXPECT_EQ(w.shape(), (Shape{4}));
  EXPECT_EQ(w.data<float>()[3], 0.25f);
}

TEST(LayerChecksTest, ForwardChecksInputsWithTorchsTexts) {
  struct Case {
    const char* spec;
    std::vector<Tensor> inputs;
    const char* message;
  } cases[] = {
      {R"({"type": "Conv3d", "args": [2, 4, 3]})",
       {Ones({2, 3, 4})},
       "Expected 4D (unbatched) or 5D (batched) input to conv3d, but got "
       "input of size: [2, 3, 4]"},
      {R"({"type": "Conv3d", "args": [2, 4, 3]})",
       {Ones({1, 2, 2, 5, 5})},
       "Calculated padded input size per channel: (2 x 5 x 5). Kernel size: "
       "(3 x 3 x 3). Kernel size can't be greater than actual input size"},
      {R"({"type": "Conv3d", "args": [2, 4, 1]})",
       {Ones({1, 3, 2, 2, 2})},
       "expected input[1, 3, 2, 2, 2] to have 2 channels, but got 3 "
       "channels instead"},
      {R"({"type": "ConvTranspose1d", "args": [2, 4, 3],
           "kwargs": {"padding": 4}})",
       {Ones({1, 2, 2})},
       "Given input size per channel: (2). Calculated output size per "
       "channel: (-4). Output size is too small"},
      {R"({"type": "BatchNorm3d", "args": [3]})",
       {Ones({2, 3, 4, 4})},
       "expected 5D input (got 4D input)"},
      {R"({"type": "InstanceNorm2d", "args": [3]})",
       {Ones({3, 4})},
       "expected 3D or 4D input (got 2D input)"},
      {R"({"type": "InstanceNorm1d", "args": [3]})",
       {Ones({2, 3, 1})},
       "Expected more than 1 spatial element when training, got input size "
       "torch.Size([2, 3, 1])"},
      {R"({"type": "PReLU", "args": [4]})",
       {Ones({2, 3, 5})},
       "Mismatch of parameter numbers and input channel size. Found "
       "parameter numbers = 4 and channel size = 3."},
      {R"({"type": "PReLU", "args": [3]})",
       {Ones({})},
       "Not allow zero-dim input tensor."},
      {R"({"type": "MaxPool2d", "args": [3],
           "kwargs": {"padding": 2, "dilation": 2}})",
       {Ones({1, 2, 8, 8})},
       "pad should be at most half of kernel size, but got pad=2 and "
       "kernel_size=3"},
      {R"({"type": "Bilinear", "args": [2, 3, 4]})",
       {Ones({2, 5, 2}), Ones({2, 4, 3})},
       "bilinear(): input batch dimensions do not match at dim 1: got 5 and "
       "4"},
      {R"({"type": "Bilinear", "args": [2, 3, 4]})",
       {Ones({2, 2}), Ones({3})},
       "bilinear(): input dimensions do not match: got 2 and 1"},
      {R"({"type": "LSTMCell", "args": [3, 4]})",
       {Ones({2, 3}), Ones({2, 4}), Ones({3, 4})},
       "Input batch size 2 doesn't match hidden0 batch size 3"},
      {R"({"type": "AdaptiveMaxPool1d", "args": [2]})",
       {Ones({1, 2, 0})},
       "adaptive_max_pool2d(): Expected input to have non-zero size for "
       "non-batch dimensions, but input has sizes [1, 2, 1, 0] with dimension "
       "3 being empty"},
      {R"({"type": "AdaptiveAvgPool1d", "args": [2]})",
       {Ones({2, 0})},
       "adaptive_avg_pool2d(): Expected input to have non-zero size for "
       "non-batch dimensions, but input has sizes [2, 1, 0] with dimension 2 "
       "being empty"},
      {R"({"type": "LSTM", "args": [3, 4]})",
       {Ones({0, 2, 3})},
       "Expected sequence length to be larger than 0 in RNN"},
      {R"({"type": "InstanceNorm1d", "args": [3], "kwargs": {"affine": true}})",
       {Ones({2, 4, 5})},
       "weight should contain 8 elements not 6"},
      {R"({"type": "Dropout1d"})",
       {Ones({2, 3, 4, 5})},
       "dropout1d: Expected 2D or 3D input, but received a 4D input."},
      {R"({"type": "PixelShuffle", "args": [2]})",
       {Ones({1, 6, 2, 2})},
       "pixel_shuffle expects its input's 'channel' dimension to be "
       "divisible by the square of upscale_factor, but input.size(-3)=6 is "
       "not divisible by 4"},
      {R"({"type": "PixelShuffle", "args": [2]})",
       {Ones({6, 2})},
       "pixel_shuffle expects input to have at least 3 dimensions, but got "
       "input with 2 dimension(s)"},
      {R"({"type": "PixelUnshuffle", "args": [2]})",
       {Ones({1, 6, 3, 2})},
       "pixel_unshuffle expects height to be divisible by downscale_factor, "
       "but input.size(-2)=3 is not divisible by 2"},
      {R"({"type": "MaxPool1d", "args": [2], "kwargs": {"padding": 2}})",
       {Ones({1, 2, 8})},
       "max_pool1d() padding should be at most half of kernel size, but got "
       "padding=2 and kernel_size=2"},
      {R"({"type": "AvgPool1d", "args": [2], "kwargs": {"padding": 2}})",
       {Ones({1, 2, 8})},
       "pad should be at most half of kernel size, but got pad=2 and "
       "kernel_size=2"},
      {R"({"type": "MaxPool3d", "args": [2]})",
       {Ones({2, 2, 8})},
       "non-empty 4D or 5D (batch mode) tensor expected for input"},
      {R"({"type": "AvgPool2d", "args": [2],
           "kwargs": {"divisor_override": 0}})",
       {Ones({1, 2, 8, 8})},
       "divisor must be not zero"},
      {R"({"type": "Unflatten", "args": [1, [2, 3]]})",
       {Ones({2, 7})},
       "unflatten: Provided sizes [2, 3] don't multiply up to the size of "
       "dim 1 (7) in the input tensor"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Filled(DType::kInt64, {2, 3}, 1), Ints({0, 3})},
       "if input is 2D, then offsets has to be None"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ints({1, 2, 3})},
       "offsets has to be a 1D Tensor but got None"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ints({1, 2, 3}), Ints({1, 2})},
       "offsets[0] has to be 0, i.e., the first sequence in the mini-batch "
       "has to start from position 0. However, got 1"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ints({1, 2, 3}), Ints({0, 4})},
       "offsets[-1] can not be greater than input's length (3), but got "
       "offsets[-1] of 4"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ints({1, 2, 12}), Ints({0})},
       "index out of range in self"},
      {R"({"type": "EmbeddingBag", "args": [10, 3],
           "kwargs": {"mode": "median"}})",
       {Ints({1, 2, 3}), Ints({0})},
       "mode has to be one of sum, mean or max"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ints({1, 2, 3}), Ints({0}), Ones({3})},
       "per_sample_weights is only supported for mode='sum' (got "
       "mode='mean')"},
      {R"({"type": "EmbeddingBag", "args": [10, 3],
           "kwargs": {"mode": "sum"}})",
       {Ints({1, 2, 3}), Ints({0}), Ones({2})},
       "embedding_bag: If per_sample_weights (torch.Size([2])) is not None, "
       "then it must have the same shape as the input (torch.Size([3]))"},
      {R"({"type": "EmbeddingBag", "args": [10, 3]})",
       {Ones({3}), Ints({0})},
       "Expected tensor for argument #1 'indices' to have one of the "
       "following scalar types: Long, Int; but got"},
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

TEST(LayerChecksTest, EmbeddingBagReducesEachBag) {
  // Rows of a 4x2 table: row i = (i, 10 i); padding_idx 0 is skipped.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult bag,
                                  BuildFromJson(R"({"type": "EmbeddingBag",
      "args": [4, 2], "kwargs": {"mode": "max", "padding_idx": 0}})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor table, Tensor::FromDoubles(DType::kFloat32, {4, 2},
                                        {0, 0, 1, 10, 2, 20, 3, 30}));
  // A handle to the parameter writes into its storage.
  Tensor weight = *bag.root->parameters().Find("weight");
  MODELSTATE_ASSERT_OK(weight.CopyFrom(table));
  // Bags [1, 3], [] and [0, 2]: an empty bag (and one of padding only)
  // gives zeros.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out,
      Forward(*bag.root, {Ints({1, 3, 0, 2}), Ints({0, 2, 2})}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{3, 2}));
  const float* y = out[0].data<float>();
  EXPECT_THAT(std::vector<float>(y, y + 6), ElementsAre(3, 30, 0, 0, 2, 20));
}

}  // namespace
}  // namespace modelstate
