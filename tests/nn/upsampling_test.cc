// Upsample, UpsamplingNearest2d and UpsamplingBilinear2d
// (nn/layers/upsampling.cc): the attributes torch 1.13's constructors keep,
// and F.interpolate's and ATen's argument and input checks with their texts.
// Values against real torch for every mode are in
// tests/python/forward_matches_torch.py.
#include <string>
#include <variant>
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

Tensor UpsampleInput(Shape shape) {
  return Filled(DType::kFloat32, shape, 1.0);
}

const AttrValue& UpsampleAttr(const Module& m, const std::string& name) {
  static const AttrValue kMissing = std::string("<missing>");
  const AttrValue* v = m.attributes().Find(name);
  return v == nullptr ? kMissing : *v;
}

// Whether `a` holds exactly `want` (of that type: an int is no float).
template <typename V>
bool UpsampleAttrIs(const AttrValue& a, const V& want) {
  const V* got = std::get_if<V>(&a);
  return got != nullptr && *got == want;
}

TEST(UpsamplingTest, ConstructorsKeepTorchsAttributes) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult up,
                                  BuildFromJson(R"({"type": "Upsample",
          "kwargs": {"scale_factor": 2, "mode": "bilinear"}})"));
  const Module& m = *up.root;
  EXPECT_EQ(m.qualified_name(), "torch.nn.modules.upsampling.Upsample");
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(m, "name"), std::string("Upsample")));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(m, "size"), std::monostate()));
  // float(scale_factor): the int 2 is kept as 2.0.
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(m, "scale_factor"), 2.0));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(m, "mode"), std::string("bilinear")));
  EXPECT_TRUE(
      UpsampleAttrIs(UpsampleAttr(m, "align_corners"), std::monostate()));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(m, "recompute_scale_factor"),
                             std::monostate()));

  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult tuple,
                                  BuildFromJson(R"({"type": "Upsample",
          "args": [null, [2, 1.5]]})"));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*tuple.root, "scale_factor"),
                             std::vector<double>{2.0, 1.5}));
  // `float(s) if s else None`: a zero scale is None.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult zero,
      BuildFromJson(R"({"type": "Upsample", "args": [null, 0]})"));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*zero.root, "scale_factor"),
                             std::monostate()));
  // size is kept as given: an int stays an int.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult sized, BuildFromJson(R"({"type": "Upsample", "args": [4]})"));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*sized.root, "size"), int64_t{4}));

  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult bilinear,
      BuildFromJson(R"({"type": "UpsamplingBilinear2d", "args": [[3, 5]]})"));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*bilinear.root, "name"),
                             std::string("UpsamplingBilinear2d")));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*bilinear.root, "mode"),
                             std::string("bilinear")));
  EXPECT_TRUE(
      UpsampleAttrIs(UpsampleAttr(*bilinear.root, "align_corners"), true));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*bilinear.root, "size"),
                             std::vector<int64_t>{3, 5}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult nearest, BuildFromJson(R"({"type": "UpsamplingNearest2d",
          "kwargs": {"scale_factor": 3}})"));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*nearest.root, "mode"),
                             std::string("nearest")));
  EXPECT_TRUE(UpsampleAttrIs(UpsampleAttr(*nearest.root, "align_corners"),
                             std::monostate()));
}

TEST(UpsamplingTest, ConstructorRejectsArgumentsOfTheWrongType) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {R"({"type": "Upsample", "args": [1.5]})",
       "argument 'size' must be an int or a tuple of ints, got float"},
      {R"({"type": "Upsample", "args": [null, "2"]})",
       "argument 'scale_factor' must be a float, got str"},
      {R"({"type": "Upsample", "args": [null, 2, 3]})",
       "argument 'mode' must be a str, got int"},
      {R"({"type": "Upsample", "kwargs": {"align_corners": 1}})",
       "argument 'align_corners' must be a bool, got int"},
      {R"({"type": "Upsample", "kwargs": {"recompute_scale_factor": "yes"}})",
       "argument 'recompute_scale_factor' must be a bool, got str"},
      {R"({"type": "UpsamplingBilinear2d", "kwargs": {"mode": "nearest"}})",
       "got an unexpected keyword argument 'mode'"},
      {R"({"type": "UpsamplingNearest2d", "args": [1, 2, 3]})",
       "takes from 1 to 3 positional arguments but 4 were given"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(
        BuildFromJson(c.spec),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(UpsamplingTest, ForwardChecksArgumentsAndInputsWithTorchsTexts) {
  struct Case {
    const char* spec;
    Shape input;
    const char* message;
  } cases[] = {
      {R"({"type": "Upsample", "args": [2], "kwargs": {"align_corners": false}})",
       {1, 2, 4},
       "align_corners option can only be set with the interpolating modes: "
       "linear | bilinear | bicubic | trilinear"},
      {R"({"type": "Upsample", "args": [2, 2]})",
       {1, 2, 4},
       "only one of size or scale_factor should be defined"},
      {R"({"type": "Upsample"})",
       {1, 2, 4},
       "either size or scale_factor should be defined"},
      {R"({"type": "Upsample", "args": [null, 0.0]})",
       {1, 2, 4},
       "either size or scale_factor should be defined"},
      {R"({"type": "Upsample", "args": [[3]]})",
       {1, 2, 4, 4},
       "Input and output must have the same number of spatial dimensions, "
       "but got input with spatial dimensions of [4, 4] and output size of "
       "(3,). Please provide input tensor in (N, C, d1, d2, ...,dK) format "
       "and output size in (o1, o2, ...,oK) format."},
      {R"({"type": "Upsample", "args": [null, [3, 1.5]]})",
       {1, 2, 4},
       "Input and scale_factor must have the same number of spatial "
       "dimensions, but got input with spatial dimensions of [4] and "
       "scale_factor of shape (3.0, 1.5). Please provide input tensor in "
       "(N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) "
       "format."},
      {R"({"type": "Upsample", "args": [2],
           "kwargs": {"recompute_scale_factor": true}})",
       {1, 2, 4},
       "recompute_scale_factor is not meaningful with an explicit size."},
      {R"({"type": "Upsample", "args": [2], "kwargs": {"mode": "bilinear"}})",
       {1, 2, 4},
       "Got 3D input, but bilinear mode needs 4D input"},
      {R"({"type": "Upsample", "args": [2], "kwargs": {"mode": "linear"}})",
       {1, 2, 4, 4, 4},
       "Got 5D input, but linear mode needs 3D input"},
      {R"({"type": "Upsample", "args": [2], "kwargs": {"mode": "trilinear"}})",
       {1, 2, 4, 4},
       "Got 4D input, but trilinear mode needs 5D input"},
      {R"({"type": "Upsample", "args": [2], "kwargs": {"mode": "bicubic"}})",
       {1, 2, 4},
       "Input Error: Only 3D, 4D and 5D input Tensors supported (got 3D) for "
       "the modes: nearest | linear | bilinear | bicubic | trilinear | area | "
       "nearest-exact (got bicubic)"},
      {R"({"type": "Upsample", "args": [2], "kwargs": {"mode": "cubic"}})",
       {1, 2, 4, 4},
       "(got 4D) for the modes: nearest | linear | bilinear | bicubic | "
       "trilinear | area | nearest-exact (got cubic)"},
      {R"({"type": "Upsample", "args": [2]})",
       {2, 4},
       "Input Error: Only 3D, 4D and 5D input Tensors supported (got 2D)"},
      {R"({"type": "Upsample", "args": [0]})",
       {1, 2, 4},
       "Input and output sizes should be greater than 0, but got input (W: "
       "4) and output (W: 0)"},
      {R"({"type": "Upsample", "args": [null, 0.1],
           "kwargs": {"mode": "bicubic"}})",
       {1, 2, 4, 4},
       "Input and output sizes should be greater than 0, but got input (H: "
       "4, W: 4) output (H: 0, W: 0)"},
      {R"({"type": "Upsample", "args": [null, -2.0],
           "kwargs": {"mode": "trilinear"}})",
       {1, 2, 4, 4, 4},
       "but got input (D: 4, H: 4, W: 4) output (D: -8, H: -8, W: -8)"},
      {R"({"type": "Upsample", "args": [3]})",
       {1, 2, 0, 4},
       "but got input (H: 0, W: 4) output (H: 3, W: 3)"},
      {R"({"type": "Upsample", "args": [3], "kwargs": {"mode": "bilinear"}})",
       {1, 0, 4, 4},
       "Non-empty 4D data tensor expected but got a tensor with sizes [1, 0, "
       "4, 4]"},
      {R"({"type": "Upsample", "args": [3], "kwargs": {"mode": "area"}})",
       {1, 2, 0},
       "adaptive_avg_pool2d(): Expected input to have non-zero size for "
       "non-batch dimensions, but input has sizes [1, 2, 1, 0] with "
       "dimension 3 being empty"},
      {R"({"type": "Upsample", "args": [null, -2.0],
           "kwargs": {"mode": "area"}})",
       {1, 2, 4, 4, 4},
       "adaptive_avg_pool3d: elements of output_size must be greater than "
       "or equal to 0 but received {-8, -8,-8}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built, BuildFromJson(c.spec));
    EXPECT_THAT(
        Forward(*built.root, {UpsampleInput(c.input)}),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

// The interpolation table grows with the output extent alone: a one-row
// input resized to 3e9 once asked for about 100 GB and the OOM killer.
// Under a tensor limit (the server's max_tensor_bytes) the output and the
// table are each checked before they are allocated.
TEST(UpsamplingTest, OutputsAndTablesAreHeldToTheTensorLimit) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult huge,
                                  BuildFromJson(R"({"type": "Upsample",
                        "kwargs": {"size": [3000000000], "mode": "linear"}})"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult wide,
                                  BuildFromJson(R"({"type": "Upsample",
                        "kwargs": {"size": [1000], "mode": "linear"}})"));
  ScopedTensorBytesLimit limit(16 << 10);
  EXPECT_THAT(Forward(*huge.root, {UpsampleInput({1, 1, 2})}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("A float32[1, 1, 3000000000] tensor needs")));
  // 4000 bytes out, a table of about 136 KB.
  EXPECT_THAT(Forward(*wide.root, {UpsampleInput({1, 1, 2})}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("Upsample to a size of 1000 needs an "
                                 "interpolation table of up to")));
  ScopedTensorBytesLimit roomier(1 << 20);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> out, Forward(*wide.root, {UpsampleInput({1, 1, 2})}));
  EXPECT_EQ(out[0].shape(), (Shape{1, 1, 1000}));
}

TEST(UpsamplingTest, ModesResampleAsTorchDoes) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor x, Tensor::FromDoubles(DType::kFloat32, {1, 1, 3}, {0, 3, 6}));
  auto run = [&](const std::string& spec) -> std::vector<float> {
    absl::StatusOr<BuildResult> built = BuildFromJson(spec);
    EXPECT_TRUE(built.ok()) << built.status();
    if (!built.ok()) return {};
    absl::StatusOr<std::vector<Tensor>> out = Forward(*built->root, {x});
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return {};
    const Tensor& y = (*out)[0];
    return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
  };
  // torch: F.interpolate(torch.tensor([[[0., 3., 6.]]]), ...).
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [null, 2]})"),
              ElementsAre(0, 0, 3, 3, 6, 6));
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [5],
                      "kwargs": {"mode": "linear", "align_corners": true}})"),
              ElementsAre(0, 1.5, 3, 4.5, 6));
  // Without align_corners: source index (o + 0.5) / 2 - 0.5, clamped at 0.
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [null, 2],
                      "kwargs": {"mode": "linear"}})"),
              ElementsAre(0, 0.75, 2.25, 3.75, 5.25, 6));
  // area: windows [0, 2) and [1, 3).
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [2],
                      "kwargs": {"mode": "area"}})"),
              ElementsAre(1.5, 4.5));
  // nearest-exact: floor((o + 0.5) * 3 / 2) = 0, 2.
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [2],
                      "kwargs": {"mode": "nearest-exact"}})"),
              ElementsAre(0, 6));
  // nearest: floor(o * 3 / 2) = 0, 1.
  EXPECT_THAT(run(R"({"type": "Upsample", "args": [2]})"), ElementsAre(0, 3));
}

}  // namespace
}  // namespace modelstate
