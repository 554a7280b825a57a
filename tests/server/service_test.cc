// Service tests: the whole server (server/server.h) in the test process,
// driven through the real C++ client over gRPC's in-process channel; and
// the real modelstate-server binary where its process is the point (signals,
// exit codes, flags, ports).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"
#include "client/subscriber.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"
#include "proto/convert.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/layer_examples.h"
#include "tests/testing/requests.h"
#include "tests/testing/run_command.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::Filled;
using ::modelstate::testing::InProcessServerTest;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::LayerExampleArgs;
using ::modelstate::testing::LayerExampleJson;
using ::modelstate::testing::LocalBuild;
using ::modelstate::testing::SpecProto;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ServiceTest : public InProcessServerTest {
 protected:
  static void SetUpTestSuite() {
    StartServer([](server::ServerConfig& config) {
      config.limits.max_tensor_bytes = uint64_t{1024} << 20;
      config.limits.max_chunk_bytes = uint32_t{4096} << 10;
    });
  }
};

TEST_F(ServiceTest, BuildsEveryLibraryLayerExactlyAsTheCoreDoes) {
  ASSERT_EQ(LayerExampleArgs().size(), LayerTypes().size());
  for (const std::string& type : LayerTypes()) {
    SCOPED_TRACE(type);
    std::string json = LayerExampleJson(type);
    std::string name = "layers/" + type;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        v1::BuildModuleResponse built,
        client_->BuildModule(BuildRequest(name, json, 5)));
    EXPECT_EQ(built.module(), name);
    EXPECT_EQ(built.info().type(), type);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict remote,
                                    client_->GetStateDict(name));
    ExpectSameState(remote, LocalBuild(json, 5)->GetStateDict());
  }
}

TEST_F(ServiceTest, DescribesEntriesAndListsModulesInPages) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "describe/bn", R"({"type": "BatchNorm1d", "args": [4]})")),
              IsOk());
  v1::GetModuleRequest get;
  get.set_module("describe/bn");
  get.set_with_hashes(true);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse d,
                                  client_->GetModule(get));
  ASSERT_EQ(d.info().parameters_size(), 2);
  const v1::TensorInfo& w = d.info().parameters(0).tensor();
  EXPECT_EQ(w.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(w.shape(), ElementsAre(4));
  EXPECT_EQ(w.nbytes(), 16u);
  EXPECT_EQ(w.device(), "cpu");
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(w.sha256(), ContentHash(Filled(DType::kFloat32, {4}, 1.0)));
  ASSERT_EQ(d.info().buffers_size(), 3);
  EXPECT_EQ(d.info().buffers(2).name(), "num_batches_tracked");
  EXPECT_EQ(d.info().buffers(2).tensor().dtype(), v1::DTYPE_INT64);
  EXPECT_TRUE(d.info().buffers(2).tensor().persistent());
  EXPECT_EQ(d.info().version(), 2);
  EXPECT_THAT(std::vector<std::string>(d.server_devices().begin(),
                                       d.server_devices().end()),
              ::testing::Contains("cpu"));
  for (int i = 0; i < 5; ++i) {
    ASSERT_THAT(client_->BuildModule(BuildRequest(absl::StrCat("paged/m", i),
                                                  R"({"type": "ReLU"})")),
                IsOk());
  }
  v1::ListModulesRequest list;
  list.set_namespace_("paged");
  list.set_page_size(2);
  std::vector<std::string> names;
  int pages = 0;
  while (true) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::ListModulesResponse page,
                                    client_->ListModules(list));
    ++pages;
    for (const auto& m : page.modules()) names.push_back(m.module());
    if (page.next_page_token().empty()) break;
    list.set_page_token(page.next_page_token());
  }
  EXPECT_THAT(names, ElementsAre("paged/m0", "paged/m1", "paged/m2", "paged/m3",
                                 "paged/m4"));
  EXPECT_EQ(pages, 3);
}

constexpr char kNet[] = R"({"type": "Net", "members": [
    {"module": {"name": "fc1", "spec": {"type": "Linear", "args": [37, 23]}}},
    {"module": {"name": "bn", "spec": {"type": "BatchNorm1d", "args": [23]}}},
    {"module": {"name": "fc2", "spec": {"type": "Linear", "args": [23, 5]}}}]})";

TEST_F(ServiceTest, StateDictRoundTripsInAnyChunkSize) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("sd/net", kNet, 1)), IsOk());
  StateDict local = LocalBuild(kNet, 1)->GetStateDict();
  for (uint32_t chunk : {1u, 7u, 1000u, 0u}) {
    client::GetStateDictOptions options;
    options.chunk_bytes = chunk;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict remote,
                                    client_->GetStateDict("sd/net", options));
    ExpectSameState(remote, local);
  }
  // Load new values, then read them back.
  StateDict changed = local;
  for (auto& item : changed.tensors) {
    item.value = Filled(item.value.dtype(), item.value.shape(), 0.25);
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::LoadStateDictResponse loaded,
                                  client_->LoadStateDict("sd/net", changed));
  EXPECT_EQ(loaded.repr(), "<All keys matched successfully>");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back,
                                  client_->GetStateDict("sd/net"));
  ExpectSameState(back, changed);
}

TEST_F(ServiceTest, StateDictFiltersConversionAndMetadataOnly) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("sd/filters", kNet, 2)),
              IsOk());
  StateDict local = LocalBuild(kNet, 2)->GetStateDict();
  client::GetStateDictOptions options;
  options.key_prefix = "fc";
  options.key_glob = "*.weight";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict weights,
                                  client_->GetStateDict("sd/filters", options));
  EXPECT_THAT(weights.tensors.Keys(), ElementsAre("fc1.weight", "fc2.weight"));
  options = {};
  options.target_dtype = DType::kFloat16;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict half,
                                  client_->GetStateDict("sd/filters", options));
  for (const auto& item : local.tensors) {
    DType want = IsFloatingPoint(item.value.dtype()) ? DType::kFloat16
                                                     : item.value.dtype();
    EXPECT_TRUE(TensorsEqual(*half.tensors.Find(item.key),
                             *item.value.To(Device::Cpu(), want)))
        << item.key;
  }
  options = {};
  options.metadata_only = true;
  struct HeaderOnly : client::StateDictSink {
    StateDictLayout layout;
    bool finished = false;
    absl::Status Begin(const StateDictLayout& l) override {
      layout = l;
      return absl::OkStatus();
    }
    absl::Status Append(absl::string_view) override {
      return absl::InternalError("no data expected");
    }
    absl::Status Finish() override {
      finished = true;
      return absl::OkStatus();
    }
  } sink;
  ASSERT_THAT(client_->GetStateDict("sd/filters", options, sink), IsOk());
  EXPECT_EQ(sink.layout.entries.size(), local.tensors.size());
  EXPECT_EQ(sink.layout.entries[2].kind, EntryKind::kParameter);  // bn.weight
  EXPECT_EQ(sink.layout.entries[4].kind,
            EntryKind::kBuffer);  // bn.running_mean
  ASSERT_TRUE(sink.layout.metadata.has_value());
  EXPECT_EQ(sink.layout.metadata->size(), 4u);
}

TEST_F(ServiceTest, ParametersAndBuffersSelectionsMatchTheCore) {
  // Tied parameters and a non-persistent buffer: named_parameters() lists
  // the tie once, named_buffers() lists what state_dict() leaves out.
  const std::string spec = R"({"type": "Tied", "members": [
      {"module": {"name": "embed", "spec": {"type": "Embedding", "args": [6, 2]}}},
      {"module": {"name": "proj", "spec": {"type": "Linear", "args": [2, 6],
                                           "kwargs": {"bias": false}}}},
      {"buffer": {"name": "scratch", "shape": [3], "persistent": false}},
      {"module": {"name": "bn", "spec": {"type": "BatchNorm1d", "args": [2]}}}],
      "ties": [{"target": "proj.weight", "source": "embed.weight"}]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("sd/select", spec, 4)), IsOk());
  std::shared_ptr<Module> local = LocalBuild(spec, 4);
  client::GetStateDictOptions options;
  options.selection = v1::GetStateDictRequest::SELECTION_PARAMETERS;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict params,
                                  client_->GetStateDict("sd/select", options));
  StateDict want_params;
  for (const auto& [key, t] : local->NamedParameters()) {
    want_params.tensors.Set(key, t);
  }
  ExpectSameState(params, want_params);
  EXPECT_THAT(params.tensors.Keys(),
              ElementsAre("embed.weight", "bn.weight", "bn.bias"));
  options.selection = v1::GetStateDictRequest::SELECTION_BUFFERS;
  options.key_prefix = "s";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict buffers,
                                  client_->GetStateDict("sd/select", options));
  EXPECT_THAT(buffers.tensors.Keys(), ElementsAre("scratch"));
  v1::GetStateDictRequest bad;
  bad.set_module("sd/select");
  bad.set_selection(static_cast<v1::GetStateDictRequest::Selection>(9));
  grpc::ClientContext context;
  auto stream = client_->stub().GetStateDict(&context, bad);
  v1::StateDictChunk chunk;
  while (stream->Read(&chunk)) {
  }
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("selection"));
}

TEST_F(ServiceTest, LargeModelStreamsInOneMebibyteChunks) {
  // 64 x Linear(1024, 1024): 256 MiB of weights plus biases.
  std::string json = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < 64; ++i) {
    absl::StrAppend(&json, i ? "," : "",
                    R"({"spec": {"type": "Linear", "args": [1024, 1024]}})");
  }
  json += "]}";
  ASSERT_THAT(client_->BuildModule(BuildRequest("big/stack", json, 3)), IsOk());
  // As gRPC messages (shared_memory_test covers the ring's chunks).
  client::ClientOptions messages;
  messages.shared_memory = false;
  client_ = server_->NewClient(messages);
  int chunks = 0;
  uint64_t last_done = 0;
  client::GetStateDictOptions options;
  options.progress = [&](uint64_t done, uint64_t total) {
    ++chunks;
    EXPECT_LE(done - last_done, uint64_t{1} << 20);
    last_done = done;
    EXPECT_EQ(total, uint64_t{64} * (1024 * 1024 + 1024) * 4);
  };
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict sd,
                                  client_->GetStateDict("big/stack", options));
  EXPECT_GE(chunks, 256);
  EXPECT_EQ(sd.tensors.size(), 128u);
  std::string first_hash = ContentHash(*sd.tensors.Find("0.weight"));
  // Reload with one tensor changed; only that one changes on the server.
  sd.tensors.Set("63.bias", Filled(DType::kFloat32, {1024}, 3.0));
  client::LoadStateDictOptions load;
  load.chunk_bytes = 1 << 20;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::LoadStateDictResponse r,
      client_->LoadStateDict("big/stack", sd, load));
  v1::GetModuleRequest get;
  get.set_module("big/stack");
  get.set_path("63");
  get.set_with_hashes(true);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse last,
                                  client_->GetModule(get));
  EXPECT_EQ(last.info().parameters(1).tensor().sha256(),
            ContentHash(Filled(DType::kFloat32, {1024}, 3.0)));
  get.set_path("0");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse first,
                                  client_->GetModule(get));
  EXPECT_EQ(first.info().parameters(0).tensor().sha256(), first_hash);
  ASSERT_THAT(client_->DeleteModule("big/stack"), IsOk());
}

TEST_F(ServiceTest, LoadStateDictFailsWithPyTorchsTextAndChangesNothing) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "load/lin", R"({"type": "Linear", "args": [3, 2]})")),
              IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict before,
                                  client_->GetStateDict("load/lin"));
  StateDict partial;
  partial.tensors.Set("bias", Filled(DType::kFloat32, {2}, 5.0));
  partial.tensors.Set("extra", Filled(DType::kFloat32, {1}, 0.0));
  EXPECT_THAT(
      client_->LoadStateDict("load/lin", partial),
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          "Error(s) in loading state_dict for Linear:\n\tMissing key(s) in "
          "state_dict: \"weight\". \n\tUnexpected key(s) in state_dict: "
          "\"extra\". "));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict after,
                                  client_->GetStateDict("load/lin"));
  ExpectSameState(after, before);
  client::LoadStateDictOptions lenient;
  lenient.load.strict = false;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::LoadStateDictResponse r,
      client_->LoadStateDict("load/lin", partial, lenient));
  EXPECT_THAT(r.missing_keys(), ElementsAre("weight"));
  EXPECT_THAT(r.unexpected_keys(), ElementsAre("extra"));
  EXPECT_EQ(
      r.repr(),
      "_IncompatibleKeys(missing_keys=['weight'], unexpected_keys=['extra'])");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict loaded,
                                  client_->GetStateDict("load/lin"));
  EXPECT_TRUE(TensorsEqual(*loaded.tensors.Find("bias"),
                           Filled(DType::kFloat32, {2}, 5.0)));
  partial.tensors.Set("weight", Filled(DType::kFloat32, {4, 3}, 0.0));
  EXPECT_THAT(
      client_->LoadStateDict("load/lin", partial, lenient),
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          HasSubstr("size mismatch for weight: copying a param with shape "
                    "torch.Size([4, 3]) from checkpoint, the shape in current "
                    "model is torch.Size([2, 3]).")));
}

// A checkpoint saved from DistributedDataParallel ("module." before every
// key) gives one line of PyTorch's text per entry: the client still gets
// FAILED_PRECONDITION and the text's start, not gRPC's RESOURCE_EXHAUSTED
// for trailers over its 8 KiB limit.
TEST_F(ServiceTest, ALoadErrorListingEveryKeyStillReachesTheClient) {
  std::string children;
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&children, i == 0 ? "" : ",",
                    R"({"spec": {"type": "Linear", "args": [1, 1]}})");
  }
  ASSERT_THAT(
      client_->BuildModule(BuildRequest(
          "load/ddp", absl::StrCat(R"({"type": "Sequential", "children": [)",
                                   children, "]}"))),
      IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict saved,
                                  client_->GetStateDict("load/ddp"));
  StateDict prefixed;
  for (const auto& item : saved.tensors) {
    prefixed.tensors.Set(absl::StrCat("module.", item.key), item.value);
  }
  absl::Status refused = client_->LoadStateDict("load/ddp", prefixed).status();
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::StartsWith(
                           "Error(s) in loading state_dict for Sequential:\n\t"
                           "Missing key(s) in state_dict: \"0.weight\", ")));
  EXPECT_THAT(std::string(refused.message()),
              ::testing::EndsWith(" more bytes]"));
  EXPECT_LE(refused.message().size(), convert::kMaxStatusMessageBytes);
}

// A raw LoadStateDict call, to send what the client library never would.
grpc::Status RawLoad(client::ModelStateClient& c,
                     const std::vector<v1::LoadStateDictRequest>& messages) {
  grpc::ClientContext context;
  v1::LoadStateDictResponse response;
  auto writer = c.stub().LoadStateDict(&context, &response);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// assign=true over the wire: every entry is checked before the first is
// installed, so a bad last entry leaves the module as it was.
TEST_F(ServiceTest, AtomicAssignLoadThatFailsInstallsNothing) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "assign/lin", R"({"type": "Linear", "args": [3, 2]})")),
              IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict before,
                                  client_->GetStateDict("assign/lin"));
  client::LoadStateDictOptions assign;
  assign.load.assign = true;
  StateDict bad;
  bad.tensors.Set("weight", Filled(DType::kFloat64, {2, 3}, 7.0));
  bad.tensors.Set("bias", Filled(DType::kInt64, {2}, 1.0));
  EXPECT_THAT(
      client_->LoadStateDict("assign/lin", bad, assign),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("While copying the parameter named \"bias\""
                         ", whose dimensions in the model are "
                         "torch.Size([2]) and whose dimensions in the "
                         "checkpoint are torch.Size([2]), an exception "
                         "occurred : ('Only Tensors of floating point "
                         "and complex dtype can require gradients',).")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict after,
                                  client_->GetStateDict("assign/lin"));
  ExpectSameState(after, before);
  // The same load with a floating bias installs both, in their dtypes.
  bad.tensors.Set("bias", Filled(DType::kFloat16, {2}, 1.0));
  ASSERT_THAT(client_->LoadStateDict("assign/lin", bad, assign), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict installed,
                                  client_->GetStateDict("assign/lin"));
  ExpectSameState(installed, bad);
}

TEST_F(ServiceTest, TruncatedOrMalformedLoadStreamsChangeNothing) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "load/stream", R"({"type": "Linear", "args": [4, 4]})")),
              IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict before,
                                  client_->GetStateDict("load/stream"));
  StateDict zeros;
  for (const auto& item : before.tensors) {
    zeros.tensors.Set(item.key,
                      Filled(DType::kFloat32, item.value.shape(), 0.0));
  }
  v1::LoadStateDictRequest start;
  start.mutable_start()->set_module("load/stream");
  convert::LayoutToHeader(LayoutOf(zeros),
                          start.mutable_start()->mutable_header());
  v1::LoadStateDictRequest data;
  data.set_data(std::string(40, '\0'));  // 40 of the 80 bytes
  auto expect_invalid = [&](std::vector<v1::LoadStateDictRequest> messages,
                            const std::string& text) {
    grpc::Status s = RawLoad(*client_, messages);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text;
    EXPECT_THAT(s.error_message(), HasSubstr(text));
  };
  expect_invalid({start, data}, "ended after 40 of 80");
  expect_invalid({}, "the stream ended before it");
  expect_invalid({data}, "first message must be a start");
  expect_invalid({start, start}, "only data messages");
  v1::LoadStateDictRequest too_much;
  too_much.set_data(std::string(81, '\0'));
  expect_invalid({start, too_much}, "more than the 80 bytes");
  v1::LoadStateDictRequest bad_header = start;
  bad_header.mutable_start()
      ->mutable_header()
      ->mutable_entries(0)
      ->set_byte_length(3);
  expect_invalid({bad_header}, "header.entries[0].byte_length");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict after,
                                  client_->GetStateDict("load/stream"));
  ExpectSameState(after, before);
}

TEST_F(ServiceTest, BadInputGetsTheRightCodeNamingTheField) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "bad/lin", R"({"type": "Linear", "args": [2, 2]})")),
              IsOk());
  using Code = absl::StatusCode;
  EXPECT_THAT(
      client_->BuildModule(BuildRequest("a/b/c", R"({"type": "ReLU"})")),
      StatusIs(Code::kInvalidArgument, HasSubstr("module: 'a/b/c'")));
  EXPECT_THAT(
      client_->BuildModule(BuildRequest("bad/lin", R"({"type": "ReLU"})")),
      StatusIs(Code::kAlreadyExists, HasSubstr("already exists")));
  EXPECT_THAT(client_->BuildModule(
                  BuildRequest("bad/x", R"({"type": "Linear", "args": [2]})")),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("missing 1 required positional")));
  EXPECT_THAT(
      client_->BuildModule(
          BuildRequest("bad/x", R"({"type": "Linear", "args": [-2, 2]})")),
      StatusIs(Code::kInvalidArgument, HasSubstr("negative dimension -2")));
  EXPECT_THAT(
      client_->BuildModule(BuildRequest(
          "bad/x", R"({"type": "Linear", "args": [100000, 100000]})")),
      StatusIs(Code::kResourceExhausted, HasSubstr("max_tensor_bytes")));
  EXPECT_THAT(client_->BuildModule(BuildRequest(
                  "bad/x", R"({"type": "Linear", "args": [[1, "x"], 2]})")),
              StatusIs(Code::kInvalidArgument, HasSubstr("spec.args[0][1]")));
  v1::BuildModuleRequest int_dtype =
      BuildRequest("bad/x", R"({"type": "ReLU"})");
  int_dtype.set_dtype("int64");
  EXPECT_THAT(
      client_->BuildModule(int_dtype),
      StatusIs(Code::kInvalidArgument, HasSubstr("floating point dtype")));
  int_dtype.set_dtype("float17");
  EXPECT_THAT(client_->BuildModule(int_dtype),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("dtype: Unknown dtype 'float17'")));
  v1::GetModuleRequest unknown;
  unknown.set_module("bad/nope");
  EXPECT_THAT(client_->GetModule(unknown),
              StatusIs(Code::kNotFound, HasSubstr("bad/nope")));
  EXPECT_THAT(client_->GetStateDict("bad/nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->DeleteModule("bad/nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->SetTraining("bad/nope", false),
              StatusIs(Code::kNotFound));
  StateDict empty;
  EXPECT_THAT(client_->LoadStateDict("bad/nope", empty),
              StatusIs(Code::kNotFound));
  v1::GetModuleRequest bad_path;
  bad_path.set_module("bad/lin");
  bad_path.set_path("encoder.0");
  EXPECT_THAT(client_->GetModule(bad_path),
              StatusIs(Code::kNotFound,
                       HasSubstr("Linear has no attribute `encoder`")));
  v1::MoveModuleRequest move;
  move.set_module("bad/lin");
  move.set_dtype("int32");
  EXPECT_THAT(
      client_->MoveModule(move),
      StatusIs(
          Code::kInvalidArgument,
          "nn.Module.to only accepts floating point or complex dtypes, but "
          "got desired dtype=torch.int32"));
  move.set_dtype("");
  move.set_device("cuda:0");
  if (AvailableDevices().size() == 2) {
    EXPECT_THAT(client_->MoveModule(move),
                StatusIs(Code::kFailedPrecondition,
                         HasSubstr("this server has: cpu, meta")));
  }
  move.set_device("tpu");
  EXPECT_THAT(client_->MoveModule(move),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("device: Invalid device 'tpu'")));
  client::GetStateDictOptions huge_chunks;
  huge_chunks.chunk_bytes = 64 << 20;
  EXPECT_THAT(client_->GetStateDict("bad/lin", huge_chunks),
              StatusIs(Code::kResourceExhausted, HasSubstr("chunk_bytes")));
  v1::RegisterTensorRequest reg;
  reg.set_module("bad/lin");
  reg.set_name("a.b");
  reg.mutable_init()->add_shape(2);
  EXPECT_THAT(
      client_->RegisterParameter(reg),
      StatusIs(Code::kInvalidArgument, "parameter name can't contain \".\""));
  reg.set_name("weight");
  EXPECT_THAT(
      client_->RegisterBuffer(reg),
      StatusIs(Code::kAlreadyExists, "attribute 'weight' already exists"));
  reg.set_name("w2");
  v1::TensorProto* t = reg.mutable_tensor();
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_shape(3);
  t->set_data(std::string(8, '\0'));
  EXPECT_THAT(client_->RegisterParameter(reg),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("tensor.data: has 8 bytes but")));
  t->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(client_->RegisterParameter(reg),
              StatusIs(Code::kInvalidArgument, HasSubstr("tensor.dtype")));
  t->set_dtype(v1::DTYPE_INT64);
  t->set_data(std::string(24, '\0'));
  EXPECT_THAT(client_->RegisterParameter(reg),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("Only Tensors of floating point")));
  v1::RegisterTensorRequest no_value;
  no_value.set_module("bad/lin");
  no_value.set_name("x");
  EXPECT_THAT(client_->RegisterBuffer(no_value),
              StatusIs(Code::kInvalidArgument, HasSubstr("value:")));
  v1::RemoveEntryRequest remove;
  remove.set_module("bad/lin");
  remove.set_name("nothing");
  EXPECT_THAT(
      client_->RemoveEntry(remove),
      StatusIs(Code::kNotFound, "'Linear' object has no attribute 'nothing'"));
  v1::ListModulesRequest list;
  list.set_page_size(-1);
  EXPECT_THAT(client_->ListModules(list),
              StatusIs(Code::kInvalidArgument, HasSubstr("page_size")));
}

TEST_F(ServiceTest, MalformedListRequestsNameTheField) {
  for (const char* name : {"pages/a", "pages/b", "pages/c"}) {
    ASSERT_THAT(client_->BuildModule(BuildRequest(name, R"({"type": "ReLU"})")),
                IsOk());
  }
  using Code = absl::StatusCode;
  v1::ListModulesRequest list;
  for (int size : {-1, 1001, 1 << 30}) {
    list.set_page_size(size);
    EXPECT_THAT(client_->ListModules(list),
                StatusIs(Code::kInvalidArgument,
                         HasSubstr(absl::StrCat("page_size: ", size,
                                                " is out of range"))));
  }
  list.set_page_size(2);
  list.set_namespace_("pages");
  absl::StatusOr<v1::ListModulesResponse> first = client_->ListModules(list);
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->modules_size(), 2);
  EXPECT_EQ(first->next_page_token(), "pages/b");
  list.set_page_token(first->next_page_token());
  absl::StatusOr<v1::ListModulesResponse> second = client_->ListModules(list);
  ASSERT_THAT(second, IsOk());
  ASSERT_EQ(second->modules_size(), 1);
  EXPECT_EQ(second->modules(0).module(), "pages/c");
  for (const char* token : {"not a token", "pages", "a/b/c", "other/b"}) {
    SCOPED_TRACE(token);
    list.set_page_token(token);
    EXPECT_THAT(client_->ListModules(list),
                StatusIs(Code::kInvalidArgument, HasSubstr("page_token: '")));
  }
  list.clear_page_token();
  for (const char* ns : {"bad ns", "a/b", "..", "x?"}) {
    SCOPED_TRACE(ns);
    list.set_namespace_(ns);
    EXPECT_THAT(client_->ListModules(list),
                StatusIs(Code::kInvalidArgument,
                         HasSubstr(absl::StrCat("namespace: '", ns, "'"))));
  }
}

// Every GetStateDict option is checked before the header goes out: a bad
// request gets its error as the first and only thing on the stream.
TEST_F(ServiceTest, MalformedStateDictOptionsFailBeforeTheHeader) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "opts/lin", R"({"type": "Linear", "args": [4, 4]})")),
              IsOk());
  using Code = absl::StatusCode;
  auto fetch = [&](const v1::GetStateDictRequest& request, int* messages) {
    std::unique_ptr<grpc::ClientContext> context =
        client_->NewContext(absl::Seconds(30));
    auto reader = client_->stub().GetStateDict(context.get(), request);
    v1::StateDictChunk chunk;
    *messages = 0;
    while (reader->Read(&chunk)) ++*messages;
    return convert::FromGrpcStatus(reader->Finish());
  };
  struct Case {
    std::string label;
    std::function<void(v1::GetStateDictRequest&)> spoil;
    Code code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"integer target dtype",
            [](auto& r) { r.set_target_dtype(v1::DTYPE_INT64); },
            Code::kInvalidArgument,
            "target_dtype: must be a floating point dtype, got int64"},
           {"unknown target dtype",
            [](auto& r) { r.set_target_dtype(static_cast<v1::DType>(99)); },
            Code::kInvalidArgument, "target_dtype: dtype 99"},
           {"character class in the glob",
            [](auto& r) { r.set_key_glob("w[ei]ight"); },
            Code::kInvalidArgument, "key_glob: 'w[ei]ight' uses '['"},
           {"escape in the glob", [](auto& r) { r.set_key_glob("bias\\*"); },
            Code::kInvalidArgument, "key_glob:"},
           {"unknown selection",
            [](auto& r) {
              r.set_selection(
                  static_cast<v1::GetStateDictRequest::Selection>(9));
            },
            Code::kInvalidArgument, "selection: unknown value 9"},
           {"chunk above the server's limit",
            [](auto& r) { r.set_chunk_bytes(64u << 20); },
            Code::kResourceExhausted, "chunk_bytes"},
           {"metadata only with a bad target dtype",
            [](auto& r) {
              r.set_metadata_only(true);
              r.set_target_dtype(v1::DTYPE_BOOL);
            },
            Code::kInvalidArgument, "target_dtype"},
           {"malformed module name", [](auto& r) { r.set_module("a/b/c"); },
            Code::kInvalidArgument, "module: 'a/b/c'"},
       }) {
    SCOPED_TRACE(c.label);
    v1::GetStateDictRequest request;
    request.set_module("opts/lin");
    c.spoil(request);
    int messages = -1;
    EXPECT_THAT(fetch(request, &messages), StatusIs(c.code, HasSubstr(c.says)));
    EXPECT_EQ(messages, 0);
  }
  // The same module streams fine with good options.
  v1::GetStateDictRequest good;
  good.set_module("opts/lin");
  good.set_key_glob("w*t");
  good.set_target_dtype(v1::DTYPE_FLOAT16);
  int messages = 0;
  EXPECT_THAT(fetch(good, &messages), IsOk());
  EXPECT_EQ(messages, 2);  // the header and one data chunk
}

// The hook and audit RPCs with malformed input (ListSubscribers and
// VerifyAudit take none): the right code, the field named, the server up.
TEST_F(ServiceTest, MalformedSubscriptionsAndAuditQueries) {
  using Code = absl::StatusCode;
  v1::Subscription bad_name;
  bad_name.set_name("bad name!");
  auto approve = [](const v1::HookEventProto& e) {
    v1::HookAnswer a;
    a.set_event_id(e.event_id());
    a.set_verdict(v1::HookAnswer::APPROVE);
    return a;
  };
  EXPECT_THAT(client::Subscriber::Start(*client_, bad_name, approve),
              StatusIs(Code::kInvalidArgument, HasSubstr("name: 'bad name!'")));
  v1::Subscription too_slow;
  too_slow.set_name("slow");
  too_slow.set_timeout_ms(2 * 3600 * 1000);
  EXPECT_THAT(client::Subscriber::Start(*client_, too_slow, approve),
              StatusIs(Code::kInvalidArgument, HasSubstr("timeout:")));
  {
    // An answer before any subscription.
    std::unique_ptr<grpc::ClientContext> context =
        client_->NewContext(absl::Seconds(30));
    auto stream = client_->stub().Subscribe(context.get());
    v1::SubscribeRequest answer;
    answer.mutable_answer()->set_event_id(1);
    ASSERT_TRUE(stream->Write(answer));
    stream->WritesDone();
    v1::SubscribeResponse response;
    EXPECT_FALSE(stream->Read(&response));
    EXPECT_THAT(convert::FromGrpcStatus(stream->Finish()),
                StatusIs(Code::kInvalidArgument,
                         HasSubstr("subscription: the first message must be a "
                                   "subscription")));
  }
  v1::QueryAuditRequest query;
  query.mutable_filter()->set_since("yesterday");
  std::unique_ptr<grpc::ClientContext> context =
      client_->NewContext(absl::Seconds(30));
  v1::QueryAuditResponse found;
  EXPECT_THAT(
      convert::FromGrpcStatus(
          client_->stub().QueryAudit(context.get(), query, &found)),
      StatusIs(Code::kInvalidArgument,
               HasSubstr("filter.since: 'yesterday' is not an RFC 3339 time")));
  query.clear_filter();
  query.set_limit(-5);
  context = client_->NewContext(absl::Seconds(30));
  EXPECT_THAT(convert::FromGrpcStatus(
                  client_->stub().QueryAudit(context.get(), query, &found)),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("limit: must not be negative")));
  v1::WatchAuditRequest watch;
  watch.mutable_filter()->set_until("soon");
  context = client_->NewContext(absl::Seconds(30));
  auto records = client_->stub().WatchAudit(context.get(), watch);
  v1::AuditRecordProto record;
  EXPECT_FALSE(records->Read(&record));
  EXPECT_THAT(convert::FromGrpcStatus(records->Finish()),
              StatusIs(Code::kInvalidArgument, HasSubstr("filter.until")));
}

// The remaining unary RPCs with a malformed module name or spec.
TEST_F(ServiceTest, MalformedNamesAndSpecsForEveryUnaryRpc) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "names/lin", R"({"type": "Linear", "args": [2, 2]})")),
              IsOk());
  using Code = absl::StatusCode;
  const auto bad_name =
      StatusIs(Code::kInvalidArgument, HasSubstr("module: 'bad name!'"));
  EXPECT_THAT(client_->DeleteModule("bad name!"), bad_name);
  EXPECT_THAT(client_->SetTraining("bad name!", true), bad_name);
  v1::GetModuleRequest get;
  get.set_module("bad name!");
  EXPECT_THAT(client_->GetModule(get), bad_name);
  v1::MoveModuleRequest move;
  move.set_module("bad name!");
  move.set_dtype("float16");
  EXPECT_THAT(client_->MoveModule(move), bad_name);
  v1::RemoveEntryRequest remove;
  remove.set_module("bad name!");
  remove.set_name("weight");
  EXPECT_THAT(client_->RemoveEntry(remove), bad_name);
  v1::RegisterSubmoduleRequest sub;
  sub.set_module("names/lin");
  sub.set_name("child");
  *sub.mutable_spec() = SpecProto(R"({"type": "Linear", "args": [2, 2],
                                      "kwargs": {"bogus": 1}})");
  EXPECT_THAT(client_->RegisterSubmodule(sub),
              StatusIs(Code::kInvalidArgument, HasSubstr("bogus")));
  *sub.mutable_spec() = SpecProto(R"({"type": "Linear", "args": [2, -2]})");
  EXPECT_THAT(
      client_->RegisterSubmodule(sub),
      StatusIs(Code::kInvalidArgument, HasSubstr("negative dimension")));
  sub.set_existing_path("no.such.path");
  EXPECT_THAT(client_->RegisterSubmodule(sub),
              StatusIs(Code::kNotFound, HasSubstr("existing_path")));
  sub.set_name("bad.name");
  sub.set_none(true);
  EXPECT_THAT(client_->RegisterSubmodule(sub),
              StatusIs(Code::kInvalidArgument, HasSubstr("can't contain")));
  // Nothing was registered by the failed calls.
  get.set_module("names/lin");
  absl::StatusOr<v1::GetModuleResponse> described = client_->GetModule(get);
  ASSERT_THAT(described, IsOk());
  EXPECT_EQ(described->info().children_size(), 0);
}

// gRPC parses a request before any handler runs, and protobuf refuses one
// nesting more than 100 messages: a spec deeper than that must still get a
// status naming the request, not gRPC's empty INTERNAL.
TEST_F(ServiceTest, ARequestTooDeepToParseIsInvalidArgumentNamingIt) {
  // Each Sequential level nests two messages (ModuleSpec, ModuleChild), each
  // custom level three (ModuleSpec, Member, ModuleMember).
  const auto nested = [](int depth, bool custom) {
    v1::ModuleSpec leaf = SpecProto(R"({"type": "Linear", "args": [2, 2]})");
    for (int level = 1; level < depth; ++level) {
      v1::ModuleSpec outer;
      if (custom) {
        outer.set_type("Block");
        v1::ModuleMember* member = outer.add_members()->mutable_module();
        member->set_name("inner");
        *member->mutable_spec() = std::move(leaf);
      } else {
        outer.set_type("Sequential");
        *outer.add_children()->mutable_spec() = std::move(leaf);
      }
      leaf = std::move(outer);
    }
    return leaf;
  };
  v1::BuildModuleRequest request;
  request.set_module("deep/seq48");
  *request.mutable_spec() = nested(48, /*custom=*/false);
  EXPECT_THAT(client_->BuildModule(request), IsOk());
  request.set_module("deep/custom32");
  *request.mutable_spec() = nested(32, /*custom=*/true);
  EXPECT_THAT(client_->BuildModule(request), IsOk());
  for (const auto& [name, custom, depth] :
       {std::tuple("deep/seq", false, 51), std::tuple("deep/custom", true, 35),
        std::tuple("deep/seq", false, 400)}) {
    SCOPED_TRACE(depth);
    request.set_module(name);
    *request.mutable_spec() = nested(depth, custom);
    EXPECT_THAT(client_->BuildModule(request),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("request: the server could not parse the "
                                   "request of /modelstate.v1."
                                   "ModelStateService/BuildModule")));
  }
  v1::GetModuleRequest get;
  get.set_module("deep/seq");
  EXPECT_THAT(client_->GetModule(get), StatusIs(absl::StatusCode::kNotFound));
}

// An interceptor blocks every registration named "temp": an ordinary build
// reports the block and stores the module, an all_or_nothing build fails
// and stores nothing.
TEST_F(ServiceTest, AllOrNothingBuildWithABlockedRegistrationStoresNothing) {
  v1::Subscription subscription;
  subscription.set_name("no-temp");
  subscription.add_namespaces("aon");
  absl::StatusOr<std::unique_ptr<client::Subscriber>> subscriber =
      client::Subscriber::Start(
          *client_, subscription, [](const v1::HookEventProto& event) {
            v1::HookAnswer answer;
            answer.set_event_id(event.event_id());
            bool temp = event.name() == "temp";
            answer.set_verdict(temp ? v1::HookAnswer::REJECT
                                    : v1::HookAnswer::APPROVE);
            if (temp) answer.set_reason("no temporaries");
            return answer;
          });
  ASSERT_THAT(subscriber, IsOk());
  const std::string spec = R"({"type": "Net", "members": [
      {"parameter": {"name": "w", "shape": [2], "init": {"kind": "ones"}}},
      {"buffer": {"name": "temp", "shape": [3]}}]})";
  absl::StatusOr<v1::BuildModuleResponse> lenient =
      client_->BuildModule(BuildRequest("aon/lenient", spec));
  ASSERT_THAT(lenient, IsOk());
  ASSERT_EQ(lenient->registrations_size(), 2);
  EXPECT_EQ(lenient->registrations(1).name(), "temp");
  EXPECT_EQ(lenient->registrations(1).outcome(), v1::OUTCOME_BLOCK);

  v1::BuildModuleRequest strict = BuildRequest("aon/strict", spec);
  strict.set_all_or_nothing(true);
  EXPECT_THAT(client_->BuildModule(strict),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(
                           HasSubstr("all_or_nothing build of 'aon/strict' "
                                     "stored nothing"),
                           HasSubstr("temp"), HasSubstr("no temporaries"))));
  v1::GetModuleRequest get;
  get.set_module("aon/strict");
  EXPECT_THAT(client_->GetModule(get), StatusIs(absl::StatusCode::kNotFound));
  v1::ListModulesRequest list;
  list.set_namespace_("aon");
  absl::StatusOr<v1::ListModulesResponse> listed = client_->ListModules(list);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->modules_size(), 1);
  EXPECT_EQ(listed->modules(0).module(), "aon/lenient");

  // With nothing blocked, all_or_nothing builds as usual.
  v1::BuildModuleRequest clean =
      BuildRequest("aon/clean", R"({"type": "Linear", "args": [2, 2]})");
  clean.set_all_or_nothing(true);
  EXPECT_THAT(client_->BuildModule(clean), IsOk());
  (*subscriber)->Stop();
}

TEST_F(ServiceTest, RegistrationRpcsReportEachOutcome) {
  ASSERT_THAT(client_->BuildModule(
                  BuildRequest("reg/net", R"({"type": "Net", "members": [
      {"module": {"name": "enc", "spec": {"type": "Linear", "args": [2, 2]}}}]})")),
              IsOk());
  v1::RegisterTensorRequest p;
  p.set_module("reg/net");
  p.set_path("enc");
  p.set_name("scale");
  v1::TensorProto* t = p.mutable_tensor();
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_shape(2);
  t->set_data(std::string("\0\0\x80\x3f\0\0\0\x40", 8));  // [1.0, 2.0]
  p.set_requires_grad(false);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::RegisterResponse r,
                                  client_->RegisterParameter(p));
  ASSERT_EQ(r.registrations_size(), 1);
  EXPECT_EQ(r.registrations(0).path(), "enc");
  EXPECT_EQ(r.registrations(0).module_type(), "Linear");
  EXPECT_EQ(r.registrations(0).kind(), v1::ENTRY_KIND_PARAMETER);
  EXPECT_EQ(r.registrations(0).outcome(), v1::OUTCOME_KEEP);
  EXPECT_FALSE(r.registrations(0).value().requires_grad());
  v1::RegisterTensorRequest b;
  b.set_module("reg/net");
  b.set_name("stats");
  b.mutable_init()->add_shape(3);
  b.mutable_init()->mutable_init()->set_kind("ones");
  b.set_persistent(false);
  ASSERT_THAT(client_->RegisterBuffer(b), IsOk());
  v1::RegisterSubmoduleRequest s;
  s.set_module("reg/net");
  s.set_name("dec");
  *s.mutable_spec() = SpecProto(R"({"type": "Linear", "args": [2, 3]})");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(r, client_->RegisterSubmodule(s));
  ASSERT_EQ(r.registrations_size(), 3);  // dec.weight, dec.bias, then dec
  EXPECT_EQ(r.registrations(0).path(), "dec");
  EXPECT_EQ(r.registrations(2).kind(), v1::ENTRY_KIND_MODULE);
  EXPECT_EQ(r.registrations(2).name(), "dec");
  v1::RegisterSubmoduleRequest shared;
  shared.set_module("reg/net");
  shared.set_name("enc_again");
  shared.set_existing_path("enc");
  ASSERT_THAT(client_->RegisterSubmodule(shared), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict sd,
                                  client_->GetStateDict("reg/net"));
  EXPECT_THAT(sd.tensors.Keys(),
              ElementsAre("enc.weight", "enc.bias", "enc.scale", "dec.weight",
                          "dec.bias", "enc_again.weight", "enc_again.bias",
                          "enc_again.scale"));
  EXPECT_EQ(sd.tensors.Find("enc.scale")->data<float>()[1], 2.0f);
  v1::GetModuleRequest get;
  get.set_module("reg/net");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse d,
                                  client_->GetModule(get));
  EXPECT_EQ(d.info().children(2).same_as(), "enc");
  EXPECT_FALSE(d.info().buffers(0).tensor().persistent());
  v1::RemoveEntryRequest remove;
  remove.set_module("reg/net");
  remove.set_name("enc_again");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(r, client_->RemoveEntry(remove));
  EXPECT_EQ(r.registrations(0).action(), v1::REGISTRATION_ACTION_UNREGISTER);
  v1::RegisterTensorRequest none;
  none.set_module("reg/net");
  none.set_path("enc");
  none.set_name("bias");
  none.set_none(true);
  ASSERT_THAT(client_->RegisterParameter(none), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(sd, client_->GetStateDict("reg/net"));
  EXPECT_THAT(sd.tensors.Keys(),
              ElementsAre("enc.weight", "enc.scale", "dec.weight", "dec.bias"));
}

TEST_F(ServiceTest, MoveModuleAndTrainingFlags) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("move/net", kNet)), IsOk());
  v1::MoveModuleRequest move;
  move.set_module("move/net");
  move.set_dtype("float16");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::MoveModuleResponse moved,
                                  client_->MoveModule(move));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict sd,
                                  client_->GetStateDict("move/net"));
  for (const auto& item : sd.tensors) {
    DType want =
        item.key == "bn.num_batches_tracked" ? DType::kInt64 : DType::kFloat16;
    EXPECT_EQ(item.value.dtype(), want) << item.key;
  }
  StateDict local = LocalBuild(kNet)->GetStateDict();
  EXPECT_TRUE(TensorsEqual(
      *sd.tensors.Find("fc1.weight"),
      *local.tensors.Find("fc1.weight")->To(Device::Cpu(), DType::kFloat16)));
  move.set_dtype("");
  move.set_device("meta");
  ASSERT_THAT(client_->MoveModule(move), IsOk());
  EXPECT_THAT(
      client_->GetStateDict("move/net"),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("meta")));
  ASSERT_THAT(client_->SetTraining("move/net", false), IsOk());
  v1::GetModuleRequest get;
  get.set_module("move/net");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse d,
                                  client_->GetModule(get));
  EXPECT_FALSE(d.info().training());
  EXPECT_FALSE(d.info().children(1).module().training());
  EXPECT_EQ(d.info().parameters_size(), 0);
  EXPECT_EQ(d.info().children(0).module().parameters(0).tensor().device(),
            "meta");
}

TEST_F(ServiceTest, DeleteRemovesTheModule) {
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("del/m", R"({"type": "ReLU"})")),
      IsOk());
  ASSERT_THAT(client_->DeleteModule("del/m"), IsOk());
  v1::GetModuleRequest get;
  get.set_module("del/m");
  EXPECT_THAT(client_->GetModule(get), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("del/m", R"({"type": "Tanh"})")),
      IsOk());
}

TEST_F(ServiceTest, ThirtyTwoConcurrentClients) {
  constexpr int kClients = 32;
  const std::string shared_spec = R"({"type": "Linear", "args": [64, 64]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("conc/shared", shared_spec)),
              IsOk());
  // Start from a known pattern so that every snapshot is checked.
  StateDict first;
  first.tensors.Set("weight", Filled(DType::kFloat32, {64, 64}, 1000));
  first.tensors.Set("bias", Filled(DType::kFloat32, {64}, 1000));
  ASSERT_THAT(client_->LoadStateDict("conc/shared", first), IsOk());
  std::atomic<int> failures{0};
  std::atomic<int> torn{0};
  std::atomic<int> checked{0};
  std::atomic<int> saw_a_write{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<client::ModelStateClient> cl = server_->NewClient();
      if (c % 2 == 0) {
        // Own module: build, load, read back.
        std::string name = absl::StrCat("conc/own", c);
        if (!cl->BuildModule(BuildRequest(name, kNet, c)).ok()) ++failures;
        for (int i = 0; i < 5; ++i) {
          absl::StatusOr<StateDict> sd = cl->GetStateDict(name);
          if (!sd.ok()) {
            ++failures;
            continue;
          }
          if (!cl->LoadStateDict(name, *sd).ok()) ++failures;
        }
      } else if (c % 4 == 1) {
        // Writers of the shared module: every element of a load equals c.
        StateDict sd;
        sd.tensors.Set("weight", Filled(DType::kFloat32, {64, 64}, c));
        sd.tensors.Set("bias", Filled(DType::kFloat32, {64}, c));
        for (int i = 0; i < 10; ++i) {
          if (!cl->LoadStateDict("conc/shared", sd).ok()) ++failures;
        }
      } else {
        // Readers of the shared module: a snapshot is never half of one
        // load and half of another.
        for (int i = 0; i < 10; ++i) {
          absl::StatusOr<StateDict> sd = cl->GetStateDict("conc/shared");
          if (!sd.ok()) {
            ++failures;
            continue;
          }
          const float* w = sd->tensors.Find("weight")->data<float>();
          const float* b = sd->tensors.Find("bias")->data<float>();
          // The first pattern, or one writer's.
          if (w[0] != 1000 && !(w[0] >= 1 && w[0] < kClients &&
                                static_cast<int>(w[0]) % 4 == 1)) {
            ++torn;
          }
          if (w[0] != 1000) ++saw_a_write;
          for (int k = 0; k < 64 * 64; ++k) {
            if (w[k] != w[0]) ++torn;
          }
          for (int k = 0; k < 64; ++k) {
            if (b[k] != w[0]) ++torn;
          }
          ++checked;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(checked.load(), 8 * 10);  // 8 readers, 10 snapshots each
  // After the writers: one writer's pattern, whole.
  absl::StatusOr<StateDict> last = client_->GetStateDict("conc/shared");
  ASSERT_THAT(last, IsOk());
  float w0 = last->tensors.Find("weight")->data<float>()[0];
  EXPECT_EQ(static_cast<int>(w0) % 4, 1);
  EXPECT_TRUE(TensorsEqual(*last->tensors.Find("weight"),
                           Filled(DType::kFloat32, {64, 64}, w0)));
  EXPECT_TRUE(TensorsEqual(*last->tensors.Find("bias"),
                           Filled(DType::kFloat32, {64}, w0)));
  std::cout << "snapshots taken while writers ran that showed a write: "
            << saw_a_write.load() << " of " << checked.load() << "\n";
}

// Two readers of one module that stop reading mid-stream hold neither each
// other nor a writer back, and each still gets the snapshot it started.
TEST_F(ServiceTest, SlowReadersOfOneModuleOverlapAndDoNotBlockAWriter) {
  constexpr int64_t kOut = 1024, kIn = 1024;  // 4 MiB of weight
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "slow/m", absl::StrCat(R"({"type": "Linear", "args": [)", kIn,
                                         ", ", kOut, "]}"))),
              IsOk());
  auto pattern = [&](double value) {
    StateDict sd;
    sd.tensors.Set("weight", Filled(DType::kFloat32, {kOut, kIn}, value));
    sd.tensors.Set("bias", Filled(DType::kFloat32, {kOut}, value));
    return sd;
  };
  ASSERT_THAT(client_->LoadStateDict("slow/m", pattern(1)), IsOk());

  struct SlowReader {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> stream;
    std::string bytes;
  };
  auto open = [&] {
    SlowReader r;
    r.context = client_->NewContext(absl::Seconds(60));
    v1::GetStateDictRequest request;
    request.set_module("slow/m");
    request.set_chunk_bytes(4096);
    r.stream = client_->stub().GetStateDict(r.context.get(), request);
    v1::StateDictChunk chunk;
    // The header, then one chunk of data; then this reader stalls.
    EXPECT_TRUE(r.stream->Read(&chunk) && chunk.has_header());
    EXPECT_TRUE(r.stream->Read(&chunk) && !chunk.data().empty());
    r.bytes = chunk.data();
    return r;
  };
  auto start = std::chrono::steady_clock::now();
  SlowReader a = open();
  SlowReader b = open();  // served while `a` is stalled mid-stream
  EXPECT_THAT(client_->LoadStateDict("slow/m", pattern(2)), IsOk());
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(seconds, 20.0);
  for (SlowReader* r : {&a, &b}) {
    v1::StateDictChunk chunk;
    while (r->stream->Read(&chunk)) r->bytes += chunk.data();
    EXPECT_THAT(convert::FromGrpcStatus(r->stream->Finish()), IsOk());
    ASSERT_EQ(r->bytes.size(), static_cast<size_t>((kOut * kIn + kOut) * 4));
    const float* values = reinterpret_cast<const float*>(r->bytes.data());
    int64_t not_one = 0;
    for (int64_t i = 0; i < kOut * kIn + kOut; ++i) not_one += values[i] != 1;
    EXPECT_EQ(not_one, 0) << "a snapshot showed the later load";
  }
  absl::StatusOr<StateDict> after = client_->GetStateDict("slow/m");
  ASSERT_THAT(after, IsOk());
  ExpectSameState(*after, pattern(2));
}

// Reflection is the binary's (a process-wide gRPC plugin it turns on).
TEST(ServerLifecycleTest, HealthIsServingAndReflectionListsTheServices) {
  TestServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> client = server.NewClient();
  EXPECT_THAT(client->Health(), IsOk());
  auto stub =
      grpc::reflection::v1alpha::ServerReflection::NewStub(client->channel());
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("*");
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) {
    services.push_back(s.name());
  }
  EXPECT_THAT(services,
              ::testing::IsSupersetOf({"modelstate.v1.ModelStateService",
                                       "grpc.health.v1.Health"}));
  EXPECT_TRUE(stream->Finish().ok());
}

// A loopback port nobody listens on (bound, then released).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// --health_listen serves grpc.health.v1 and nothing else: not the service,
// and not the reflection the binary turns on for its main port.
TEST(ServerLifecycleTest, TheHealthPortServesHealthOnly) {
  const std::string health = absl::StrCat("127.0.0.1:", FreePort());
  TestServer server({"--health_listen=" + health});
  ASSERT_THAT(server.Start(), IsOk());
  auto channel =
      grpc::CreateChannel(health, grpc::InsecureChannelCredentials());
  grpc::health::v1::HealthCheckResponse serving;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)
                    ->Check(&context, {}, &serving)
                    .ok());
  }
  EXPECT_EQ(serving.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("*");
  stream->Write(request);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  grpc::ClientContext list_context;
  v1::ListModulesResponse modules;
  EXPECT_EQ(v1::ModelStateService::NewStub(channel)
                ->ListModules(&list_context, {}, &modules)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// SIGTERM and SIGINT both drain: health turns NOT_SERVING for a watcher at
// once, running calls get the grace period, and the process exits 0.
TEST(ServerLifecycleTest, DrainsOnSigtermAndSigintWithinTheGracePeriod) {
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    TestServer server({"--shutdown_grace_seconds=2"});
    ASSERT_THAT(server.Start(), IsOk());
    std::unique_ptr<client::ModelStateClient> c = server.NewClient();
    ASSERT_THAT(c->BuildModule(BuildRequest(
                    "life/m", R"({"type": "Linear", "args": [512, 512]})")),
                IsOk());
    // A health watcher sees every change of the serving status.
    auto health = grpc::health::v1::Health::NewStub(c->channel());
    grpc::ClientContext watch_context;
    watch_context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(60));
    auto watch = health->Watch(&watch_context, HealthCheckRequest());
    HealthCheckResponse status;
    ASSERT_TRUE(watch->Read(&status));
    EXPECT_EQ(status.status(), HealthCheckResponse::SERVING);
    // A stream the client never reads keeps the server draining until the
    // grace period ends.
    grpc::ClientContext stalled;
    v1::GetStateDictRequest request;
    request.set_module("life/m");
    request.set_chunk_bytes(1024);
    auto reader = c->stub().GetStateDict(&stalled, request);
    v1::StateDictChunk header;
    ASSERT_TRUE(reader->Read(&header));
    auto start = std::chrono::steady_clock::now();
    kill(server.pid(), sig);
    ASSERT_TRUE(watch->Read(&status));
    EXPECT_EQ(status.status(), HealthCheckResponse::NOT_SERVING);
    // Signal 0 sends nothing: just wait for the exit.
    int exit_status = server.Stop(0, std::chrono::seconds(20));
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_TRUE(WIFEXITED(exit_status)) << exit_status;
    EXPECT_EQ(WEXITSTATUS(exit_status), 0);
    EXPECT_LT(seconds, 10.0);
    EXPECT_THAT(server.Log(),
                HasSubstr(absl::StrCat("signal ", sig, ": shutting down")));
    stalled.TryCancel();
    watch_context.TryCancel();
  }
}

// The names of the threads of process `pid`.
std::vector<std::string> ThreadNames(pid_t pid) {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.push_back(name);
  }
  return names;
}

v1::Subscription Approving(const std::string& name) {
  v1::Subscription s;
  s.set_name(name);
  return s;
}

v1::HookAnswer Approve(const v1::HookEventProto& e) {
  v1::HookAnswer a;
  a.set_event_id(e.event_id());
  a.set_verdict(v1::HookAnswer::APPROVE);
  return a;
}

// A Watch of grpc.health.v1 whose first status has been read.
struct Watch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>>
      reader;
  grpc::health::v1::HealthCheckResponse first;
};

std::unique_ptr<Watch> StartWatch(grpc::health::v1::Health::Stub& health,
                                  const std::string& service = "") {
  auto watch = std::make_unique<Watch>();
  watch->context.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::seconds(60));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  watch->reader = health.Watch(&watch->context, request);
  EXPECT_TRUE(watch->reader->Read(&watch->first));
  return watch;
}

// gRPC 1.51's callback API runs its reactions on "nexting_thread"s that
// sleep 100 ms after each idle second, and while they sleep a call can wait
// for no thread polling (server/async_calls.h): one in ten large fetches
// reached its handler 50 to 110 ms late. Subscribe and health Watch streams
// are served without it, so no such thread may exist in a server that has
// served both.
TEST(ServerLifecycleTest, ServesStreamsWithoutGrpcsCallbackThreads) {
  TestServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  absl::StatusOr<std::unique_ptr<client::Subscriber>> sub =
      client::Subscriber::Start(*c, Approving("threads"), Approve);
  ASSERT_THAT(sub.status(), IsOk());
  ASSERT_THAT(c->BuildModule(BuildRequest(
                  "threads/m", R"({"type": "Linear", "args": [4, 4]})")),
              IsOk());
  auto health = grpc::health::v1::Health::NewStub(c->channel());
  std::unique_ptr<Watch> watch = StartWatch(*health);
  EXPECT_EQ(watch->first.status(),
            grpc::health::v1::HealthCheckResponse::SERVING);
  const std::vector<std::string> names = ThreadNames(server.pid());
  EXPECT_THAT(names, ::testing::Contains("grpcpp_sync_ser"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("nexting_thread")));
  (*sub)->Stop();
  watch->context.TryCancel();
}

// A health watcher holds no thread: with 4 serving threads, 16 watchers
// leave every call served. Another service's name is unknown: Watch says
// SERVICE_UNKNOWN, Check NOT_FOUND naming it. Half the watchers going
// leaves the server healthy (metrics_test checks that it lets them go).
TEST(ServerLifecycleTest, HealthWatchersHoldNoThread) {
  using grpc::health::v1::HealthCheckResponse;
  TestServer server({"--worker_threads=4"});
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  auto health = grpc::health::v1::Health::NewStub(c->channel());
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 16; ++i) {
    watches.push_back(StartWatch(*health));
    EXPECT_EQ(watches.back()->first.status(), HealthCheckResponse::SERVING);
  }
  EXPECT_THAT(c->Health(), IsOk());
  EXPECT_THAT(c->BuildModule(BuildRequest(
                  "watch/m", R"({"type": "Linear", "args": [4, 4]})")),
              IsOk());
  EXPECT_THAT(c->GetStateDict("watch/m").status(), IsOk());

  std::unique_ptr<Watch> other = StartWatch(*health, "other.Service");
  EXPECT_EQ(other->first.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  grpc::ClientContext check_context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("other.Service");
  HealthCheckResponse response;
  grpc::Status checked = health->Check(&check_context, request, &response);
  EXPECT_EQ(checked.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(checked.error_message(), HasSubstr("service: unknown service "
                                                 "'other.Service'"));

  for (int i = 0; i < 8; ++i) {
    watches[i]->context.TryCancel();
    HealthCheckResponse more;
    EXPECT_FALSE(watches[i]->reader->Read(&more));
    EXPECT_EQ(watches[i]->reader->Finish().error_code(),
              grpc::StatusCode::CANCELLED);
  }
  EXPECT_THAT(c->Health(), IsOk());
  for (int i = 8; i < 16; ++i) watches[i]->context.TryCancel();
  other->context.TryCancel();
}

// Shutting down with streams open ends each of them and exits 0: health
// watchers read NOT_SERVING and then the end, subscribers are told the
// server is going, and nothing is left waiting on the server's threads.
TEST(ServerLifecycleTest, ShutsDownCleanlyWithStreamsOpen) {
  using grpc::health::v1::HealthCheckResponse;
  TestServer server({"--shutdown_grace_seconds=2"});
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  auto health = grpc::health::v1::Health::NewStub(c->channel());
  std::vector<std::unique_ptr<Watch>> watches;
  std::vector<std::unique_ptr<client::Subscriber>> subscribers;
  for (int i = 0; i < 4; ++i) {
    watches.push_back(StartWatch(*health));
    absl::StatusOr<std::unique_ptr<client::Subscriber>> sub =
        client::Subscriber::Start(*c, Approving(absl::StrCat("open", i)),
                                  Approve);
    ASSERT_THAT(sub.status(), IsOk());
    subscribers.push_back(*std::move(sub));
  }
  kill(server.pid(), SIGTERM);
  for (auto& watch : watches) {
    HealthCheckResponse status;
    ASSERT_TRUE(watch->reader->Read(&status));
    EXPECT_EQ(status.status(), HealthCheckResponse::NOT_SERVING);
    EXPECT_FALSE(watch->reader->Read(&status));
    EXPECT_TRUE(watch->reader->Finish().ok());
  }
  for (auto& sub : subscribers) {
    EXPECT_THAT(sub->Wait(), StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr("server shutting down")));
  }
  // Signal 0 sends nothing: just wait for the exit.
  int exit_status = server.Stop(0, std::chrono::seconds(20));
  EXPECT_TRUE(WIFEXITED(exit_status)) << exit_status;
  EXPECT_EQ(WEXITSTATUS(exit_status), 0);
}

// Limits out of range stop the server before it listens: exit code 2 and a
// message naming the flag and its range.
TEST(ServerLifecycleTest, RefusesOutOfRangeFlagsWithExitCodeTwo) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           absl::StrCat("flags-test-", getpid()))
                              .string();
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--chunk_kib=-1"}, "--chunk_kib=-1: must be between 1 and 16384"},
           {{"--chunk_kib=0"}, "--chunk_kib=0: must be between 1 and 16384"},
           {{"--chunk_kib=2048", "--max_chunk_kib=1024"},
            "--chunk_kib=2048: must be between 1 and 1024"},
           {{"--max_chunk_kib=8192", "--max_message_mib=4"},
            "--max_chunk_kib=8192: must be between 1 and 3072"},
           {{"--max_message_mib=1"}, "--max_message_mib=1: must be between 2"},
           {{"--max_message_mib=4096"},
            "--max_message_mib=4096: must be between 2 and 2047"},
           {{"--worker_threads=-3"}, "--worker_threads=-3"},
           {{"--max_transport_mib=-1"}, "--max_transport_mib=-1"},
           {{"--max_transport_mib=100", "--max_message_mib=64"},
            "--max_transport_mib=100: must be between 128 and 2147483647 "
            "(MiB, at least twice --max_message_mib; 0: no limit)"},
           {{"--max_tensor_mib=0"}, "--max_tensor_mib=0"},
           {{"--max_module_mib=-1"}, "--max_module_mib=-1"},
           {{"--max_entries=0"}, "--max_entries=0"},
           {{"--max_spec_depth=0"}, "--max_spec_depth=0"},
           {{"--max_queued_events=0"}, "--max_queued_events=0"},
           {{"--max_subscriber_queue_mib=0"}, "--max_subscriber_queue_mib=0"},
           {{"--shutdown_grace_seconds=-5"}, "--shutdown_grace_seconds=-5"},
           {{"--stream_window_kib=-1"}, "--stream_window_kib=-1"},
           {{"--max_streams_per_identity=-1"}, "--max_streams_per_identity=-1"},
           {{"--log_format=xml"},
            "--log_format must be text or json, got 'xml'"},
           {{"--metrics_listen=localhost:http"},
            "--metrics_listen: cannot parse 'localhost:http'"},
           {{"--scrub_interval=-1s"},
            "--scrub_interval must not be negative (0 turns the scrub off)"},
           {{"--namespace_max_mib=-1"},
            "--namespace_max_mib=-1: must be between 0"},
           {{"--namespace_max_modules=-1"},
            "--namespace_max_modules=-1: must be between 0"},
           // gRPC would wrap a port above 65535, or take any for 65536.
           {{"--listen=127.0.0.1:99999"},
            "--listen: cannot parse '127.0.0.1:99999'"},
           {{"--health_listen=127.0.0.1:65536"},
            "--health_listen: cannot parse '127.0.0.1:65536'"},
           {{"--etcd_endpoints=127.0.0.1:1", "--cluster_lease_seconds=0"},
            "--cluster_lease_seconds=0: must be between 2 and 86400"},
       }) {
    SCOPED_TRACE(c.flags.front());
    std::vector<std::string> argv = {MODELSTATE_SERVER_BINARY,
                                     "--data_dir=" + dir};
    // The case's own --listen, if it has one, comes last and wins.
    argv.push_back("--listen=127.0.0.1:0");
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    // A server that accepted the flags would serve until the timeout.
    testing::CommandResult run =
        testing::RunCommand(argv, {}, std::chrono::seconds(20));
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_THAT(run.err, HasSubstr(c.says));
    EXPECT_THAT(run.err, ::testing::Not(HasSubstr("listening on")));
  }
  // Refused before the data directory was even created.
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// --help lists the server's own flags (Abseil's default lists those of a
// file named after the program, and there is none).
TEST(ServerLifecycleTest, HelpListsTheServersFlags) {
  testing::CommandResult run = testing::RunCommand(
      {MODELSTATE_SERVER_BINARY, "--help"}, {}, std::chrono::seconds(20));
  EXPECT_THAT(run.out + run.err, HasSubstr("--max_message_mib"));
  EXPECT_THAT(run.out + run.err, HasSubstr("--data_dir"));
}

TEST(ServerLifecycleTest, ASecondServerOnTheSamePortFails) {
  TestServer first;
  ASSERT_THAT(first.Start(), IsOk());
  std::string port = first.address().substr(first.address().rfind(':') + 1);
  TestServer second({"--listen=127.0.0.1:" + port});
  // The later --listen flag wins over the fixture's port 0.
  EXPECT_FALSE(second.Start().ok());
}

}  // namespace
}  // namespace modelstate
