// End-to-end tests of modelstatectl: the real server binary on a loopback
// port, the real CLI binary as a subprocess. Assertions are on the text the
// CLI prints, its exit status, and the server's state as the C++ client
// sees it.
#include "client/cli.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/sha256.h"
#include "client/model_state_client.h"
#include "client/subscriber.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "nn/forward.h"
#include "tests/testing/requests.h"
#include "tests/testing/run_command.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BackgroundProcess;
using ::modelstate::testing::CommandResult;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::Filled;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::ParseJson;
using ::modelstate::testing::RunCommand;
using ::modelstate::testing::SharedServerTest;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// For failure messages: everything the command did.
std::string Show(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout:\n", r.out,
                      "--- stderr:\n", r.err, "---");
}

int CountLines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// nn.Sequential(nn.Linear(784, 256), nn.BatchNorm1d(256), nn.ReLU(),
// nn.Linear(256, 10)) as a bare ModuleSpec, the spec file of the README.
constexpr char kMlpSpec[] = R"({"type": "Sequential", "children": [
  {"spec": {"type": "Linear", "args": [784, 256]}},
  {"spec": {"type": "BatchNorm1d", "args": [256]}},
  {"spec": {"type": "ReLU"}},
  {"spec": {"type": "Linear", "args": [256, 10]}}]})";

class CliTest : public SharedServerTest {
 protected:
  void SetUp() override {
    SharedServerTest::SetUp();
    if (HasFatalFailure()) return;
    dir_ = server_->dir() /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }

  // modelstatectl --server ADDR args...
  CommandResult Cli(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {MODELSTATE_CLI_BINARY, "--server",
                                     server_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, env);
  }
  // modelstatectl args... (no --server).
  CommandResult Bare(const std::vector<std::string>& args,
                     const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {MODELSTATE_CLI_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, env);
  }

  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  void Build(const std::string& module, const std::string& spec_json,
             uint64_t seed = 0) {
    v1::BuildModuleRequest request;
    request.set_module(module);
    request.set_seed(seed);
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                    spec_json, request.mutable_spec())
                    .ok());
    ASSERT_THAT(client_->BuildModule(request), IsOk());
  }
  StateDict State(const std::string& module) {
    absl::StatusOr<StateDict> sd = client_->GetStateDict(module);
    EXPECT_TRUE(sd.ok()) << sd.status();
    return sd.ok() ? std::move(*sd) : StateDict();
  }

  std::filesystem::path dir_;
};

// Stops the server process (SIGSTOP) for `pause`, from a thread, so that a
// transfer started meanwhile lasts longer than the progress bar's 1 s delay
// however fast the machine is. The destructor always resumes the server.
class ServerPause {
 public:
  ServerPause(pid_t pid, std::chrono::milliseconds pause) : pid_(pid) {
    kill(pid_, SIGSTOP);
    thread_ = std::thread([this, pause] {
      std::this_thread::sleep_for(pause);
      kill(pid_, SIGCONT);
    });
  }
  ~ServerPause() {
    thread_.join();
    kill(pid_, SIGCONT);
  }

 private:
  pid_t pid_;
  std::thread thread_;
};

// ------------------------------------------------------------ walk-through

TEST_F(CliTest, FiveMinuteWalkThrough) {
  std::string spec = WriteFile("mlp.json", kMlpSpec);

  CommandResult built =
      Cli({"build", spec, "--name", "walk/mlp", "--seed", "0"});
  ASSERT_EQ(built.exit_code, 0) << Show(built);
  EXPECT_EQ(built.out,
            "built walk/mlp (Sequential): 6 parameters (204,042 elements, "
            "816,168 bytes), 3 buffers (2,056 bytes)\n");
  EXPECT_THAT(built.err, IsEmpty());

  CommandResult described = Cli({"describe", "walk/mlp"});
  ASSERT_EQ(described.exit_code, 0) << Show(described);
  std::vector<std::string> parts =
      absl::StrSplit(described.out, "server devices: ");
  ASSERT_EQ(parts.size(), 2u) << described.out;
  EXPECT_EQ(parts[0],
            "walk/mlp: Sequential()\n"
            "  0: Linear(in_features=784, out_features=256)\n"
            "    weight  float32[256, 784]  cpu  784.0 KiB  requires_grad\n"
            "    bias    float32[256]       cpu  1.0 KiB    requires_grad\n"
            "  1: BatchNorm1d(affine=True, eps=1e-05, momentum=0.1, "
            "num_features=256, track_running_stats=True)\n"
            "    weight               float32[256]  cpu  1.0 KiB  "
            "requires_grad\n"
            "    bias                 float32[256]  cpu  1.0 KiB  "
            "requires_grad\n"
            "    running_mean         float32[256]  cpu  1.0 KiB  buffer\n"
            "    running_var          float32[256]  cpu  1.0 KiB  buffer\n"
            "    num_batches_tracked  int64[]       cpu  8 B      buffer\n"
            "  2: ReLU(inplace=False)\n"
            "  3: Linear(in_features=256, out_features=10)\n"
            "    weight  float32[10, 256]  cpu  10.0 KiB  requires_grad\n"
            "    bias    float32[10]       cpu  40 B      requires_grad\n"
            "total: 799.0 KiB (818,224 bytes)\n");
  EXPECT_THAT(parts[1], StartsWith("cpu, meta"));

  // get-state writes exactly the server's state_dict.
  std::string file = Path("mlp.safetensors");
  CommandResult saved = Cli({"get-state", "walk/mlp", "-o", file});
  ASSERT_EQ(saved.exit_code, 0) << Show(saved);
  EXPECT_THAT(saved.out,
              StartsWith("wrote 9 tensors, 818,224 bytes to " + file + " in "));
  EXPECT_THAT(saved.out, ::testing::ContainsRegex(" s \\([0-9.]+ MB/s\\)\n$"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict on_disk, ReadSafetensorsFile(file));
  StateDict original = State("walk/mlp");
  ExpectSameState(on_disk, original);
  EXPECT_THAT(on_disk.tensors.Keys(),
              ElementsAre("0.weight", "0.bias", "1.weight", "1.bias",
                          "1.running_mean", "1.running_var",
                          "1.num_batches_tracked", "3.weight", "3.bias"));

  // Overwrite the server's values, then load the file back.
  StateDict zeros;
  for (const auto& item : original.tensors) {
    zeros.tensors.Set(item.key,
                      Filled(item.value.dtype(), item.value.shape(), 0.0));
  }
  ASSERT_THAT(client_->LoadStateDict("walk/mlp", zeros), IsOk());
  CommandResult loaded = Cli({"load-state", "walk/mlp", file});
  ASSERT_EQ(loaded.exit_code, 0) << Show(loaded);
  EXPECT_THAT(loaded.out, StartsWith("<All keys matched successfully>\n"
                                     "streamed 9 tensors, 818,224 bytes from " +
                                     file + " in "));
  ExpectSameState(State("walk/mlp"), original);

  CommandResult moved = Cli({"to", "walk/mlp", "--dtype", "float16"});
  ASSERT_EQ(moved.exit_code, 0) << Show(moved);
  EXPECT_EQ(moved.out,
            "moved walk/mlp\n"
            "dtypes: float16 (8 tensors), int64 (1 tensor)\n"
            "devices: cpu (9 tensors)\n");
  StateDict half = State("walk/mlp");
  for (const auto& item : original.tensors) {
    DType want = IsFloatingPoint(item.value.dtype()) ? DType::kFloat16
                                                     : item.value.dtype();
    EXPECT_TRUE(TensorsEqual(*half.tensors.Find(item.key),
                             *item.value.To(Device::Cpu(), want)))
        << item.key;
  }

  described = Cli({"describe", "walk/mlp"});
  ASSERT_EQ(described.exit_code, 0) << Show(described);
  EXPECT_THAT(described.out,
              HasSubstr("    weight  float16[256, 784]  cpu  392.0 KiB  "
                        "requires_grad\n"));
  EXPECT_THAT(
      described.out,
      HasSubstr("    running_var          float16[256]  cpu  512 B  buffer\n"
                "    num_batches_tracked  int64[]       cpu  8 B    "
                "buffer\n"));
  EXPECT_THAT(described.out, HasSubstr("total: 399.5 KiB (409,116 bytes)\n"));
}

// The README's walk-through, run as written: its spec block becomes
// mlp.json, and every "$ modelstatectl ..." line runs in a shell in one
// folder against the server, its output compared with the lines under it
// (timings aside). Editing the README's commands or outputs without the
// code, or the code without the README, fails here.
struct ReadmeStep {
  std::string command;   // after "$ "
  std::string expected;  // the lines up to the next command or block end
};

struct ReadmeWalkThrough {
  std::string spec_json;
  std::vector<ReadmeStep> steps;
};

ReadmeWalkThrough ReadReadmeWalkThrough() {
  std::ifstream in(std::string(MODELSTATE_SOURCE_DIR) + "/README.md");
  EXPECT_TRUE(in.good()) << "README.md not found";
  ReadmeWalkThrough w;
  bool in_section = false;
  bool in_block = false;
  std::string language;
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "## ")) {
      if (in_section) break;
      in_section = line == "## A five-minute walk-through (CLI)";
      continue;
    }
    if (!in_section) continue;
    if (absl::StartsWith(line, "```")) {
      in_block = !in_block;
      language = in_block ? line.substr(3) : "";
      continue;
    }
    if (!in_block) continue;
    if (language == "json") {
      w.spec_json += line + "\n";
    } else if (absl::StartsWith(line, "$ ")) {
      w.steps.push_back({line.substr(2), ""});
    } else if (!w.steps.empty()) {
      w.steps.back().expected += line + "\n";
    }
  }
  return w;
}

// Output with what differs from run to run replaced: transfer timings, and
// any accelerators after "cpu, meta".
std::string WithoutTimings(const std::string& text) {
  static const std::regex timing(" in [0-9.]+ s \\([0-9.]+ [kMGT]?B/s\\)");
  static const std::regex devices("server devices: cpu, meta[^\n]*");
  std::string out = std::regex_replace(text, timing, " in T s (R)");
  return std::regex_replace(out, devices, "server devices: cpu, meta");
}

TEST_F(CliTest, ReadmeWalkThroughRunsAsWritten) {
  // The README starts from an empty server (its `ls` lists only what it
  // built), but the suite's tests share one: what others built goes first.
  while (true) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::ListModulesResponse page,
                                    client_->ListModules({}));
    if (page.modules().empty()) break;
    for (const v1::ModuleSummary& module : page.modules()) {
      ASSERT_THAT(client_->DeleteModule(module.module()), IsOk());
    }
  }
  ReadmeWalkThrough w = ReadReadmeWalkThrough();
  ASSERT_FALSE(w.spec_json.empty()) << "no ```json spec in the walk-through";
  WriteFile("mlp.json", w.spec_json);
  // The files the README's later commands name but does not spell out:
  // small.json is given in its command's comment, other.safetensors is
  // "Linear(5, 3, bias=False)'s state".
  StateDict other;
  other.tensors.Set("weight", Filled(DType::kFloat32, {3, 5}, 0.5));
  ASSERT_THAT(WriteSafetensorsFile(Path("other.safetensors"), other), IsOk());
  std::set<std::string> verbs;
  for (const ReadmeStep& step : w.steps) {
    SCOPED_TRACE(step.command);
    ASSERT_TRUE(absl::StartsWith(step.command, "modelstatectl "));
    std::vector<std::string> words = absl::StrSplit(step.command, ' ');
    size_t comment = step.command.find("# {");
    if (comment != std::string::npos) {
      for (const std::string& word : words) {
        if (absl::EndsWith(word, ".json")) {
          WriteFile(word, step.command.substr(comment + 2));
        }
      }
    }
    for (const std::string& word : words) {
      if (!word.empty() && word[0] != '-' && word != "modelstatectl") {
        verbs.insert(word);
        break;
      }
    }
    std::string shell = absl::StrCat(
        "cd '", dir_.string(), "' && '", MODELSTATE_CLI_BINARY, "'",
        step.command.substr(std::string("modelstatectl").size()));
    CommandResult r = RunCommand({"/bin/sh", "-c", shell},
                                 {"MODELSTATE_SERVER=" + server_->address()});
    bool failure_shown = absl::StartsWith(step.expected, "error: ");
    EXPECT_EQ(r.exit_code, failure_shown ? 1 : 0) << Show(r);
    EXPECT_EQ(WithoutTimings(r.out + r.err), WithoutTimings(step.expected));
  }
  // The walk-through the issue asks for: build, describe, get-state to a
  // safetensors file, load it back, move to float16.
  for (const char* verb :
       {"build", "describe", "get-state", "load-state", "to"}) {
    EXPECT_TRUE(verbs.contains(verb))
        << "the walk-through lost '" << verb << "'";
  }
  bool to_float16 = false;
  for (const ReadmeStep& step : w.steps) {
    to_float16 |= absl::StrContains(step.command, " to ") &&
                  absl::StrContains(step.command, "--dtype float16");
  }
  EXPECT_TRUE(to_float16);
}

// ------------------------------------------------------------------- JSON

TEST_F(CliTest, JsonOutputIsTheResponseProto) {
  std::string spec =
      WriteFile("lin.json", R"({"type": "Linear", "args": [3, 2]})");
  CommandResult r = Cli({"--json", "build", spec, "--name", "json/lin"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(CountLines(r.out), 1);
  EXPECT_THAT(r.out, HasSubstr("\"qualified_type\":"));  // Proto field names.
  auto built = ParseJson<v1::BuildModuleResponse>(r.out);
  EXPECT_EQ(built.module(), "json/lin");
  EXPECT_EQ(built.info().type(), "Linear");
  ASSERT_EQ(built.registrations_size(), 2);
  EXPECT_EQ(built.registrations(0).name(), "weight");
  EXPECT_EQ(built.registrations(0).outcome(), v1::OUTCOME_KEEP);

  // Global options may also follow the command.
  r = Cli({"describe", "json/lin", "--json", "--hashes"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  auto described = ParseJson<v1::GetModuleResponse>(r.out);
  EXPECT_EQ(described.total_bytes(), 32u);
  ASSERT_EQ(described.info().parameters_size(), 2);
  EXPECT_EQ(described.info().parameters(0).tensor().sha256(),
            ContentHash(*State("json/lin").tensors.Find("weight")));
  EXPECT_THAT(described.server_devices(), ::testing::Contains("cpu"));

  r = Cli({"--json", "ls", "--namespace", "json"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  auto listed = ParseJson<v1::ListModulesResponse>(r.out);
  ASSERT_EQ(listed.modules_size(), 1);
  EXPECT_EQ(listed.modules(0).num_parameters(), 8u);
  EXPECT_EQ(listed.modules(0).total_bytes(), 32u);

  std::string file = Path("lin.safetensors");
  r = Cli({"--json", "get-state", "json/lin", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  auto header = ParseJson<v1::StateDictHeader>(r.out);
  ASSERT_EQ(header.entries_size(), 2);
  EXPECT_EQ(header.entries(1).key(), "bias");
  EXPECT_EQ(header.total_bytes(), 32u);

  r = Cli({"--json", "load-state", "json/lin", file});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(ParseJson<v1::LoadStateDictResponse>(r.out).repr(),
            "<All keys matched successfully>");

  r = Cli({"--json", "to", "json/lin", "--dtype", "bfloat16"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  auto moved = ParseJson<v1::MoveModuleResponse>(r.out);
  EXPECT_EQ(moved.info().parameters(0).tensor().dtype(), v1::DTYPE_BFLOAT16);

  r = Cli({"--json", "health"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(ParseJson<grpc::health::v1::HealthCheckResponse>(r.out).status(),
            grpc::health::v1::HealthCheckResponse::SERVING);

  r = Cli({"--json", "eval", "json/lin"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "{}\n");
  r = Cli({"--json", "rm", "json/lin"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "{}\n");

  // Errors stay on stderr: stdout holds JSON or nothing.
  r = Cli({"--json", "describe", "json/lin"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_EQ(r.err, "error: NOT_FOUND: module 'json/lin' does not exist\n");
}

// --------------------------------------------------------------------- ls

TEST_F(CliTest, ListFollowsPagesAndStopsAtTheLimit) {
  for (int i = 0; i < 5; ++i) {
    Build(absl::StrCat("pages/m", i), R"({"type": "Linear", "args": [3, 2]})");
  }
  Build("pages/z", R"({"type": "ReLU"})");
  const std::string header = "MODULE    TYPE    PARAMETERS  BYTES  DEVICES\n";
  auto row = [](int i) {
    return absl::StrCat("pages/m", i, "  Linear           8   32 B  cpu\n");
  };
  // Six modules in pages of two: all of them, in name order.
  CommandResult r = Cli({"ls", "--namespace", "pages", "--page-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, absl::StrCat(header, row(0), row(1), row(2), row(3), row(4),
                                "pages/z   ReLU             0    0 B\n"));
  // A limit that ends inside the second page.
  r = Cli({"ls", "--namespace", "pages", "--page-size", "2", "--limit", "3"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, absl::StrCat(header, row(0), row(1), row(2)));
  r = Cli({"--json", "ls", "--namespace", "pages", "--page-size", "4"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  auto all = ParseJson<v1::ListModulesResponse>(r.out);
  EXPECT_EQ(all.modules_size(), 6);
  EXPECT_THAT(all.next_page_token(), IsEmpty());
  r = Cli({"ls", "--namespace", "nothing-here"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "no modules\n");
}

// ----------------------------------------------------------- rm, train, eval

// --convert-all is torch's module.type(dtype) (MoveModule's convert_all):
// the integer buffer converts too, which to() leaves alone.
TEST_F(CliTest, ToConvertAllIsModuleType) {
  Build("convert/bn", R"({"type": "BatchNorm1d", "args": [3]})");
  // to(): the integer buffer stays as it is.
  CommandResult r = Cli({"to", "convert/bn", "--dtype", "float64"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out,
              HasSubstr("dtypes: float64 (4 tensors), int64 (1 tensor)\n"));

  r = Cli({"to", "convert/bn", "--dtype", "float64", "--convert-all"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out,
            "converted convert/bn\n"
            "dtypes: float64 (5 tensors)\n"
            "devices: cpu (5 tensors)\n");
  EXPECT_EQ(State("convert/bn").tensors.Find("num_batches_tracked")->dtype(),
            DType::kFloat64);

  // An integer dtype while a parameter requires grad: torch's error, and
  // nothing changes.
  r = Cli({"to", "convert/bn", "--dtype", "int32", "--convert-all"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("data set to a tensor that requires gradients "
                               "must be floating point"));
  EXPECT_EQ(State("convert/bn").tensors.Find("weight")->dtype(),
            DType::kFloat64);
}

TEST_F(CliTest, RemoveThenDescribeIsNotFound) {
  Build("rm/gone", R"({"type": "Linear", "args": [2, 2]})");
  CommandResult r = Cli({"rm", "rm/gone"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "deleted rm/gone\n");
  v1::GetModuleRequest get;
  get.set_module("rm/gone");
  EXPECT_THAT(client_->GetModule(get), StatusIs(absl::StatusCode::kNotFound));

  r = Cli({"describe", "rm/gone"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_EQ(r.err, "error: NOT_FOUND: module 'rm/gone' does not exist\n");
  r = Cli({"rm", "rm/gone"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_EQ(r.err, "error: NOT_FOUND: module 'rm/gone' does not exist\n");

  // A name without a namespace is in "default".
  Build("gone2", R"({"type": "ReLU"})");
  r = Cli({"rm", "gone2"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "deleted default/gone2\n");
}

TEST_F(CliTest, TrainAndEvalSetTheFlagOnTheWholeTree) {
  Build("modes/net", kMlpSpec);
  v1::GetModuleRequest get;
  get.set_module("modes/net");
  CommandResult r = Cli({"eval", "modes/net"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "modes/net: eval mode\n");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse d,
                                  client_->GetModule(get));
  EXPECT_FALSE(d.info().training());
  EXPECT_FALSE(d.info().children(1).module().training());
  r = Cli({"describe", "modes/net"});
  EXPECT_THAT(r.out, StartsWith("modes/net: Sequential() [eval]\n"
                                "  0: Linear(in_features=784, "
                                "out_features=256) [eval]\n"));
  r = Cli({"train", "modes/net"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "modes/net: training mode\n");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(d, client_->GetModule(get));
  EXPECT_TRUE(d.info().children(1).module().training());
}

// ------------------------------------------------------------- help, usage

TEST_F(CliTest, EveryCommandHasHelp) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> commands =
      {{"build",
        {"SPEC.json", "--name", "--seed", "--device", "--dtype",
         "--all-or-nothing"}},
       {"ls", {"--namespace", "--limit", "--page-size"}},
       {"describe", {"MODULE", "--path", "--hashes"}},
       {"rm", {"MODULE"}},
       {"get-state",
        {"MODULE", "-o, --output FILE", "--prefix", "--glob", "--dtype",
         "--chunk-kib"}},
       {"load-state",
        {"MODULE", "FILE.safetensors", "--strict", "--no-strict", "--no-atomic",
         "--assign", "--chunk-kib"}},
       {"to", {"MODULE", "--device", "--dtype", "--convert-all"}},
       {"train", {"MODULE"}},
       {"eval", {"MODULE"}},
       {"health", {}},
       {"subscribers", {"release", "NAME", "--force"}}};
  CommandResult global = Bare({"--help"});
  ASSERT_EQ(global.exit_code, 0) << Show(global);
  EXPECT_THAT(global.out, StartsWith("Usage: modelstatectl [global options] "
                                     "<command> [arguments] [options]\n"));
  for (const auto& [command, words] : commands) {
    SCOPED_TRACE(command);
    EXPECT_THAT(global.out, HasSubstr("\n  " + command + " "));
    for (const char* help : {"--help", "-h"}) {
      // No server is needed (none is given or contacted).
      CommandResult r = Bare({command, help});
      ASSERT_EQ(r.exit_code, 0) << Show(r);
      EXPECT_THAT(r.err, IsEmpty());
      EXPECT_THAT(r.out, StartsWith("Usage: modelstatectl [global options] " +
                                    command));
      for (const std::string& word : words) {
        EXPECT_THAT(r.out, HasSubstr(word));
      }
      EXPECT_THAT(r.out, HasSubstr("--server ADDR"));
      EXPECT_THAT(r.out, HasSubstr("\nExample:\n  modelstatectl "));
    }
  }
  // --help wins over missing arguments.
  EXPECT_EQ(Bare({"load-state", "--help"}).exit_code, 0);
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
    std::string see;
  };
  const std::vector<Case> cases = {
      {{}, "no command given", "modelstatectl"},
      {{"bogus"}, "unknown command 'bogus'", "modelstatectl"},
      {{"--bogus", "health"}, "health: unknown option '--bogus'", "health"},
      {{"build"}, "build: missing argument SPEC.json", "build"},
      {{"describe", "a", "b"}, "describe: unexpected argument 'b'", "describe"},
      {{"load-state", "m"},
       "load-state: missing argument FILE.safetensors",
       "load-state"},
      {{"ls", "--hashes"}, "ls: unknown option '--hashes'", "ls"},
      {{"ls", "--limit"}, "ls: option --limit needs a value (N)", "ls"},
      {{"ls", "--limit", "0"},
       "ls: --limit: expected a positive integer, got '0'",
       "ls"},
      // The server's largest page: more is a usage error, not a silently
      // smaller page.
      {{"ls", "--page-size", "1001"},
       "ls: --page-size: expected a positive integer up to 1000, got '1001'",
       "ls"},
      {{"build", "x.json", "--seed", "-1"},
       "build: --seed: expected a non-negative integer, got '-1'",
       "build"},
      {{"to", "m"}, "to: give --device, --dtype or both", "to"},
      {{"to", "m", "--device", "cpu", "--convert-all"},
       "to: --convert-all needs --dtype, every tensor's new dtype",
       "to"},
      {{"get-state", "m"}, "get-state: missing option -o FILE", "get-state"},
      {{"load-state", "m", "f", "--strict", "--no-strict"},
       "load-state: --strict and --no-strict exclude each other",
       "load-state"},
      {{"--progress", "sometimes", "health"},
       "health: --progress: expected auto, always or never, got 'sometimes'",
       "health"},
      {{"health", "--timeout", "0"},
       "health: --timeout: expected a positive number of seconds, got '0'",
       "health"},
      {{"--json=yes", "health"}, "health: --json: takes no value", "health"},
      // CLI11 gives "true" for a bare flag too; it must not pass as one.
      {{"--json=true", "health"}, "health: --json: takes no value", "health"},
      {{"health", "--json=false"}, "health: --json: takes no value", "health"},
      {{"subscribe", "--interactive", "--priority", "abc"},
       "subscribe: --priority: expected an integer from -2147483648 to "
       "2147483647, got 'abc'",
       "subscribe"},
      {{"subscribe", "--interactive", "--mode", "bogus"},
       "subscribe: --mode: expected intercept, observe or dry-run, got "
       "'bogus'",
       "subscribe"},
      {{"subscribe", "--interactive", "--kinds", "parameter,bogus"},
       "subscribe: --kinds: expected parameter, buffer or module, got 'bogus' "
       "in 'parameter,bogus'",
       "subscribe"},
      {{"get-state", "m", "-o", "x.safetensors", "--chunk-kib", "999999999999"},
       "get-state: --chunk-kib: expected a non-negative integer up to "
       "4194303, got '999999999999'",
       "get-state"},
      {{"load-state", "m", "x.safetensors", "--chunk-kib", "4194304"},
       "load-state: --chunk-kib: expected a positive integer up to 4194303, "
       "got '4194304'",
       "load-state"},
      {{"get-state", "m", "-o", ""},
       "get-state: --output: expected a file name, got ''",
       "get-state"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    CommandResult r = Cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << Show(r);
    EXPECT_THAT(r.out, IsEmpty());
    std::string see = c.see == "modelstatectl"
                          ? "see modelstatectl --help\n"
                          : "see modelstatectl " + c.see + " --help\n";
    EXPECT_EQ(r.err, "error: " + c.error + "\n" + see);
  }
}

// ---------------------------------------------------------- server errors

TEST_F(CliTest, ServerErrorsExitOneWithTheCodeName) {
  Build("errors/lin", R"({"type": "Linear", "args": [2, 2]})");
  std::string relu = WriteFile("relu.json", R"({"type": "ReLU"})");
  struct Case {
    std::vector<std::string> args;
    std::string error;  // The start of stderr.
  };
  const std::vector<Case> cases = {
      {{"describe", "errors/nope"},
       "error: NOT_FOUND: module 'errors/nope' does not exist\n"},
      {{"describe", "errors/lin", "--path", "encoder"}, "error: NOT_FOUND: "},
      {{"build", relu, "--name", "errors/lin"}, "error: ALREADY_EXISTS: "},
      {{"build", relu, "--name", "a/b/c"}, "error: INVALID_ARGUMENT: module: "},
      {{"build", relu, "--name", "errors/r", "--dtype", "int64"},
       "error: INVALID_ARGUMENT: "},
      {{"to", "errors/lin", "--dtype", "int32"},
       "error: INVALID_ARGUMENT: nn.Module.to only accepts floating point or "
       "complex dtypes, but got desired dtype=torch.int32\n"},
      {{"to", "errors/lin", "--device", "tpu"},
       "error: INVALID_ARGUMENT: device: Invalid device 'tpu'"},
      {{"train", "errors/nope"}, "error: NOT_FOUND: "},
      {{"get-state", "errors/lin", "-o", Path("x.safetensors"), "--dtype",
        "float17"},
       "error: INVALID_ARGUMENT: dtype: Unknown dtype 'float17'"},
      {{"get-state", "errors/lin", "-o", Path("x.safetensors"), "--chunk-kib",
        "1000000"},
       "error: RESOURCE_EXHAUSTED: chunk_bytes: "},
      {{"get-state", "errors/lin", "-o", Path("no/such/dir/x.safetensors")},
       "error: "},
      {{"load-state", "errors/lin", Path("missing.safetensors")},
       "error: NOT_FOUND: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    CommandResult r = Cli(c.args);
    EXPECT_EQ(r.exit_code, 1) << Show(r);
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, StartsWith(c.error));
  }
  EXPECT_FALSE(std::filesystem::exists(Path("x.safetensors")));

  // A server that is not there.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);  // Nothing listens on this port now.
  CommandResult r = Bare({"health", "--timeout", "5", "--server",
                          absl::StrCat("127.0.0.1:", ntohs(address.sin_port))});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, StartsWith("error: UNAVAILABLE: "));
}

// A client certificate without its key (or without --tls-ca) is a usage
// error, found when parsing; a --tls-ca file that is not PEM is named,
// without gRPC's log lines.
TEST_F(CliTest, TlsOptionsAreCheckedBeforeConnecting) {
  std::string pem = WriteFile("c.pem", "-----BEGIN CERTIFICATE-----\n");
  CommandResult r = Cli({"--tls-cert", pem, "health"});
  EXPECT_EQ(r.exit_code, 2) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: health: --tls-cert requires --tls-"));
  r = Cli({"--tls-ca", pem, "--tls-key", pem, "health"});
  EXPECT_EQ(r.exit_code, 2) << Show(r);
  EXPECT_EQ(r.err,
            "error: health: --tls-key requires --tls-cert\n"
            "see modelstatectl health --help\n");
  std::string text = WriteFile("notes.txt", "not a certificate\n");
  r = Cli({"--tls-ca", text, "health"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_EQ(r.err, "error: INVALID_ARGUMENT: --tls-ca: " + text +
                       ": not PEM (no '-----BEGIN CERTIFICATE-----' line)\n");
}

// ------------------------------------------------------------- spec files

TEST_F(CliTest, MalformedSpecFilesAreInvalidArgument) {
  std::string unknown =
      WriteFile("unknown.json", R"({"type": "Linear", "argz": [3, 2]})");
  CommandResult r = Cli({"build", unknown, "--name", "specs/a"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, StartsWith("error: INVALID_ARGUMENT: " + unknown + ": "));
  EXPECT_THAT(r.err, HasSubstr("argz"));
  EXPECT_EQ(CountLines(r.err), 1);

  std::string truncated = WriteFile("truncated.json", R"({"type": "Linear",)");
  r = Cli({"build", truncated, "--name", "specs/a"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err,
              StartsWith("error: INVALID_ARGUMENT: " + truncated + ": "));
  EXPECT_EQ(CountLines(r.err), 1) << r.err;

  std::string wrong_type = WriteFile(
      "wrong_type.json", R"({"spec": {"type": "ReLU"}, "seed": "many"})");
  r = Cli({"build", wrong_type, "--name", "specs/a"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err,
              StartsWith("error: INVALID_ARGUMENT: " + wrong_type + ": "));

  // Well-formed JSON that the server rejects, naming the spec field.
  std::string bad_args =
      WriteFile("bad_args.json", R"({"type": "Linear", "args": [2]})");
  r = Cli({"build", bad_args, "--name", "specs/a"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("missing 1 required positional"));

  r = Cli({"build", Path("absent.json")});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_EQ(r.err, "error: NOT_FOUND: " + Path("absent.json") +
                       ": No such file or directory\n");
  v1::GetModuleRequest get;
  get.set_module("specs/a");
  EXPECT_THAT(client_->GetModule(get), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CliTest, SpecFileFormsAndOverrides) {
  // A BuildModuleRequest file carries its own name, seed and dtype.
  std::string request = WriteFile("request.json", R"({
      "module": "forms/req", "seed": 3, "dtype": "float64",
      "spec": {"type": "Linear", "args": [3, 2]}})");
  CommandResult r = Cli({"build", request});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out,
            "built forms/req (Linear): 2 parameters (8 elements, 64 bytes), "
            "0 buffers\n");
  // Options override the file.
  r = Cli({"build", request, "--name", "forms/req32", "--dtype", "float32",
           "--seed", "4"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out,
            "built forms/req32 (Linear): 2 parameters (8 elements, 32 bytes), "
            "0 buffers\n");

  // A bare ModuleSpec is named after the file; the seed decides the values.
  std::string bare =
      WriteFile("seeded.json", R"({"type": "Linear", "args": [5, 4]})");
  r = Cli({"build", bare, "--seed", "7"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out, StartsWith("built default/seeded (Linear): "));
  ASSERT_EQ(
      Cli({"build", bare, "--name", "forms/seed7", "--seed", "7"}).exit_code,
      0);
  ASSERT_EQ(Cli({"build", bare, "--name", "forms/seed8", "--seed=8"}).exit_code,
            0);
  ExpectSameState(State("default/seeded"), State("forms/seed7"));
  EXPECT_FALSE(TensorsEqual(*State("forms/seed7").tensors.Find("weight"),
                            *State("forms/seed8").tensors.Find("weight")));

  // On meta: sizes without storage.
  r = Cli({"build", bare, "--name", "forms/meta", "--device", "meta"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  r = Cli({"describe", "forms/meta"});
  EXPECT_THAT(r.out, HasSubstr("\n  weight  float32[4, 5]  meta  80 B  "
                               "requires_grad\n"));
}

// ------------------------------------------------------------- load-state

TEST_F(CliTest, LoadStateOfAWrongShapeFailsAndChangesNothing) {
  Build("shape/lin", R"({"type": "Linear", "args": [4, 3]})");
  StateDict before = State("shape/lin");
  StateDict wrong;
  wrong.tensors.Set("weight", Filled(DType::kFloat32, {2, 4}, 1.0));
  wrong.tensors.Set("bias", Filled(DType::kFloat32, {3}, 1.0));
  std::string file = Path("wrong.safetensors");
  ASSERT_THAT(WriteSafetensorsFile(file, wrong), IsOk());
  for (const char* strict : {"--strict", "--no-strict"}) {
    CommandResult r = Cli({"load-state", "shape/lin", file, strict});
    EXPECT_EQ(r.exit_code, 1) << Show(r);
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, StartsWith("error: FAILED_PRECONDITION: Error(s) in "
                                  "loading state_dict for Linear:\n"));
    EXPECT_THAT(r.err,
                HasSubstr("size mismatch for weight: copying a param with "
                          "shape torch.Size([2, 4]) from checkpoint, the shape "
                          "in current model is torch.Size([3, 4])."));
    ExpectSameState(State("shape/lin"), before);
  }
}

TEST_F(CliTest, NoStrictReportsIncompatibleKeys) {
  Build("keys/lin", R"({"type": "Linear", "args": [4, 3]})");
  StateDict before = State("keys/lin");
  StateDict partial;
  partial.tensors.Set("weight", Filled(DType::kFloat32, {3, 4}, 0.5));
  partial.tensors.Set("scale", Filled(DType::kFloat32, {1}, 2.0));
  std::string file = Path("partial.safetensors");
  ASSERT_THAT(WriteSafetensorsFile(file, partial), IsOk());

  CommandResult r = Cli({"load-state", "keys/lin", file});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_EQ(r.err,
            "error: FAILED_PRECONDITION: Error(s) in loading state_dict for "
            "Linear:\n\tMissing key(s) in state_dict: \"bias\". \n\tUnexpected "
            "key(s) in state_dict: \"scale\". \n");
  ExpectSameState(State("keys/lin"), before);

  r = Cli({"load-state", "keys/lin", file, "--no-strict", "--chunk-kib", "1"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out,
              StartsWith("_IncompatibleKeys(missing_keys=['bias'], "
                         "unexpected_keys=['scale'])\nstreamed 2 tensors, "
                         "52 bytes from "));
  StateDict after = State("keys/lin");
  EXPECT_TRUE(TensorsEqual(*after.tensors.Find("weight"),
                           Filled(DType::kFloat32, {3, 4}, 0.5)));
  EXPECT_TRUE(
      TensorsEqual(*after.tensors.Find("bias"), *before.tensors.Find("bias")));
}

// -------------------------------------------------------------- get-state

TEST_F(CliTest, GetStateConvertsAndFilters) {
  Build("half/net", kMlpSpec, 5);
  StateDict server = State("half/net");
  std::string file = Path("half.safetensors");
  CommandResult r = Cli({"get-state", "half/net", "-o", file, "--dtype",
                         "float16", "--chunk-kib", "7"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out, StartsWith("wrote 9 tensors, 409,116 bytes to "));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict half, ReadSafetensorsFile(file));
  ASSERT_EQ(half.tensors.Keys(), server.tensors.Keys());
  for (const auto& item : server.tensors) {
    DType want =
        IsFloatingPoint(item.value.dtype()) ? DType::kFloat16 : DType::kInt64;
    const Tensor& got = *half.tensors.Find(item.key);
    EXPECT_EQ(got.dtype(), want) << item.key;
    EXPECT_TRUE(TensorsEqual(got, *item.value.To(Device::Cpu(), want)))
        << item.key;
  }
  // The server's own state is unchanged.
  EXPECT_EQ(State("half/net").tensors.Find("0.weight")->dtype(),
            DType::kFloat32);

  std::string weights = Path("weights.safetensors");
  r = Cli({"get-state", "half/net", "--output", weights, "--prefix", "1.",
           "--glob", "*running*"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out, StartsWith("wrote 2 tensors, 2,048 bytes to "));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict some, ReadSafetensorsFile(weights));
  EXPECT_THAT(some.tensors.Keys(),
              ElementsAre("1.running_mean", "1.running_var"));
}

// ---------------------------------------------------------------- forward

TEST_F(CliTest, ForwardRunsTheModuleOnAFilesTensors) {
  const std::string spec = R"({"type": "Linear", "args": [3, 2]})";
  Build("fwd/lin", spec, 5);
  StateDict inputs;
  inputs.tensors.Set("input0", Filled(DType::kFloat32, {4, 3}, 0.5));
  const std::string in = Path("x.safetensors");
  ASSERT_THAT(WriteSafetensorsFile(in, inputs), IsOk());
  const std::string out = Path("y.safetensors");
  CommandResult r = Cli({"forward", "fwd/lin", "-i", in, "-o", out, "--eval"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.out, StartsWith("wrote 1 output to "));
  EXPECT_THAT(r.out, HasSubstr("output0: float32[4, 2] on cpu"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict got, ReadSafetensorsFile(out));
  std::shared_ptr<Module> local = modelstate::testing::LocalBuild(spec, 5);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::vector<Tensor> want,
      Forward(*local, {*inputs.tensors.Find("input0")}));
  EXPECT_TRUE(TensorsEqual(*got.tensors.Find("output0"), want[0]));

  StateDict wrong;
  wrong.tensors.Set("x", Filled(DType::kFloat32, {4, 3}, 0.5));
  ASSERT_THAT(WriteSafetensorsFile(in, wrong), IsOk());
  r = Cli({"forward", "fwd/lin", "-i", in, "-o", out});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("is not named input0"));
  inputs.tensors.Set("input0", Filled(DType::kFloat32, {4, 5}, 0.5));
  ASSERT_THAT(WriteSafetensorsFile(in, inputs), IsOk());
  r = Cli({"forward", "fwd/lin", "-i", in, "-o", out, "--eval"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: mat1 and mat2 shapes"));
}

TEST_F(CliTest, HashTokenPrintsTheSha256OfTheToken) {
  const std::string token = WriteFile("t.token", "  s3cret-token\n");
  CommandResult r = Bare({"hash-token", token});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, Sha256Hex("s3cret-token") + "\n");
  r = Bare({"hash-token", WriteFile("empty.token", "\n")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the token is empty"));
}

// --------------------------------------------------------------- progress

TEST_F(CliTest, ProgressBarOnTransfersLongerThanASecond) {
  Build("progress/lin", R"({"type": "Linear", "args": [512, 512]})");
  std::string file = Path("progress.safetensors");
  auto expect_bar = [](const CommandResult& r) {
    EXPECT_EQ(r.exit_code, 0) << Show(r);
    EXPECT_THAT(r.err, StartsWith("\r["));
    EXPECT_THAT(r.err, HasSubstr("%"));
    EXPECT_THAT(r.err, HasSubstr("] 100%  1.0 MiB/1.0 MiB  "));
    // The last redraw may be padded with blanks over a longer earlier line.
    ASSERT_THAT(r.err, EndsWith("\n"));
    EXPECT_THAT(std::string(absl::StripTrailingAsciiWhitespace(r.err)),
                EndsWith("/s"));
    EXPECT_EQ(CountLines(r.err), 1);
  };
  CommandResult r;
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1300));
    r = Cli({"get-state", "progress/lin", "-o", file, "--chunk-kib", "16",
             "--progress", "always"});
  }
  expect_bar(r);
  EXPECT_THAT(r.out, StartsWith("wrote 2 tensors, 1,050,624 bytes to "));
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1300));
    r = Cli({"load-state", "progress/lin", file, "--chunk-kib", "1",
             "--progress=always"});
  }
  expect_bar(r);
  // auto: stderr is a pipe here, not a terminal.
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1300));
    r = Cli({"get-state", "progress/lin", "-o", file});
  }
  EXPECT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.err, IsEmpty());
  // A quick transfer stays quiet even with --progress always.
  r = Cli({"get-state", "progress/lin", "-o", file, "--progress", "always"});
  EXPECT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(r.err, IsEmpty());
}

TEST_F(CliTest, TimeoutBoundsUnaryCalls) {
  CommandResult r;
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1500));
    r = Cli({"--timeout", "0.3", "health"});
  }
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: DEADLINE_EXCEEDED: "));
}

// Transfers have their own deadline: --transfer-timeout bounds get-state
// and load-state, and a short --timeout for unary calls does not.
TEST_F(CliTest, TransferTimeoutBoundsStreamsAndTimeoutDoesNot) {
  Build("deadline/lin", R"({"type": "Linear", "args": [64, 64]})");
  std::string file = Path("deadline.safetensors");
  CommandResult r;
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1500));
    r = Cli(
        {"--transfer-timeout", "0.3", "get-state", "deadline/lin", "-o", file});
  }
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: DEADLINE_EXCEEDED: "));
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1500));
    r = Cli({"--timeout", "0.3", "get-state", "deadline/lin", "-o", file});
  }
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  {
    ServerPause pause(server_->pid(), std::chrono::milliseconds(1500));
    r = Cli({"load-state", "deadline/lin", file, "--transfer-timeout=0.3"});
  }
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: DEADLINE_EXCEEDED: "));
  r = Cli(
      {"--transfer-timeout", "-1", "get-state", "deadline/lin", "-o", file});
  EXPECT_EQ(r.exit_code, 2) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("--transfer-timeout: expected a positive "
                               "number of seconds, got '-1'"));
  r = Bare({"--help"});
  EXPECT_THAT(r.out, HasSubstr("--transfer-timeout SECONDS"));
}

// The server has no remote hooks yet to block or replace a registration;
// the lines `build` prints for them are checked on a response made here.
TEST(CliFormatTest, BuildListsBlockedAndReplacedRegistrations) {
  v1::BuildModuleResponse response;
  response.set_module("team/mlp");
  response.mutable_info()->set_type("Sequential");
  v1::ChildInfo* child = response.mutable_info()->add_children();
  child->set_name("0");
  child->mutable_module()->set_type("Linear");
  v1::EntryInfo* bias = child->mutable_module()->add_parameters();
  bias->set_name("bias");
  bias->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT16);
  bias->mutable_tensor()->add_shape(4);
  bias->mutable_tensor()->set_nbytes(8);
  auto report = [&](const std::string& path, v1::EntryKind kind,
                    const std::string& name, v1::Outcome outcome,
                    const std::string& reason) {
    v1::RegistrationReport* r = response.add_registrations();
    r->set_path(path);
    r->set_kind(kind);
    r->set_action(v1::REGISTRATION_ACTION_REGISTER);
    r->set_name(name);
    r->set_outcome(outcome);
    r->set_reason(reason);
  };
  report("0", v1::ENTRY_KIND_PARAMETER, "weight", v1::OUTCOME_BLOCK,
         "rejected by policy: frozen (subscriber ci-policy)");
  report("0", v1::ENTRY_KIND_PARAMETER, "bias", v1::OUTCOME_REPLACE,
         "cast to float16 (subscriber dtype-guard)");
  report("", v1::ENTRY_KIND_MODULE, "0", v1::OUTCOME_KEEP, "");
  EXPECT_EQ(cli::FormatBuildResponse(response),
            "built team/mlp (Sequential): 1 parameter (4 elements, 8 bytes), "
            "0 buffers\n"
            "blocked   parameter  0.weight  rejected by policy: frozen "
            "(subscriber ci-policy)\n"
            "replaced  parameter  0.bias    cast to float16 (subscriber "
            "dtype-guard)\n"
            "1 of 3 registrations blocked, 1 replaced by hooks\n");
}

// ---------------------------------------------------------------- cluster

// This server has no --etcd_endpoints. Without ClusterService, gRPC's
// UNIMPLEMENTED has no message; every cluster command says what
// `audit query --cluster` says.
TEST_F(CliTest, ClusterCommandsOnAServerOnItsOwnSaySo) {
  const std::string error =
      "error: INVALID_ARGUMENT: cluster: this server is not a cluster member "
      "(--etcd_endpoints)\n";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"cluster", "status"},
           {"cluster", "move", "team/mlp", "replica-2"},
           {"audit", "verify", "--cluster"},
           {"audit", "query", "--cluster", "--limit", "1"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    CommandResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 1) << Show(r);
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_EQ(r.err, error);
  }
}

// ------------------------------------------------------------- interrupts

// Ctrl-C or SIGTERM in the middle of get-state removes the partial
// FILE.tmp.PID.N and ends the CLI by that signal (a shell's 130 or 143);
// the target is never written.
TEST_F(CliTest, InterruptedGetStateLeavesNoTemporaryFile) {
  // 16 MiB in 16 KiB messages: a thousand steps to interrupt.
  Build("interrupt/lin", R"({"type": "Linear", "args": [2048, 2048]})");
  const std::string file = Path("interrupted.safetensors");
  auto temporaries = [&] {
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      std::string name = entry.path().filename().string();
      if (absl::StartsWith(name, "interrupted.safetensors")) {
        found.push_back(name);
      }
    }
    return found;
  };
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    BackgroundProcess cli({MODELSTATE_CLI_BINARY, "--server",
                           server_->address(), "--no-shared-memory",
                           "get-state", "interrupt/lin", "-o", file,
                           "--chunk-kib", "16"});
    ASSERT_TRUE(cli.started());
    // Once the temporary file exists, the server stops so that the
    // transfer cannot finish before the signal lands.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (temporaries().empty() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_THAT(temporaries(),
                ElementsAre(StartsWith("interrupted.safetensors.tmp.")));
    {
      ServerPause pause(server_->pid(), std::chrono::milliseconds(1000));
      cli.Kill(sig);
      EXPECT_EQ(cli.Wait(), 128 + sig);
    }
    EXPECT_THAT(temporaries(), IsEmpty());
  }
  // Uninterrupted, the same command writes the file.
  CommandResult r = Cli({"get-state", "interrupt/lin", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_THAT(temporaries(), ElementsAre("interrupted.safetensors"));
}

// ----------------------------------------------------------------- health

TEST_F(CliTest, SubscribersReleaseEndsAConnectedSubscriberOnlyWhenForced) {
  v1::Subscription s;
  s.set_name("cli-held");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<client::Subscriber> held,
      client::Subscriber::Start(*client_, s, [](const v1::HookEventProto& e) {
        v1::HookAnswer a;
        a.set_event_id(e.event_id());
        return a;
      }));
  CommandResult r = Cli({"subscribers", "release", "cli-held"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: FAILED_PRECONDITION: subscriber "
                                "'cli-held' is connected"));
  r = Cli({"subscribers", "release", "cli-held", "--force"});
  EXPECT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "released cli-held; its subscriber was disconnected\n");
  EXPECT_THAT(held->Wait(), StatusIs(absl::StatusCode::kAborted));
  r = Cli({"subscribers", "release", "cli-held"});
  EXPECT_EQ(r.exit_code, 1) << Show(r);
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: name: "));
  EXPECT_EQ(Cli({"subscribers", "drop", "cli-held"}).exit_code, 2);
}

TEST_F(CliTest, HealthPrintsServing) {
  CommandResult r = Cli({"health"});
  ASSERT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "SERVING\n");
  EXPECT_THAT(r.err, IsEmpty());
  // The server from the environment, and --server=ADDR after the command.
  r = Bare({"health"}, {"MODELSTATE_SERVER=" + server_->address()});
  EXPECT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "SERVING\n");
  r = Bare({"health", "--server=" + server_->address()});
  EXPECT_EQ(r.exit_code, 0) << Show(r);
  EXPECT_EQ(r.out, "SERVING\n");
}

}  // namespace
}  // namespace modelstate
