// Modules on CUDA devices through the real server. CI has no GPU, so the
// server runs with --emulated_cuda_devices (host memory standing in for
// cuda:0.., see core/emulated_device.h): the service, the client, the CLI,
// hooks and durability are exercised exactly as with a GPU. The *_CUDA test
// at the end uses a real GPU and skips without one.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "client/model_state_client.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/convert.h"
#include "tests/testing/requests.h"
#include "tests/testing/run_command.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BackgroundProcess;
using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::CommandResult;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::LocalBuild;
using ::modelstate::testing::RunCommand;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::HasSubstr;

constexpr char kMlp[] = R"({"type": "Sequential", "children": [
    {"spec": {"type": "Linear", "args": [64, 48]}},
    {"spec": {"type": "BatchNorm1d", "args": [48]}},
    {"spec": {"type": "Linear", "args": [48, 8]}}]})";

// Every tensor entry of `info`'s tree, with its device.
void CollectDevices(const v1::ModuleInfo& info, std::vector<std::string>* out) {
  for (const auto& e : info.parameters()) out->push_back(e.tensor().device());
  for (const auto& e : info.buffers()) out->push_back(e.tensor().device());
  for (const auto& c : info.children()) CollectDevices(c.module(), out);
}

class DeviceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart({"--emulated_cuda_devices=2"}); }

  void Restart(std::vector<std::string> flags) {
    client_.reset();
    server_.Stop(SIGTERM);
    server_.set_flags(std::move(flags));
    ASSERT_THAT(server_.Start(), IsOk()) << server_.Log();
    client_ = server_.NewClient();
  }

  std::vector<std::string> Devices(const std::string& module) {
    v1::GetModuleRequest request;
    request.set_module(module);
    absl::StatusOr<v1::GetModuleResponse> r = client_->GetModule(request);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> devices;
    if (r.ok()) CollectDevices(r->info(), &devices);
    return devices;
  }

  absl::StatusOr<v1::MoveModuleResponse> Move(const std::string& module,
                                              const std::string& device,
                                              const std::string& dtype = "") {
    v1::MoveModuleRequest request;
    request.set_module(module);
    request.set_device(device);
    request.set_dtype(dtype);
    return client_->MoveModule(request);
  }

  void BuildMlp(const std::string& module) {
    ASSERT_THAT(client_->BuildModule(BuildRequest(module, kMlp, 7)).status(),
                IsOk());
  }

  TestServer server_;
  std::unique_ptr<client::ModelStateClient> client_;
};

TEST_F(DeviceServiceTest, ListDevicesNamesEveryDeviceWithItsMemory) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::ListDevicesResponse r,
                                  client_->ListDevices());
  ASSERT_EQ(r.devices_size(), 4);
  EXPECT_EQ(r.devices(0).device(), "cpu");
  EXPECT_GT(r.devices(0).total_bytes(), 0u);
  EXPECT_EQ(r.devices(1).device(), "meta");
  EXPECT_EQ(r.devices(2).device(), "cuda:0");
  EXPECT_EQ(r.devices(3).device(), "cuda:1");
  EXPECT_GT(r.devices(3).total_bytes(), 0u);
  EXPECT_LE(r.devices(3).free_bytes(), r.devices(3).total_bytes());

  CommandResult human = RunCommand(
      {MODELSTATE_CLI_BINARY, "--server", server_.address(), "devices"});
  EXPECT_EQ(human.exit_code, 0) << human.err;
  EXPECT_THAT(human.out, HasSubstr("DEVICE"));
  EXPECT_THAT(human.out, HasSubstr("cuda:1"));
  EXPECT_THAT(human.out, HasSubstr("GiB"));
  CommandResult json = RunCommand({MODELSTATE_CLI_BINARY, "--server",
                                   server_.address(), "devices", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  nlohmann::json parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["devices"].size(), 4u);
  EXPECT_EQ(parsed["devices"][2]["device"], "cuda:0");
  CommandResult help = RunCommand({MODELSTATE_CLI_BINARY, "devices", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("memory"));
}

TEST_F(DeviceServiceTest, MoveToCudaAndBackKeepsTheStateBitForBit) {
  BuildMlp("dev/mlp");
  std::shared_ptr<Module> local = LocalBuild(kMlp, 7);
  ASSERT_NE(local, nullptr);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::MoveModuleResponse moved,
                                  Move("dev/mlp", "cuda:1"));
  std::vector<std::string> devices;
  CollectDevices(moved.info(), &devices);
  EXPECT_THAT(devices, ::testing::Each("cuda:1"));
  EXPECT_THAT(Devices("dev/mlp"), ::testing::Each("cuda:1"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict on_gpu,
                                  client_->GetStateDict("dev/mlp"));
  ExpectSameState(on_gpu, local->GetStateDict());

  // to(float16) on the device equals the CPU's conversion; int64 buffers
  // keep their dtype.
  ASSERT_THAT(Move("dev/mlp", "", "float16").status(), IsOk());
  MODELSTATE_ASSERT_OK(local->Half());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict half,
                                  client_->GetStateDict("dev/mlp"));
  ExpectSameState(half, local->GetStateDict());
  EXPECT_EQ(half.tensors.Find("1.num_batches_tracked")->dtype(), DType::kInt64);

  // Streaming with a target dtype converts the device's bytes per chunk.
  client::GetStateDictOptions as_float;
  as_float.target_dtype = DType::kFloat32;
  as_float.chunk_bytes = 1000;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict widened,
                                  client_->GetStateDict("dev/mlp", as_float));
  MODELSTATE_ASSERT_OK(local->Float());
  ExpectSameState(widened, local->GetStateDict());

  // cuda:1 -> cuda:0 -> cpu.
  ASSERT_THAT(Move("dev/mlp", "cuda:0").status(), IsOk());
  EXPECT_THAT(Devices("dev/mlp"), ::testing::Each("cuda:0"));
  ASSERT_THAT(Move("dev/mlp", "cpu", "float32").status(), IsOk());
  EXPECT_THAT(Devices("dev/mlp"), ::testing::Each("cpu"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back,
                                  client_->GetStateDict("dev/mlp"));
  ExpectSameState(back, local->GetStateDict());
}

TEST_F(DeviceServiceTest, MissingDevicesAndForwardOnCudaAreClearErrors) {
  BuildMlp("dev/errors");
  EXPECT_THAT(
      Move("dev/errors", "cuda:2").status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("this server has: cpu, meta, cuda:0, cuda:1")));
  EXPECT_THAT(
      Move("dev/errors", "gpu").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device")));
  ASSERT_THAT(Move("dev/errors", "cuda:0").status(), IsOk());
  v1::ForwardRequest forward;
  forward.set_module("dev/errors");
  absl::StatusOr<Tensor> x = Tensor::Zeros(DType::kFloat32, {2, 64});
  ASSERT_TRUE(x.ok());
  MODELSTATE_ASSERT_OK(convert::TensorToProto(*x, forward.add_inputs()));
  forward.set_training(false);
  EXPECT_THAT(
      client_->Forward(forward).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:0")));
}

TEST_F(DeviceServiceTest, LoadStateDictIntoACudaModuleIsAtomic) {
  BuildMlp("dev/load");
  ASSERT_THAT(Move("dev/load", "cuda:1").status(), IsOk());
  std::shared_ptr<Module> other = LocalBuild(kMlp, 99);
  ASSERT_NE(other, nullptr);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::LoadStateDictResponse loaded,
      client_->LoadStateDict("dev/load", other->GetStateDict()));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict now,
                                  client_->GetStateDict("dev/load"));
  ExpectSameState(now, other->GetStateDict());
  EXPECT_THAT(Devices("dev/load"), ::testing::Each("cuda:1"));

  // A failing load (one wrong shape) changes nothing on the device.
  StateDict bad = LocalBuild(kMlp, 5)->GetStateDict();
  bad.tensors.Set("2.bias", testing::Zeros({9}));
  EXPECT_THAT(client_->LoadStateDict("dev/load", bad).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("size mismatch for 2.bias")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict after,
                                  client_->GetStateDict("dev/load"));
  ExpectSameState(after, other->GetStateDict());
}

// A streamed load into a module on a device goes from the received file
// straight into the device, and that file, already on disk, becomes the
// module's data: nothing is downloaded again to be written a second time.
TEST_F(DeviceServiceTest, ALoadIntoACudaModuleKeepsTheReceivedFileAsItsData) {
  BuildMlp("dev/adopt");
  ASSERT_THAT(Move("dev/adopt", "cuda:0").status(), IsOk());
  const StateDict other = LocalBuild(kMlp, 42)->GetStateDict();
  ASSERT_THAT(client_->LoadStateDict("dev/adopt", other).status(), IsOk());
  std::vector<std::string> keys;
  for (const auto& f : std::filesystem::directory_iterator(
           server_.data_dir() / "modules" / "dev" / "adopt")) {
    if (f.path().extension() != ".safetensors") continue;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                                    ReadSafetensorsHeader(f.path().string()));
    for (const SafetensorsEntry& e : header.entries) keys.push_back(e.key);
  }
  std::vector<std::string> want;
  for (const auto& item : other.tensors) want.push_back(item.key);
  // The received file's own keys, not a save's "s0", "s1", ...
  EXPECT_THAT(keys, ::testing::UnorderedElementsAreArray(want));
  EXPECT_THAT(Devices("dev/adopt"), ::testing::Each("cuda:0"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict now,
                                  client_->GetStateDict("dev/adopt"));
  ExpectSameState(now, other);
  // And it is what a restart reads back onto the device.
  Restart({"--emulated_cuda_devices=2"});
  EXPECT_THAT(Devices("dev/adopt"), ::testing::Each("cuda:0"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict restored,
                                  client_->GetStateDict("dev/adopt"));
  ExpectSameState(restored, other);
}

TEST_F(DeviceServiceTest, AHookCanMoveAnEntryToADevice) {
  const std::filesystem::path policy = server_.dir() / "to_cuda.json";
  std::ofstream(policy) << R"({
    "subscription": {"name": "weights-on-gpu",
                     "kinds": ["ENTRY_KIND_PARAMETER"],
                     "timeout_ms": 5000, "failure_policy": "FAIL_CLOSED"},
    "rules": [{"match": {"name": "weight"}, "action": "modify",
               "transform": {"device": "cuda:1"},
               "reason": "weights live on the GPU"}],
    "default": "approve"})";
  BackgroundProcess subscriber({MODELSTATE_CLI_BINARY, "--server",
                                server_.address(), "subscribe", "--policy",
                                policy.string()});
  ASSERT_TRUE(subscriber.WaitForLine("subscribed as"));
  BuildMlp("dev/hooked");
  v1::GetModuleRequest request;
  request.set_module("dev/hooked");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse r,
                                  client_->GetModule(request));
  const v1::ModuleInfo& linear = r.info().children(0).module();
  ASSERT_EQ(linear.parameters_size(), 2);
  EXPECT_EQ(linear.parameters(0).name(), "weight");
  EXPECT_EQ(linear.parameters(0).tensor().device(), "cuda:1");
  EXPECT_EQ(linear.parameters(1).tensor().device(), "cpu");
  // Values are what the build drew, wherever they live.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict sd,
                                  client_->GetStateDict("dev/hooked"));
  ExpectSameState(sd, LocalBuild(kMlp, 7)->GetStateDict());
}

TEST_F(DeviceServiceTest, RestartRestoresTheDeviceOrFallsBackToCpu) {
  BuildMlp("dev/durable");
  ASSERT_THAT(Move("dev/durable", "cuda:1", "bfloat16").status(), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict before,
                                  client_->GetStateDict("dev/durable"));

  Restart({"--emulated_cuda_devices=2"});
  EXPECT_THAT(Devices("dev/durable"), ::testing::Each("cuda:1"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict restored,
                                  client_->GetStateDict("dev/durable"));
  ExpectSameState(restored, before);

  // Without the device the module is not loaded, and the log says why and
  // what to do; the data stays on disk.
  Restart({"--emulated_cuda_devices=1"});
  v1::GetModuleRequest request;
  request.set_module("dev/durable");
  EXPECT_THAT(client_->GetModule(request).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cuda:1 is not available")));
  EXPECT_THAT(server_.Log(), HasSubstr("cuda:1 is not available"));
  EXPECT_THAT(server_.Log(), HasSubstr("--fallback_to_cpu"));

  Restart({"--emulated_cuda_devices=1", "--fallback_to_cpu"});
  EXPECT_THAT(Devices("dev/durable"), ::testing::Each("cpu"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict on_cpu,
                                  client_->GetStateDict("dev/durable"));
  ExpectSameState(on_cpu, before);
}

TEST_F(DeviceServiceTest, EmulationFlagIsRangeChecked) {
  client_.reset();
  server_.Stop(SIGTERM);
  server_.set_flags({"--emulated_cuda_devices=-1"});
  EXPECT_FALSE(server_.Start().ok());
  EXPECT_THAT(server_.Log(), HasSubstr("--emulated_cuda_devices must be"));
}

// A real GPU: 1 GiB streamed out of GPU memory equals the same module's
// state on cpu.
TEST(RealGpuServiceTest, OneGibGetStateDictFromAGpuModule_CUDA) {
  TestServer server;
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::ListDevicesResponse devices,
                                  c->ListDevices());
  if (devices.devices_size() < 3) GTEST_SKIP() << "no GPU visible";
  const std::string spec = R"({"type": "Linear", "args": [16384, 16384],
                                "kwargs": {"bias": false}})";
  ASSERT_THAT(c->BuildModule(BuildRequest("gpu/big", spec, 1)).status(),
              IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict on_cpu, c->GetStateDict("gpu/big"));
  v1::MoveModuleRequest move;
  move.set_module("gpu/big");
  move.set_device("cuda:0");
  ASSERT_THAT(c->MoveModule(move).status(), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict on_gpu, c->GetStateDict("gpu/big"));
  ASSERT_EQ(on_gpu.tensors.Find("weight")->nbytes(), uint64_t{1} << 30);
  ExpectSameState(on_gpu, on_cpu);
}

}  // namespace
}  // namespace modelstate
