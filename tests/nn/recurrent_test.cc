// The recurrent family (nn/layers/recurrent.cc): torch's constructor
// checks and texts, the state_dict layout, and forward's input checks and
// modes. Values against real torch are in
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

// A float32 tensor of `shape` counting up from `start` in steps of 0.1.
Tensor Ramp(Shape shape, double start = -1.0) {
  Tensor t = Filled(DType::kFloat32, std::move(shape), 0.0);
  absl::StatusOr<void*> data = t.MutableDataForOverwrite();
  EXPECT_TRUE(data.ok());
  for (int64_t i = 0; i < t.numel(); ++i) {
    static_cast<float*>(*data)[i] = static_cast<float>(start + 0.1 * i);
  }
  return t;
}

TEST(RecurrentTest, ConstructorChecksAreTorchs) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "GRU", "args": [3, 4], "kwargs": {"proj_size": 2}})",
       "proj_size argument is only supported for LSTM, not RNN or GRU"},
      {R"({"type": "RNN", "args": [3, 4], "kwargs": {"proj_size": 0}})",
       "proj_size argument is only supported for LSTM, not RNN or GRU"},
      {R"({"type": "LSTM", "args": [3, 4], "kwargs": {"proj_size": 4}})",
       "proj_size has to be smaller than hidden_size"},
      {R"({"type": "LSTM", "args": [3, 4], "kwargs": {"proj_size": -1}})",
       "proj_size should be a positive integer or zero to disable "
       "projections"},
      {R"({"type": "GRU", "args": [3, 4], "kwargs": {"dropout": 1.5}})",
       "dropout should be a number in range [0, 1] representing the "
       "probability of an element being zeroed"},
      {R"({"type": "RNN", "args": [3, 4], "kwargs": {"nonlinearity": "gelu"}})",
       "Unknown nonlinearity 'gelu'"},
      {R"({"type": "LSTM", "args": [3]})",
       "missing 1 required positional argument: 'hidden_size'"},
      {R"({"type": "GRUCell", "args": [3, 4], "kwargs": {"nonlinearity": "relu"}})",
       "unexpected keyword argument 'nonlinearity'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(RecurrentTest, StateDictKeysFollowLayersThenDirections) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lstm, BuildFromJson(R"({"type": "LSTM", "args": [3, 5, 2],
                "kwargs": {"bidirectional": true, "proj_size": 2}})"));
  EXPECT_THAT(lstm.root->GetStateDict().tensors.Keys(),
              ElementsAre("weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                          "bias_hh_l0", "weight_hr_l0", "weight_ih_l0_reverse",
                          "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                          "bias_hh_l0_reverse", "weight_hr_l0_reverse",
                          "weight_ih_l1", "weight_hh_l1", "bias_ih_l1",
                          "bias_hh_l1", "weight_hr_l1", "weight_ih_l1_reverse",
                          "weight_hh_l1_reverse", "bias_ih_l1_reverse",
                          "bias_hh_l1_reverse", "weight_hr_l1_reverse"));
  // The second layer reads both directions' projected outputs.
  EXPECT_EQ(lstm.root->parameters().Find("weight_ih_l1")->shape(),
            (Shape{20, 4}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult cell,
      BuildFromJson(
          R"({"type": "GRUCell", "args": [3, 4], "kwargs": {"bias": false}})"));
  EXPECT_THAT(cell.root->GetStateDict().tensors.Keys(),
              ElementsAre("weight_ih", "weight_hh"));
  // Without bias the cell registers None, as torch's register_parameter.
  ASSERT_NE(cell.root->parameters().Find("bias_ih"), nullptr);
  EXPECT_FALSE(cell.root->parameters().Find("bias_ih")->defined());
}

TEST(RecurrentTest, ForwardChecksInputsWithTorchsTexts) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lstm, BuildFromJson(R"({"type": "LSTM", "args": [3, 4]})"));
  Module& m = *lstm.root;
  const Tensor x = Ramp({5, 2, 3});
  struct Case {
    std::vector<Tensor> inputs;
    const char* message;
  } cases[] = {
      {{Ramp({5, 2, 2})},
       "input.size(-1) must be equal to input_size. Expected 3, got 2"},
      {{Ramp({3})}, "input must have 3 dimensions, got 2"},
      {{x, Ramp({1, 2, 4})}, "LSTM takes both h0 and c0"},
      {{x, Ramp({1, 2, 4}), Ramp({2, 4})},
       "For batched 3-D input, hx and cx should also be 3-D but got (3-D, "
       "2-D) tensors"},
      {{x, Ramp({1, 3, 4}), Ramp({1, 2, 4})},
       "Expected hidden[0] size (1, 2, 4), got [1, 3, 4]"},
      {{x, Ramp({1, 2, 4}), Ramp({1, 2, 5})},
       "Expected hidden[1] size (1, 2, 4), got [1, 2, 5]"},
      {{x, Tensor(), Tensor(), Ramp({2})},
       "lengths must be a 1-D int64 tensor"},
      {{x, Tensor(), Tensor(), Filled(DType::kInt64, {2}, 6)},
       "lengths[0] is 6, longer than the input's 5 steps"},
      {{x, Tensor(), Tensor(), Filled(DType::kInt64, {2}, 0)},
       "Length of all samples has to be greater than 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(
        Forward(m, c.inputs),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult gru, BuildFromJson(R"({"type": "GRU", "args": [3, 4]})"));
  EXPECT_THAT(Forward(*gru.root, {Ramp({5, 3}), Ramp({1, 1, 4})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "For unbatched 2-D input, hx should also be 2-D but "
                       "got 3-D tensor"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult cell,
      BuildFromJson(R"({"type": "LSTMCell", "args": [3, 4]})"));
  EXPECT_THAT(Forward(*cell.root, {Ramp({2, 3}), Ramp({3, 4}), Ramp({3, 4})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Input batch size 2 doesn't match hidden0 batch size "
                       "3"));
  EXPECT_THAT(Forward(*cell.root, {Ramp({2, 2, 3})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "LSTMCell: Expected input to be 1-D or 2-D but "
                       "received 3-D tensor"));
  // RNNCell keeps any nonlinearity string; forward rejects it, as torch.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult odd, BuildFromJson(R"({"type": "RNNCell", "args": [3, 4],
                "kwargs": {"nonlinearity": "gelu"}})"));
  EXPECT_THAT(Forward(*odd.root, {Ramp({2, 3})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Unknown nonlinearity: gelu"));
}

TEST(RecurrentTest, OutputsAreFlattenedAndShapedLikeTorchs) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lstm, BuildFromJson(R"({"type": "LSTM", "args": [3, 4, 2],
                "kwargs": {"batch_first": true, "bidirectional": true,
                           "proj_size": 2}})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*lstm.root, {Ramp({6, 5, 3})}));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape(), (Shape{6, 5, 4}));
  EXPECT_EQ(out[1].shape(), (Shape{4, 6, 2}));
  EXPECT_EQ(out[2].shape(), (Shape{4, 6, 4}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult gru, BuildFromJson(R"({"type": "GRU", "args": [3, 4]})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(out, Forward(*gru.root, {Ramp({5, 3})}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{5, 4}));
  EXPECT_EQ(out[1].shape(), (Shape{1, 4}));
  // The last step's output is h_n.
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[0].data<float>()[16 + j], out[1].data<float>()[j]);
  }
}

TEST(RecurrentTest, PaddedStepsLeaveTheStateAndOutputZeros) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult gru, BuildFromJson(R"({"type": "GRU", "args": [3, 4]})"));
  Tensor x = Ramp({5, 2, 3});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor lengths, Tensor::FromDoubles(DType::kInt64, {2}, {5, 2}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> out,
                                  Forward(*gru.root, {x, Tensor(), lengths}));
  const float* y = out[0].data<float>();
  const float* h = out[1].data<float>();
  for (int j = 0; j < 4; ++j) {
    // Row 1 stops after step 1: h_n is its output there, then zeros.
    EXPECT_EQ(h[4 + j], y[(1 * 2 + 1) * 4 + j]);
    EXPECT_EQ(y[(2 * 2 + 1) * 4 + j], 0.0f);
    EXPECT_EQ(h[j], y[(4 * 2 + 0) * 4 + j]);
  }
}

TEST(RecurrentTest, DropoutBetweenLayersRunsInTrainingOnly) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult lstm,
      BuildFromJson(
          R"({"type": "LSTM", "args": [3, 4, 2], "kwargs": {"dropout": 0.5}})"));
  Module& m = *lstm.root;
  const Tensor x = Ramp({6, 2, 3});
  m.Eval();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> eval, Forward(m, {x}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> eval2, Forward(m, {x}));
  EXPECT_TRUE(TensorsEqual(eval[0], eval2[0]));
  m.Train();
  ForwardOptions seeded;
  seeded.seed = 7;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> a,
                                  Forward(m, {x}, seeded));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<Tensor> b,
                                  Forward(m, {x}, seeded));
  EXPECT_TRUE(TensorsEqual(a[0], b[0]));  // the seed fixes the masks
  EXPECT_FALSE(TensorsEqual(a[0], eval[0]));
}

}  // namespace
}  // namespace modelstate
