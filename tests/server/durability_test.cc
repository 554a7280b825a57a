// Integration tests of durability: the real server is stopped (often with
// SIGKILL, at random moments of large loads and builds) and started again on
// the same data directory; what it serves afterwards must be exactly what
// it acknowledged, never a torn mix, with the audit chain intact.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/golden_models.h"
#include "tests/testing/proc_status.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::Filled;
using ::modelstate::testing::GoldenModelSpecs;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::LiftFileSizeLimit;
using ::modelstate::testing::LimitFileSize;
using ::modelstate::testing::LocalBuild;
using ::modelstate::testing::ParseJson;
using ::modelstate::testing::ProcStatusBytes;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Everything a client can see of the hosted modules.
struct Observed {
  std::vector<std::string> names;
  std::map<std::string, v1::GetModuleResponse> described;
  std::map<std::string, StateDict> states;
};

Observed Observe(client::ModelStateClient& client) {
  Observed seen;
  v1::ListModulesRequest list;
  list.set_page_size(1000);
  absl::StatusOr<v1::ListModulesResponse> listed = client.ListModules(list);
  EXPECT_THAT(listed, IsOk());
  if (!listed.ok()) return seen;
  for (const auto& m : listed->modules()) {
    seen.names.push_back(m.module());
    v1::GetModuleRequest get;
    get.set_module(m.module());
    get.set_with_hashes(true);
    absl::StatusOr<v1::GetModuleResponse> described = client.GetModule(get);
    EXPECT_THAT(described, IsOk()) << m.module();
    if (described.ok()) seen.described[m.module()] = *described;
    absl::StatusOr<StateDict> state = client.GetStateDict(m.module());
    EXPECT_THAT(state, IsOk()) << m.module();
    if (state.ok()) seen.states[m.module()] = *std::move(state);
  }
  return seen;
}

void ExpectSameObserved(const Observed& got, const Observed& want) {
  ASSERT_EQ(got.names, want.names);
  for (const std::string& name : want.names) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        got.described.at(name), want.described.at(name)))
        << "got " << got.described.at(name).DebugString() << "\nwant "
        << want.described.at(name).DebugString();
    ExpectSameState(got.states.at(name), want.states.at(name));
  }
}

v1::VerifyAuditResponse VerifyAudit(client::ModelStateClient& client) {
  grpc::ClientContext context;
  v1::VerifyAuditResponse response;
  grpc::Status status =
      client.stub().VerifyAudit(&context, v1::VerifyAuditRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

std::vector<v1::AuditRecordProto> AuditRecords(client::ModelStateClient& client,
                                               const std::string& type) {
  grpc::ClientContext context;
  v1::QueryAuditRequest query;
  query.mutable_filter()->set_type(type);
  query.set_limit(10000);
  v1::QueryAuditResponse response;
  grpc::Status status = client.stub().QueryAudit(&context, query, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return {response.records().begin(), response.records().end()};
}

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(); }

  // (Re)starts the server on the same data directory.
  void Restart() {
    client_.reset();
    absl::Status started = server_.Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = server_.NewClient();
    ASSERT_NE(client_, nullptr);
  }
  void KillAndRestart() {
    server_.Stop(SIGKILL);
    Restart();
  }
  // A graceful stop. The client disconnects first: an idle C++ channel
  // holds the server's shutdown for the whole grace period.
  void StopGracefully() {
    client_.reset();
    server_.Stop(SIGTERM);
  }

  TestServer server_;
  std::unique_ptr<client::ModelStateClient> client_;
};

TEST_F(DurabilityTest, AKilledServerComesBackWithEveryAcknowledgedChange) {
  for (const auto& [case_name, json] : GoldenModelSpecs()) {
    ASSERT_THAT(
        client_->BuildModule(BuildRequest("golden/" + case_name, json, 11)),
        IsOk());
  }
  // A module assembled entry by entry.
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "custom/m", R"({"type": "Custom", "custom": true})")),
              IsOk());
  ASSERT_THAT(client_->RegisterParameter(ParseJson<v1::RegisterTensorRequest>(
                  R"({"module": "custom/m", "name": "frozen",
                      "init": {"shape": [3, 2], "dtype": "float64",
                               "init": {"kind": "normal"}},
                      "requires_grad": false, "seed": 5})")),
              IsOk());
  ASSERT_THAT(client_->RegisterBuffer(ParseJson<v1::RegisterTensorRequest>(
                  R"({"module": "custom/m", "name": "scratch",
                      "init": {"shape": [4], "dtype": "int16",
                               "init": {"kind": "constant", "a": 7}},
                      "persistent": false})")),
              IsOk());
  ASSERT_THAT(client_->RegisterBuffer(ParseJson<v1::RegisterTensorRequest>(
                  R"({"module": "custom/m", "name": "gone", "none": true})")),
              IsOk());
  ASSERT_THAT(
      client_->RegisterSubmodule(ParseJson<v1::RegisterSubmoduleRequest>(
          R"({"module": "custom/m", "name": "lin",
                      "spec": {"type": "Linear", "args": [2, 3]}})")),
      IsOk());
  ASSERT_THAT(
      client_->RegisterSubmodule(ParseJson<v1::RegisterSubmoduleRequest>(
          R"({"module": "custom/m", "name": "again",
                      "existing_path": "lin"})")),
      IsOk());
  // Changes of every other kind.
  v1::MoveModuleRequest move;
  move.set_module("golden/Sequential_mlp");
  move.set_dtype("float16");
  ASSERT_THAT(client_->MoveModule(move), IsOk());
  ASSERT_THAT(client_->SetTraining("golden/TinyModel", false), IsOk());
  StateDict values;
  values.tensors.Set("weight", Filled(DType::kFloat32, {5, 5}, 0.125));
  values.tensors.Set("bias", Filled(DType::kFloat32, {5}, -2));
  ASSERT_THAT(client_->LoadStateDict("golden/Linear_5_5", values), IsOk());
  ASSERT_THAT(client_->DeleteModule("golden/Conv2d_3_8_3"), IsOk());

  const Observed before = Observe(*client_);
  ASSERT_THAT(before.names, SizeIs(GoldenModelSpecs().size()));
  KillAndRestart();
  ExpectSameObserved(Observe(*client_), before);
  EXPECT_THAT(
      server_.Log(),
      HasSubstr(absl::StrCat("restored ", before.names.size(), " modules")));

  // The chain goes on across the restart.
  v1::VerifyAuditResponse verified = VerifyAudit(*client_);
  EXPECT_TRUE(verified.ok()) << verified.problem();
  ASSERT_THAT(client_->DeleteModule("custom/m"), IsOk());
  EXPECT_TRUE(VerifyAudit(*client_).ok());
  EXPECT_GT(VerifyAudit(*client_).records(), verified.records());
  // A clean stop and start changes nothing either.
  const Observed after_delete = Observe(*client_);
  StopGracefully();
  Restart();
  ExpectSameObserved(Observe(*client_), after_delete);
}

// The model the crash test loads into: 8 x Linear(2048, 2048), 128 MiB, so
// that a load spends long enough in each of its phases (streaming, staging,
// fsync, commit) for random kills to land in all of them.
constexpr char kBigSpec[] = R"({"type": "Sequential", "children": [
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}},
    {"spec": {"type": "Linear", "args": [2048, 2048]}}]})";
// What each crash round builds alongside: 2 x Linear(1024, 1024), 8 MiB.
constexpr char kBuiltSpec[] = R"({"type": "Sequential", "children": [
    {"spec": {"type": "Linear", "args": [1024, 1024]}},
    {"spec": {"type": "Linear", "args": [1024, 1024]}}]})";

// Every tensor of `like`'s layout, filled with `value`.
StateDict FilledLike(const StateDict& like, double value) {
  StateDict out;
  for (const auto& item : like.tensors) {
    out.tensors.Set(item.key,
                    Filled(item.value.dtype(), item.value.shape(), value));
  }
  return out;
}

// The single value every element of `sd` holds, or NaN if they differ
// (a torn state).
double UniformValue(const StateDict& sd) {
  double value = std::numeric_limits<double>::quiet_NaN();
  bool first = true;
  for (const auto& item : sd.tensors) {
    const float* data = item.value.data<float>();
    for (int64_t i = 0; i < item.value.numel(); ++i) {
      if (first) {
        value = data[i];
        first = false;
      } else if (data[i] != value) {
        return std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return value;
}

TEST_F(DurabilityTest, KillsDuringLoadsAndBuildsNeverTearAModule) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("crash/big", kBigSpec, 1)),
              IsOk());
  absl::StatusOr<StateDict> layout = client_->GetStateDict("crash/big");
  ASSERT_THAT(layout, IsOk());
  ASSERT_THAT(client_->LoadStateDict("crash/big", FilledLike(*layout, 0)),
              IsOk());
  const StateDict built_want = LocalBuild(kBuiltSpec, 9)->GetStateDict();

  // How long one load takes here, to spread the kills over it.
  auto start = std::chrono::steady_clock::now();
  ASSERT_THAT(client_->LoadStateDict("crash/big", FilledLike(*layout, 1)),
              IsOk());
  const auto load_time = std::chrono::steady_clock::now() - start;
  double committed = 1;

  std::mt19937 random(20261121);
  constexpr int kRounds = 24;
  int new_states = 0;
  int old_states = 0;
  int builds_kept = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const double next = round + 2;
    const StateDict payload = FilledLike(*layout, next);
    const std::string built_name = absl::StrCat("crash/built", round);
    absl::Status load_status;
    absl::Status build_status;
    std::thread loader([&] {
      load_status = client_->LoadStateDict("crash/big", payload).status();
    });
    std::thread builder([&] {
      build_status =
          client_->BuildModule(BuildRequest(built_name, kBuiltSpec, 9))
              .status();
    });
    std::uniform_real_distribution<double> fraction(0.0, 1.3);
    std::this_thread::sleep_for(
        std::chrono::duration_cast<std::chrono::microseconds>(
            load_time * fraction(random)));
    server_.Stop(SIGKILL);
    loader.join();
    builder.join();
    Restart();

    absl::StatusOr<StateDict> big = client_->GetStateDict("crash/big");
    ASSERT_THAT(big, IsOk());
    const double value = UniformValue(*big);
    ASSERT_TRUE(value == committed || value == next)
        << "torn or unknown state: " << value << " (old " << committed
        << ", new " << next << ")";
    if (load_status.ok()) {
      ASSERT_EQ(value, next) << "an acknowledged load was lost";
    }
    (value == next ? new_states : old_states)++;
    committed = value;

    absl::StatusOr<StateDict> built = client_->GetStateDict(built_name);
    if (build_status.ok()) {
      ASSERT_THAT(built, IsOk()) << "an acknowledged build was lost";
    }
    if (built.ok()) {
      ExpectSameState(*built, built_want);
      ++builds_kept;
    } else {
      EXPECT_THAT(built, StatusIs(absl::StatusCode::kNotFound));
    }
    v1::VerifyAuditResponse verified = VerifyAudit(*client_);
    ASSERT_TRUE(verified.ok()) << verified.problem();
  }
  // The kills landed on both sides of the commit.
  EXPECT_GT(new_states, 0);
  EXPECT_GT(old_states, 0);
  RecordProperty("new_states", new_states);
  RecordProperty("old_states", old_states);
  RecordProperty("builds_kept", builds_kept);
  std::cout << "kills: " << kRounds << ", load committed " << new_states
            << ", load lost (unacknowledged) " << old_states << ", builds kept "
            << builds_kept << "\n";
}

fs::path ModuleDir(const TestServer& server, const std::string& ns,
                   const std::string& name) {
  return server.data_dir() / "modules" / ns / name;
}

// Flips the lowest bit of the byte 100 bytes before the end of `path`
// (in the tensor data, which the per-tensor CRCs cover).
void FlipBitNearEnd(const fs::path& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-100, std::ios::end);
  char c;
  f.read(&c, 1);
  c ^= 1;
  f.seekp(-100, std::ios::end);
  f.write(&c, 1);
}

// Each tensor's SHA-256, by key.
std::map<std::string, std::string> Hashes(const StateDict& state) {
  std::map<std::string, std::string> out;
  for (const auto& item : state.tensors) {
    out[item.key] = ContentHash(item.value);
  }
  return out;
}

TEST_F(DurabilityTest, ARestartedServerHostsMoreThanItsMemoryLimit) {
  // 256 MiB hosted in four modules.
  constexpr uint64_t kMiB = 1 << 20;
  constexpr int kModules = 4;
  constexpr uint64_t kHosted = kModules * (4096 * 4096 + 4096) * 4ull;
  std::map<std::string, std::map<std::string, std::string>> want;
  for (int i = 0; i < kModules; ++i) {
    const std::string name = absl::StrCat("big/m", i);
    ASSERT_THAT(client_->BuildModule(BuildRequest(
                    name, R"({"type": "Linear", "args": [4096, 4096]})", i)),
                IsOk());
    absl::StatusOr<StateDict> state = client_->GetStateDict(name);
    ASSERT_THAT(state, IsOk());
    want[name] = Hashes(*state);
  }
  // The server's own memory with everything served once, without a
  // limit: threads, buffers and the allocator's arenas included.
  StopGracefully();
  Restart();
  for (const auto& [name, hashes] : want) {
    ASSERT_THAT(client_->GetStateDict(name), IsOk());
  }
  const uint64_t own = ProcStatusBytes(server_.pid(), "VmData");
  ASSERT_GT(own, 0u);
  StopGracefully();
  // Far less than the hosted bytes on top: a restart that read them into
  // memory could not even start.
  const uint64_t limit = own + 64 * kMiB;
  server_.set_max_data_bytes(limit);
  Restart();
  EXPECT_THAT(server_.Log(), HasSubstr("restored 4 modules"));
  for (const auto& [name, hashes] : want) {
    absl::StatusOr<StateDict> state = client_->GetStateDict(name);
    ASSERT_THAT(state, IsOk()) << name;
    EXPECT_EQ(Hashes(*state), hashes) << name;
  }
  EXPECT_LT(ProcStatusBytes(server_.pid(), "VmData"), limit);
  // What it holds of the bytes is the page cache's, not its own.
  EXPECT_LT(ProcStatusBytes(server_.pid(), "RssAnon"), kHosted / 2);
  server_.set_max_data_bytes(0);
}

TEST_F(DurabilityTest, MappedSavesHostMoreThanTheMemoryLimitWithoutRestarts) {
  constexpr uint64_t kMiB = 1 << 20;
  // The server's own memory once it has built and served a small module.
  StopGracefully();
  server_.set_flags({"--map_saved_bytes"});
  Restart();
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "warm/up", R"({"type": "Linear", "args": [64, 64]})")),
              IsOk());
  ASSERT_THAT(client_->GetStateDict("warm/up"), IsOk());
  const uint64_t own = ProcStatusBytes(server_.pid(), "VmData");
  ASSERT_GT(own, 0u);
  StopGracefully();
  // Room for one 64 MiB module being built, not for the 256 MiB of four:
  // each build's bytes leave process memory once saved.
  server_.set_max_data_bytes(own + 160 * kMiB);
  Restart();
  std::map<std::string, std::map<std::string, std::string>> served;
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("big/m", i);
    ASSERT_THAT(client_->BuildModule(BuildRequest(
                    name, R"({"type": "Linear", "args": [4096, 4096]})", i)),
                IsOk())
        << name;
    absl::StatusOr<StateDict> state = client_->GetStateDict(name);
    ASSERT_THAT(state, IsOk()) << name;
    served[name] = Hashes(*state);
  }
  EXPECT_LT(ProcStatusBytes(server_.pid(), "RssAnon"), 128 * kMiB);
  // A restart serves the same bytes.
  StopGracefully();
  server_.set_max_data_bytes(0);
  Restart();
  for (const auto& [name, hashes] : served) {
    absl::StatusOr<StateDict> state = client_->GetStateDict(name);
    ASSERT_THAT(state, IsOk()) << name;
    EXPECT_EQ(Hashes(*state), hashes) << name;
  }
  server_.set_flags({});
}

TEST_F(DurabilityTest, TheScrubFindsDamageAndItIsNeverServedAgain) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "s/m", R"({"type": "Linear", "args": [64, 16]})", 5)),
              IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "s/other", R"({"type": "Linear", "args": [8, 8]})", 6)),
              IsOk());
  StopGracefully();
  server_.set_flags({"--scrub_interval=200ms"});
  Restart();
  // Served and found intact...
  absl::StatusOr<StateDict> before = client_->GetStateDict("s/m");
  ASSERT_THAT(before, IsOk());
  // ...then damaged on disk under the running server.
  FlipBitNearEnd(ModuleDir(server_, "s", "m") / "data-1.safetensors");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         server_.Log().find("newly found damaged") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(server_.Log(),
              AllOf(HasSubstr("scrub: DATA_LOSS: 'weight': module 's/m'"),
                    HasSubstr("s/m/data-1.safetensors"),
                    HasSubstr("scrub: 1 of 4 storages")));
  EXPECT_THAT(
      client_->GetStateDict("s/m"),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("'weight'"), HasSubstr("module 's/m'"))));
  EXPECT_THAT(client_->GetStateDict("s/other"), IsOk());
  server_.set_flags({});
}

// A data file cut short under a running server (a disk that fails to read
// a page faults the same way): the check that meets the missing bytes, on
// their first read or the scrub's, says DATA_LOSS naming them, and the
// server lives on. Before, the read's SIGBUS killed it.
TEST_F(DurabilityTest, AFileCutShortUnderTheServerIsDataLossNotACrash) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "c/first", R"({"type": "Linear", "args": [256, 256]})", 1)),
              IsOk());
  ASSERT_THAT(
      client_->BuildModule(BuildRequest(
          "c/scrubbed", R"({"type": "Linear", "args": [256, 256]})", 2)),
      IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "c/intact", R"({"type": "Linear", "args": [8, 8]})", 3)),
              IsOk());
  StopGracefully();
  server_.set_flags({"--scrub_interval=300ms"});
  Restart();
  // Read once, and so checked, before its file is cut: the scrub finds it.
  ASSERT_THAT(client_->GetStateDict("c/scrubbed"), IsOk());
  // Data files are numbered in the order they were written.
  const std::vector<std::pair<std::string, std::string>> cut = {
      {"first", "data-1.safetensors"}, {"scrubbed", "data-2.safetensors"}};
  for (const auto& [name, file] : cut) {
    const fs::path data = ModuleDir(server_, "c", name) / file;
    fs::resize_file(data, fs::file_size(data) / 4);
  }
  const auto unreadable = [](const std::string& module,
                             const std::string& file) {
    return StatusIs(absl::StatusCode::kDataLoss,
                    AllOf(HasSubstr("'weight'"),
                          HasSubstr(absl::StrCat("module '", module, "'")),
                          HasSubstr(absl::StrCat(module, "/", file)),
                          HasSubstr("cannot be read from disk")));
  };
  EXPECT_THAT(client_->GetStateDict("c/first"),
              unreadable("c/first", "data-1.safetensors"));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (
      std::chrono::steady_clock::now() < deadline &&
      server_.Log().find("scrub: DATA_LOSS: 'weight': module 'c/scrubbed'") ==
          std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(server_.Log(),
              HasSubstr("scrub: DATA_LOSS: 'weight': module 'c/scrubbed'"));
  EXPECT_THAT(client_->GetStateDict("c/scrubbed"),
              unreadable("c/scrubbed", "data-2.safetensors"));
  // The server is alive and serves what is intact.
  EXPECT_THAT(client_->GetStateDict("c/intact"), IsOk());
  server_.set_flags({});
}

TEST_F(DurabilityTest, DamageIsNamedAtStartOrOnTheReadThatMeetsIt) {
  // Built first, d/bad gets the data file data-1.safetensors.
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "d/bad", R"({"type": "Linear", "args": [16, 16]})", 2)),
              IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "d/good", R"({"type": "Linear", "args": [16, 16]})", 1)),
              IsOk());
  // Built third and fourth: data-3 and data-4, truncated below.
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "d/short", R"({"type": "Linear", "args": [16, 16]})", 3)),
              IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "d/cut", R"({"type": "Linear", "args": [16, 16]})", 4)),
              IsOk());
  absl::StatusOr<StateDict> good = client_->GetStateDict("d/good");
  ASSERT_THAT(good, IsOk());
  StopGracefully();
  // A data file cut in half, and a manifest cut short: both are seen at
  // start-up, which reads every manifest and data file header.
  const fs::path short_data =
      ModuleDir(server_, "d", "short") / "data-3.safetensors";
  fs::resize_file(short_data, fs::file_size(short_data) / 2);
  const fs::path cut_manifest =
      ModuleDir(server_, "d", "cut") / "manifest.json";
  fs::resize_file(cut_manifest, fs::file_size(cut_manifest) - 10);
  // One flipped bit inside the weight: start-up reads no tensor bytes, so
  // the read that meets it finds it.
  FlipBitNearEnd(ModuleDir(server_, "d", "bad") / "data-1.safetensors");
  Restart();
  EXPECT_THAT(server_.Log(),
              AllOf(HasSubstr("not restored: DATA_LOSS: "),
                    HasSubstr("d/short/data-3.safetensors"),
                    HasSubstr("d/cut/manifest.json: not a sealed JSON file"),
                    HasSubstr("restored 2 modules")));
  absl::StatusOr<StateDict> good_after = client_->GetStateDict("d/good");
  ASSERT_THAT(good_after, IsOk());
  ExpectSameState(*good_after, *good);
  const auto names_the_damage =
      AllOf(HasSubstr("'weight'"), HasSubstr("module 'd/bad'"),
            HasSubstr("d/bad/data-1.safetensors"), HasSubstr("CRC-32C"));
  EXPECT_THAT(client_->GetStateDict("d/bad"),
              StatusIs(absl::StatusCode::kDataLoss, names_the_damage));
  // What is intact is still served.
  client::GetStateDictOptions only_bias;
  only_bias.key_prefix = "bias";
  absl::StatusOr<StateDict> bias = client_->GetStateDict("d/bad", only_bias);
  ASSERT_THAT(bias, IsOk());
  EXPECT_EQ(bias->tensors.size(), 1u);
  v1::ForwardRequest forward;
  forward.set_module("d/bad");
  ASSERT_THAT(convert::TensorToProto(Filled(DType::kFloat32, {1, 16}, 1),
                                     forward.add_inputs()),
              IsOk());
  EXPECT_THAT(client_->Forward(forward),
              StatusIs(absl::StatusCode::kDataLoss, names_the_damage));
  v1::MoveModuleRequest move;
  move.set_module("d/bad");
  move.set_dtype("float64");
  EXPECT_THAT(client_->MoveModule(move),
              StatusIs(absl::StatusCode::kDataLoss, names_the_damage));
  v1::GetModuleRequest describe;
  describe.set_module("d/bad");
  EXPECT_THAT(client_->GetModule(describe), IsOk());
  describe.set_with_hashes(true);
  EXPECT_THAT(client_->GetModule(describe),
              StatusIs(absl::StatusCode::kDataLoss, names_the_damage));
  // A load replaces the damaged bytes: served again, and after a restart.
  ASSERT_THAT(client_->LoadStateDict("d/bad", *good), IsOk());
  absl::StatusOr<StateDict> repaired = client_->GetStateDict("d/bad");
  ASSERT_THAT(repaired, IsOk());
  ExpectSameState(*repaired, *good);
  StopGracefully();
  Restart();
  repaired = client_->GetStateDict("d/bad");
  ASSERT_THAT(repaired, IsOk());
  ExpectSameState(*repaired, *good);
  // The files of a module that could not be loaded are kept for repair,
  // not overwritten.
  EXPECT_THAT(client_->BuildModule(BuildRequest(
                  "d/short", R"({"type": "Linear", "args": [1, 1]})")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("d/short"),
                             HasSubstr("could not be loaded at start-up"))));
  // Two restarts, each recording the two modules it could not load.
  std::vector<v1::AuditRecordProto> restore = AuditRecords(*client_, "restore");
  ASSERT_THAT(restore, SizeIs(4));
  EXPECT_EQ(restore[0].outcome(), "error");
  EXPECT_THAT(restore[0].details_json() + restore[1].details_json(),
              HasSubstr("d/short/data-3.safetensors"));
  EXPECT_TRUE(VerifyAudit(*client_).ok());
}

TEST_F(DurabilityTest, AChangeSavedButNeverRecordedIsRecordedAtStart) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "r/m", R"({"type": "Linear", "args": [2, 2]})", 1)),
              IsOk());
  std::vector<v1::AuditRecordProto> builds = AuditRecords(*client_, "build");
  ASSERT_THAT(builds, SizeIs(1));
  StopGracefully();
  // As if the server died between saving the module and recording the
  // build: the log ends before the build's record (a shorter chain is still
  // a valid one).
  const fs::path log = server_.data_dir() / "audit.log";
  std::ifstream in(log);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (line.find(R"("type":"build")") != std::string::npos) break;
    kept += line + "\n";
  }
  in.close();
  std::ofstream(log, std::ios::trunc) << kept;
  // A crash there leaves no checkpoint over the missing record; the one the
  // graceful stop signed would (rightly) refuse this log as cut off.
  fs::remove(server_.data_dir() / "audit.checkpoint");

  Restart();
  EXPECT_THAT(server_.Log(), HasSubstr("recorded 1 changes the audit log "
                                       "had missed"));
  std::vector<v1::AuditRecordProto> recovered =
      AuditRecords(*client_, "recovered");
  ASSERT_THAT(recovered, SizeIs(1));
  EXPECT_EQ(recovered[0].module(), "m");
  EXPECT_EQ(recovered[0].correlation_id(), builds[0].correlation_id());
  EXPECT_THAT(recovered[0].details_json(), HasSubstr(R"("change":"build")"));
  EXPECT_TRUE(VerifyAudit(*client_).ok());
  // Recorded once: the next start finds it.
  StopGracefully();
  Restart();
  EXPECT_THAT(AuditRecords(*client_, "recovered"), SizeIs(1));
}

TEST_F(DurabilityTest, AChangeThatCannotBeSavedIsAnErrorNamingTheFile) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "s/m", R"({"type": "Linear", "args": [2, 2]})", 1)),
              IsOk());
  // The module's directory is moved aside and a file takes its place: every
  // write into it fails, even for root.
  const fs::path dir = ModuleDir(server_, "s", "m");
  const fs::path aside = dir.string() + ".aside";
  fs::rename(dir, aside);
  std::ofstream(dir) << "in the way";
  // Neither the change can be saved nor the saved state read back: the
  // module is withdrawn until the files are back and the server restarts.
  EXPECT_THAT(client_->SetTraining("s/m", false),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("the change to 's/m' could not be "
                                       "saved"),
                             HasSubstr("s/m/manifest.json"),
                             HasSubstr("the module is withdrawn"))));
  EXPECT_THAT(client_->GetStateDict("s/m"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'s/m' is not served"),
                             HasSubstr("s/m/manifest.json"))));
  EXPECT_THAT(client_->BuildModule(BuildRequest(
                  "s/m2", R"({"type": "Linear", "args": [2, 2]})")),
              IsOk());
  fs::remove(dir);
  fs::rename(aside, dir);
  std::ofstream(ModuleDir(server_, "s", "blocked")) << "in the way";
  EXPECT_THAT(client_->BuildModule(BuildRequest(
                  "s/blocked", R"({"type": "Linear", "args": [2, 2]})")),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("module 's/blocked' was not stored")));
  EXPECT_THAT(client_->GetStateDict("s/blocked"),
              StatusIs(absl::StatusCode::kNotFound));
  // Back with its files, the module is as it was before the failed change.
  KillAndRestart();
  v1::GetModuleRequest get;
  get.set_module("s/m");
  absl::StatusOr<v1::GetModuleResponse> described = client_->GetModule(get);
  ASSERT_THAT(described, IsOk());
  EXPECT_TRUE(described->info().training());
  ASSERT_THAT(client_->SetTraining("s/m", false), IsOk());
}

// A damaged audit log: a torn last line (a crash mid-append) is dropped and
// the server starts; a damaged record anywhere else stops the start with a
// message naming the file and the line, because continuing would chain new
// records onto a history nobody can verify.
TEST_F(DurabilityTest, ADamagedAuditLogStopsTheStartAndATornTailIsDropped) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "a/m", R"({"type": "Linear", "args": [2, 2]})", 1)),
              IsOk());
  ASSERT_THAT(client_->SetTraining("a/m", false), IsOk());
  StopGracefully();
  const fs::path log = server_.data_dir() / "audit.log";
  std::string original;
  {
    std::ifstream in(log, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Torn tail: the start of a record without its end.
  std::ofstream(log, std::ios::app) << R"({"seq":99,"time":"2026-)";
  Restart();
  EXPECT_THAT(server_.Log(),
              HasSubstr("audit.log: removed a torn last record left by a "
                        "crash"));
  EXPECT_TRUE(VerifyAudit(*client_).ok());
  StopGracefully();
  // The log as that server left it: its last signed checkpoint covers all
  // of it, so a repair must restore this, not an older copy (one shorter
  // than the checkpoint is refused as a rollback).
  {
    std::ifstream in(log, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }

  // One changed byte inside the first record.
  std::string edited = original;
  const size_t at = edited.find(R"("identity":")");
  ASSERT_NE(at, std::string::npos);
  edited.insert(at + 12, "x");
  std::ofstream(log, std::ios::trunc | std::ios::binary) << edited;
  absl::Status started = server_.Start();
  EXPECT_THAT(started, StatusIs(absl::StatusCode::kInternal,
                                HasSubstr("server exited early")));
  EXPECT_THAT(server_.Log(),
              AllOf(HasSubstr("cannot open the audit log"),
                    HasSubstr("audit.log is broken at line 1"),
                    HasSubstr("refusing to continue a broken chain")));

  // Repaired, it starts again with everything in place.
  std::ofstream(log, std::ios::trunc | std::ios::binary) << original;
  Restart();
  EXPECT_TRUE(VerifyAudit(*client_).ok());
  EXPECT_THAT(client_->GetStateDict("a/m"), IsOk());
}

// How many records of `type` have `outcome`.
size_t CountRecords(client::ModelStateClient& client, const std::string& type,
                    const std::string& outcome) {
  size_t n = 0;
  for (const v1::AuditRecordProto& r : AuditRecords(client, type)) {
    if (r.outcome() == outcome) ++n;
  }
  return n;
}

// Flips one bit near the end of every data file of a module.
void DamageDataFiles(const fs::path& dir) {
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() == ".safetensors") FlipBitNearEnd(item.path());
  }
}

// A write that fails (the file size limit stands in for a full disk) must
// leave the module as it was, in memory and on disk, with a clear error and
// no successful record of the change in the audit log.
TEST_F(DurabilityTest, AFailedWriteLeavesThePreviousStateIntact) {
  // Linear(512, 512): 1 MiB of weight, more than the limit below.
  constexpr char kSpec[] = R"({"type": "Linear", "args": [512, 512]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("w/m", kSpec, 1)), IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest("w/fragile", kSpec, 2)),
              IsOk());
  absl::StatusOr<StateDict> layout = client_->GetStateDict("w/m");
  ASSERT_THAT(layout, IsOk());
  ASSERT_THAT(client_->LoadStateDict("w/m", FilledLike(*layout, 0.5)), IsOk());
  absl::StatusOr<StateDict> before = client_->GetStateDict("w/m");
  ASSERT_THAT(before, IsOk());
  const size_t loads_ok = CountRecords(*client_, "load_state_dict", "ok");

  ASSERT_THAT(LimitFileSize(server_.pid(), 256 << 10), IsOk());
  // A streamed (copying) load fails while its bytes are staged on disk.
  EXPECT_THAT(
      client_->LoadStateDict("w/m", FilledLike(*layout, 2)),
      StatusIs(absl::StatusCode::kInternal,
               AllOf(HasSubstr("could not be written to disk"),
                     HasSubstr("w/m/data-"), HasSubstr("File too large"),
                     HasSubstr("nothing was loaded"))));
  // An assigning load is applied in memory, then its save fails: the
  // module must be read back, not keep the unsaved values.
  client::LoadStateDictOptions assign;
  assign.load.assign = true;
  EXPECT_THAT(client_->LoadStateDict("w/m", FilledLike(*layout, 3), assign),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("the change to 'w/m' could not be "
                                       "saved"),
                             HasSubstr("File too large"),
                             HasSubstr("the module is unchanged"))));
  // A move that cannot be saved leaves the old dtype.
  v1::MoveModuleRequest move;
  move.set_module("w/m");
  move.set_dtype("float64");
  EXPECT_THAT(client_->MoveModule(move),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("the module is unchanged")));
  absl::StatusOr<StateDict> during = client_->GetStateDict("w/m");
  ASSERT_THAT(during, IsOk());
  ExpectSameState(*during, *before);
  EXPECT_EQ(CountRecords(*client_, "load_state_dict", "ok"), loads_ok);
  // Both failed loads are recorded: the staged one that never applied too.
  EXPECT_EQ(CountRecords(*client_, "load_state_dict", "error"), 2u);

  // If the saved state cannot be read back either, the module is withdrawn
  // rather than served from memory alone.
  DamageDataFiles(ModuleDir(server_, "w", "fragile"));
  EXPECT_THAT(
      client_->LoadStateDict("w/fragile", FilledLike(*layout, 4), assign),
      StatusIs(absl::StatusCode::kInternal,
               AllOf(HasSubstr("w/fragile"), HasSubstr("is damaged"),
                     HasSubstr("the module is withdrawn"))));
  EXPECT_THAT(client_->GetStateDict("w/fragile"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("'w/fragile' is not served")));
  EXPECT_THAT(client_->BuildModule(BuildRequest("w/fragile", kSpec)),
              StatusIs(absl::StatusCode::kFailedPrecondition));

  // Disk agrees with what was served, and writes work again once there is
  // room.
  ASSERT_THAT(LiftFileSizeLimit(server_.pid()), IsOk());
  KillAndRestart();
  absl::StatusOr<StateDict> after = client_->GetStateDict("w/m");
  ASSERT_THAT(after, IsOk());
  ExpectSameState(*after, *before);
  EXPECT_TRUE(VerifyAudit(*client_).ok());
  ASSERT_THAT(client_->LoadStateDict("w/m", FilledLike(*layout, 5)), IsOk());
  KillAndRestart();
  absl::StatusOr<StateDict> reloaded = client_->GetStateDict("w/m");
  ASSERT_THAT(reloaded, IsOk());
  EXPECT_EQ(UniformValue(*reloaded), 5);
}

}  // namespace
}  // namespace modelstate
