// The Forward RPC against the real server: results equal the core's forward
// (itself checked against PyTorch by tests/python/forward_matches_torch.py),
// training-mode calls update BatchNorm's buffers durably and are audited,
// eval-mode calls change nothing, and bad input gets PyTorch's errors.
#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/forward.h"
#include "proto/convert.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::InProcessServer;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::LocalBuild;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::HasSubstr;

constexpr char kMlp[] = R"({"type": "Sequential", "children": [
  {"spec": {"type": "Linear", "args": [6, 5]}},
  {"spec": {"type": "ReLU"}},
  {"spec": {"type": "Linear", "args": [5, 3]}}]})";
constexpr char kNormed[] = R"({"type": "Sequential", "children": [
  {"spec": {"type": "Linear", "args": [4, 3]}},
  {"spec": {"type": "BatchNorm1d", "args": [3]}}]})";

Tensor Input(Shape shape, double scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(scale * ((i * 7) % 11 - 5));
  return *Tensor::FromDoubles(DType::kFloat32, shape, values);
}

v1::ForwardRequest Request(const std::string& module,
                           const std::vector<Tensor>& inputs,
                           std::optional<bool> training) {
  v1::ForwardRequest r;
  r.set_module(module);
  for (const Tensor& t : inputs) {
    v1::TensorProto* proto = r.add_inputs();
    if (t.defined()) {
      EXPECT_THAT(convert::TensorToProto(t, proto), IsOk());
    }
  }
  if (training.has_value()) r.set_training(*training);
  return r;
}

Tensor Output(const v1::ForwardResponse& response, int i) {
  v1::TensorProto proto = response.outputs(i);
  absl::StatusOr<Tensor> t = convert::TensorFromProto(&proto, "out", 1 << 30);
  EXPECT_THAT(t, IsOk());
  return t.ok() ? *t : Tensor();
}

TEST(ForwardServiceTest, EvalForwardEqualsTheCoreAndChangesNothing) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  ASSERT_THAT(c->BuildModule(BuildRequest("fwd/mlp", kMlp, 7)), IsOk());
  const Tensor x = Input({4, 6}, 0.25);
  absl::StatusOr<v1::ForwardResponse> response =
      c->Forward(Request("fwd/mlp", {x}, false));
  ASSERT_THAT(response, IsOk());
  ASSERT_EQ(response->outputs_size(), 1);

  std::shared_ptr<Module> local = LocalBuild(kMlp, 7);
  absl::StatusOr<std::vector<Tensor>> want = Forward(*local, {x});
  ASSERT_THAT(want, IsOk());
  Tensor got = Output(*response, 0);
  EXPECT_EQ(got.shape(), (Shape{4, 3}));
  EXPECT_TRUE(TensorsEqual(got, (*want)[0]));

  // A submodule by path.
  v1::ForwardRequest first = Request("fwd/mlp", {x}, false);
  first.set_path("0");
  response = c->Forward(first);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(Output(*response, 0).shape(), (Shape{4, 5}));
  c.reset();
}

TEST(ForwardServiceTest, TrainingUpdatesBatchNormDurablyAndIsAudited) {
  TestServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  ASSERT_THAT(c->BuildModule(BuildRequest("fwd/bn", kNormed, 3)), IsOk());
  ASSERT_THAT(c->SetTraining("fwd/bn", false), IsOk());
  std::shared_ptr<Module> local = LocalBuild(kNormed, 3);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Input({8, 4}, 0.5 + step);
    ASSERT_THAT(c->Forward(Request("fwd/bn", {x}, true)), IsOk());
    ASSERT_THAT(Forward(*local, {x}), IsOk());  // local modules train
  }
  StateDict want = local->GetStateDict();
  EXPECT_EQ(want.tensors.Find("1.num_batches_tracked")->data<int64_t>()[0], 3);
  ExpectSameState(*c->GetStateDict("fwd/bn"), want);
  // The call's mode was for the call only.
  v1::GetModuleRequest describe;
  describe.set_module("fwd/bn");
  EXPECT_FALSE(c->GetModule(describe)->info().training());

  // An eval call reads the buffers and changes nothing.
  ASSERT_THAT(c->Forward(Request("fwd/bn", {Input({2, 4}, 1)}, false)), IsOk());
  ExpectSameState(*c->GetStateDict("fwd/bn"), want);

  v1::QueryAuditRequest query;
  query.mutable_filter()->set_type("forward");
  v1::QueryAuditResponse records;
  auto context = c->NewContext(absl::Seconds(10));
  ASSERT_TRUE(c->stub().QueryAudit(context.get(), query, &records).ok());
  EXPECT_EQ(records.records_size(), 3);

  // The buffers a training call updated are on disk once it answers: a
  // SIGKILL right after the answer loses nothing.
  const Tensor last = Input({8, 4}, -1.5);
  ASSERT_THAT(c->Forward(Request("fwd/bn", {last}, true)), IsOk());
  server.Stop(SIGKILL);
  ASSERT_THAT(Forward(*local, {last}), IsOk());
  want = local->GetStateDict();
  EXPECT_EQ(want.tensors.Find("1.num_batches_tracked")->data<int64_t>()[0], 4);
  c.reset();
  ASSERT_THAT(server.Start(), IsOk());
  c = server.NewClient();
  ExpectSameState(*c->GetStateDict("fwd/bn"), want);
  c.reset();
}

TEST(ForwardServiceTest, BadInputGetsPyTorchsErrors) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  ASSERT_THAT(c->BuildModule(BuildRequest("fwd/mlp", kMlp, 7)), IsOk());
  EXPECT_THAT(c->Forward(Request("fwd/mlp", {Input({2, 5}, 1)}, false)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mat1 and mat2 shapes cannot be multiplied")));
  v1::ForwardRequest lost = Request("fwd/mlp", {Input({2, 6}, 1)}, false);
  lost.set_path("7");
  EXPECT_THAT(c->Forward(lost),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("path '7'")));
  EXPECT_THAT(c->Forward(Request("fwd/none", {Input({2, 6}, 1)}, false)),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(
      c->BuildModule(BuildRequest("fwd/list",
                                  R"({"type": "ModuleList", "children": [
                      {"spec": {"type": "ReLU"}}]})")),
      IsOk());
  EXPECT_THAT(c->Forward(Request("fwd/list", {Input({2}, 1)}, false)),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("missing the required \"forward\"")));
  v1::ForwardRequest garbage = Request("fwd/mlp", {}, false);
  v1::TensorProto* bad = garbage.add_inputs();
  bad->set_dtype(v1::DTYPE_FLOAT32);
  bad->add_shape(4);
  bad->set_data("xyz");
  EXPECT_THAT(c->Forward(garbage), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("inputs[0]")));
  EXPECT_THAT(c->Health(), IsOk());
  c.reset();
}

// The inputs size what a forward creates: a Linear(1, 4096) turns 4 bytes
// per row into 16 KiB. Every tensor it creates is held to the server's
// max_tensor_bytes before it is allocated, and the outputs to what one
// response may carry.
TEST(ForwardServiceTest, OutputsAreHeldToTheServersLimits) {
  InProcessServer server([](server::ServerConfig& config) {
    config.limits.max_tensor_bytes = 4 << 20;
    config.limits.max_message_bytes = 2 << 20;
  });
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  ASSERT_THAT(c->BuildModule(BuildRequest(
                  "fwd/wide", R"({"type": "Linear", "args": [1, 4096]})")),
              IsOk());
  absl::StatusOr<v1::ForwardResponse> fits =
      c->Forward(Request("fwd/wide", {Input({64, 1}, 1)}, false));
  ASSERT_THAT(fits, IsOk());
  EXPECT_EQ(Output(*fits, 0).shape(), (Shape{64, 4096}));
  // 256 rows: 4 MiB, a tensor the server may hold but not send in one
  // response.
  EXPECT_THAT(c->Forward(Request("fwd/wide", {Input({256, 1}, 1)}, false)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("outputs: 4194304 bytes in all, over the "
                                 "max_message_bytes limit of 2097152")));
  // One row more: refused before the output is allocated.
  EXPECT_THAT(
      c->Forward(Request("fwd/wide", {Input({257, 1}, 1)}, false)),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("A float32[257, 4096] tensor needs 4210688 bytes, "
                         "over the max_tensor_bytes limit of 4194304")));
  EXPECT_THAT(c->Health(), IsOk());
  c.reset();
}

}  // namespace
}  // namespace modelstate
