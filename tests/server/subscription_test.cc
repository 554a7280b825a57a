// Remote registration hooks end to end: the real server (in the test
// process; as a process where its file size limit is the point),
// subscribers as separate processes (modelstatectl subscribe with the
// shipped policies, and a test tool that misbehaves on purpose), and the
// audit log.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/model_state_client.h"
#include "client/subscriber.h"
#include "core/generator.h"
#include "core/init.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "service/subscriber_hub.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/run_command.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BackgroundProcess;
using ::modelstate::testing::CommandResult;
using ::modelstate::testing::InProcessServer;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::RunCommand;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::TestServer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Policy(const std::string& name) {
  return std::string(MODELSTATE_SOURCE_DIR) + "/deploy/policies/" + name;
}

v1::BuildModuleRequest BuildRequest(const std::string& module,
                                    const std::string& json,
                                    uint64_t seed = 0) {
  v1::BuildModuleRequest r;
  r.set_module(module);
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage(json, r.mutable_spec()).ok())
      << json;
  r.set_seed(seed);
  return r;
}

const v1::RegistrationReport* Report(const v1::BuildModuleResponse& r,
                                     const std::string& path,
                                     const std::string& name) {
  for (const auto& report : r.registrations()) {
    if (report.path() == path && report.name() == name) return &report;
  }
  return nullptr;
}

class SubscriptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<InProcessServer>(configure_);
    ASSERT_THAT(server_->Start(), IsOk());
    client_ = server_->NewClient();
  }

  // Starts `modelstatectl subscribe ...` and waits until it is subscribed.
  std::unique_ptr<BackgroundProcess> Cli(std::vector<std::string> args) {
    std::vector<std::string> argv = {MODELSTATE_CLI_BINARY, "--server",
                                     server_->address(), "subscribe"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = std::make_unique<BackgroundProcess>(argv);
    EXPECT_TRUE(p->WaitForLine("subscribed as")) << "subscriber did not start";
    return p;
  }
  std::unique_ptr<BackgroundProcess> Rogue(std::vector<std::string> args) {
    std::vector<std::string> argv = {MODELSTATE_ROGUE_BINARY,
                                     "--server=" + server_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = std::make_unique<BackgroundProcess>(argv);
    EXPECT_TRUE(p->WaitForLine("ready")) << "rogue subscriber did not start";
    return p;
  }
  StateDict State(const std::string& module) {
    absl::StatusOr<StateDict> sd = client_->GetStateDict(module);
    EXPECT_TRUE(sd.ok()) << sd.status();
    return sd.ok() ? *sd : StateDict();
  }
  std::vector<v1::AuditRecordProto> Audit(const std::string& type = "") {
    std::vector<v1::AuditRecordProto> out;
    v1::QueryAuditRequest q;
    q.mutable_filter()->set_type(type);
    q.set_limit(10000);
    while (true) {
      grpc::ClientContext context;
      v1::QueryAuditResponse r;
      EXPECT_TRUE(client_->stub().QueryAudit(&context, q, &r).ok());
      out.insert(out.end(), r.records().begin(), r.records().end());
      if (r.next_after_seq() == 0) break;
      q.set_after_seq(r.next_after_seq());
    }
    return out;
  }

  InProcessServer::Configure configure_;
  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<client::ModelStateClient> client_;
};

// ------------------------------------------------------------- seed examples

TEST_F(SubscriptionTest, SeedEveryBufferAndParameterBecomesFloat32) {
  auto sub = Cli({"--policy", Policy("float32_everything.json")});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("seeds/f32", R"({"type": "Mixed", "members": [
          {"parameter": {"name": "p64", "shape": [2], "dtype": "float64"}},
          {"buffer": {"name": "b16", "shape": [3], "dtype": "float16"}},
          {"buffer": {"name": "count", "shape": [], "dtype": "int64"}},
          {"parameter": {"name": "p32", "shape": [2]}}]})")));
  StateDict sd = State("seeds/f32");
  EXPECT_EQ(sd.tensors.Find("p64")->dtype(), DType::kFloat32);
  EXPECT_EQ(sd.tensors.Find("b16")->dtype(), DType::kFloat32);
  EXPECT_EQ(sd.tensors.Find("count")->dtype(), DType::kInt64);
  EXPECT_EQ(Report(r, "", "p64")->outcome(), v1::OUTCOME_REPLACE);
  EXPECT_EQ(Report(r, "", "p32")->outcome(), v1::OUTCOME_KEEP);
  EXPECT_TRUE(sub->WaitForLine(
      "p64: parameter float64[2] in Mixed (seeds/f32) -> MODIFY"));
}

TEST_F(SubscriptionTest, SeedRecordEveryBufferRegistered) {
  auto sub = Cli({"--policy", Policy("record_buffers.json")});
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("seeds/bn", R"({"type": "BatchNorm1d",
                                                               "args": [4]})")),
      IsOk());
  // Observers get outcomes, never awaited: wait for the three lines.
  EXPECT_TRUE(
      sub->WaitForLine("running_mean: buffer float32[4] in BatchNorm1d"));
  EXPECT_TRUE(sub->WaitForLine("running_var: buffer float32[4]"));
  EXPECT_TRUE(sub->WaitForLine(
      "num_batches_tracked: buffer int64[] in BatchNorm1d (seeds/bn) "
      "-> APPROVE [outcome OUTCOME_KEEP]"));
}

TEST_F(SubscriptionTest, SeedBlockBuffersNamedTempBuffer) {
  auto sub = Cli({"--policy", Policy("block_temp_buffer.json")});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("seeds/temp", R"({"type": "Net", "members": [
          {"buffer": {"name": "temp_buffer", "shape": [8]}},
          {"buffer": {"name": "kept", "shape": [8]}}]})")));
  const v1::RegistrationReport* temp = Report(r, "", "temp_buffer");
  ASSERT_NE(temp, nullptr);
  EXPECT_EQ(temp->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_EQ(temp->reason(),
            "rejected by no-temp-buffers: Blocking temporary buffer");
  EXPECT_THAT(State("seeds/temp").tensors.Keys(), ElementsAre("kept"));
  // A single registration that is blocked fails with the reason.
  v1::RegisterTensorRequest again;
  again.set_module("seeds/temp");
  again.set_name("temp_buffer");
  again.mutable_init()->add_shape(1);
  EXPECT_THAT(client_->RegisterBuffer(again),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("Blocking temporary buffer")));
}

TEST_F(SubscriptionTest, SeedParametersStartingWithUnderscoreAreNotTrainable) {
  auto sub = Cli({"--policy", Policy("freeze_underscore_parameters.json")});
  ASSERT_THAT(client_->BuildModule(
                  BuildRequest("seeds/freeze", R"({"type": "Net", "members": [
          {"parameter": {"name": "_scale", "shape": [2]}},
          {"parameter": {"name": "weight", "shape": [2]}}]})")),
              IsOk());
  v1::GetModuleRequest get;
  get.set_module("seeds/freeze");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::GetModuleResponse d,
                                  client_->GetModule(get));
  EXPECT_FALSE(d.info().parameters(0).tensor().requires_grad());
  EXPECT_TRUE(d.info().parameters(1).tensor().requires_grad());
}

TEST_F(SubscriptionTest, SeedLinearWeightsReinitialisedUniformly) {
  auto sub = Cli({"--policy", Policy("linear_uniform_init.json")});
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("seeds/lin", R"({"type": "Sequential",
      "children": [{"spec": {"type": "Linear", "args": [8, 4]}},
                   {"spec": {"type": "Conv1d", "args": [2, 2, 3]}},
                   {"spec": {"type": "Linear", "args": [8, 4]}}]})",
                                        3)),
      IsOk());
  StateDict sd = State("seeds/lin");
  // The policy gives no seed: each weight draws from the seed derived from
  // the request's seed (3) and its path, exactly.
  Tensor expected = *Tensor::Empty(DType::kFloat32, {4, 8});
  Generator gen(ReinitSeed(3, "0.weight"));
  ASSERT_THAT(UniformInit(expected, -0.05, 0.05, gen), IsOk());
  EXPECT_TRUE(TensorsEqual(*sd.tensors.Find("0.weight"), expected));
  // So two layers of the same shape do not start out equal.
  EXPECT_FALSE(
      TensorsEqual(*sd.tensors.Find("0.weight"), *sd.tensors.Find("2.weight")));
  const float* other = sd.tensors.Find("2.weight")->data<float>();
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::abs(other[i]), 0.05f);
  // Not Linear weights: PyTorch's default init, untouched.
  const float* conv = sd.tensors.Find("1.weight")->data<float>();
  bool outside = false;
  for (int i = 0; i < 12; ++i) outside |= std::abs(conv[i]) > 0.05f;
  EXPECT_TRUE(outside);
}

TEST_F(SubscriptionTest, SeedLogEveryParameterRegistration) {
  auto sub = Cli({"--policy", Policy("log_parameters.json")});
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("seeds/log", R"({"type": "Linear",
                                                                "args": [3, 2]})")),
      IsOk());
  EXPECT_TRUE(sub->WaitForLine(
      "weight: parameter float32[2, 3] in Linear (seeds/log)"));
  EXPECT_TRUE(
      sub->WaitForLine("bias: parameter float32[2] in Linear (seeds/log)"));
}

// ---------------------------------------------------------------- chains

TEST_F(SubscriptionTest, ThreeInterceptorsChainInPriorityOrder) {
  auto a =
      Rogue({"--name=a", "--mode=tag", "--priority=1", "--kind=parameter"});
  auto b =
      Rogue({"--name=b", "--mode=approve", "--priority=2", "--kind=parameter"});
  auto c =
      Rogue({"--name=c", "--mode=tag", "--priority=3", "--kind=parameter"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("chain/net", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [4]}}]})")));
  // The last modification wins: c's constant 3.
  StateDict sd = State("chain/net");
  EXPECT_EQ(sd.tensors.Find("w")->data<float>()[0], 3.0f);
  EXPECT_EQ(Report(r, "", "w")->reason(), "modified by a, c");
  std::vector<v1::AuditRecordProto> answers = Audit("answer");
  std::vector<std::string> who;
  for (const auto& ans : answers) {
    who.push_back(nlohmann::json::parse(ans.details_json())["subscriber"]
                      .get<std::string>() +
                  ":" + ans.outcome());
  }
  EXPECT_THAT(who, ElementsAre("a:modify", "b:approve", "c:modify"));
}

TEST_F(SubscriptionTest, ARejectInTheMiddleStopsTheChain) {
  auto a = Rogue({"--name=a", "--mode=approve", "--priority=1"});
  auto b = Rogue({"--name=b", "--mode=reject", "--priority=2"});
  auto c = Rogue({"--name=c", "--mode=tag", "--priority=3"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("chain/rej", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [4]}}]})")));
  EXPECT_EQ(Report(r, "", "w")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_EQ(Report(r, "", "w")->reason(), "rejected by b: rejected by rogue");
  EXPECT_FALSE(c->WaitForLine("event", std::chrono::milliseconds(300)));
}

// ------------------------------------------------------------- failures

TEST_F(SubscriptionTest, TimeoutsFailClosedOrOpen) {
  auto silent = Rogue({"--name=silent", "--mode=silent", "--timeout_ms=300"});
  auto start = std::chrono::steady_clock::now();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse closed,
      client_->BuildModule(BuildRequest(
          "fail/closed", R"({"type": "Linear", "args": [2, 2]})")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(Report(closed, "", "weight")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_THAT(Report(closed, "", "weight")->reason(),
              HasSubstr("silent timed out after 300ms (fail-closed)"));
  silent.reset();  // killed
  auto lenient = Rogue(
      {"--name=lenient", "--mode=silent", "--timeout_ms=300", "--fail_open"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse open,
      client_->BuildModule(
          BuildRequest("fail/open", R"({"type": "Linear", "args": [2, 2]})")));
  EXPECT_EQ(Report(open, "", "weight")->outcome(), v1::OUTCOME_KEEP);
  EXPECT_EQ(State("fail/open").tensors.size(), 2u);
}

TEST_F(SubscriptionTest, ASubscriberKilledMidEventFailsClosedOrOpen) {
  auto dying = Rogue({"--name=dying", "--mode=die"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse closed,
      client_->BuildModule(
          BuildRequest("die/closed", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})")));
  EXPECT_EQ(Report(closed, "", "w")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_THAT(Report(closed, "", "w")->reason(),
              HasSubstr("dying disconnected"));
  EXPECT_EQ(dying->Wait(), 128 + SIGKILL);
  auto dying_open = Rogue({"--name=dying-open", "--mode=die", "--fail_open"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse open,
      client_->BuildModule(
          BuildRequest("die/open", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})")));
  EXPECT_EQ(Report(open, "", "w")->outcome(), v1::OUTCOME_KEEP);
}

TEST_F(SubscriptionTest, GarbageAnswersCountAsFailures) {
  auto garbage = Rogue({"--name=garbage", "--mode=garbage-id"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("garbage/id", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})")));
  EXPECT_EQ(Report(r, "", "w")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_THAT(Report(r, "", "w")->reason(),
              HasSubstr("garbage sent an answer for an unknown event"));
  garbage.reset();
  auto shape = Rogue({"--name=shape", "--mode=wrong-shape"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse s,
      client_->BuildModule(BuildRequest(
          "garbage/shape", R"({"type": "Linear", "args": [3, 2]})")));
  EXPECT_EQ(Report(s, "", "weight")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_THAT(Report(s, "", "weight")->reason(),
              HasSubstr("sent an invalid answer: shape must stay [2, 3]"));
  std::vector<v1::AuditRecordProto> answers = Audit("answer");
  bool invalid_recorded = false;
  for (const auto& a : answers) invalid_recorded |= a.outcome() == "invalid";
  EXPECT_TRUE(invalid_recorded);
}

TEST_F(SubscriptionTest, GarbageAnswersFromAFailOpenSubscriberKeep) {
  auto garbage =
      Rogue({"--name=garbage-open", "--mode=garbage-id", "--fail_open"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("garbage-open/id", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})")));
  EXPECT_EQ(Report(r, "", "w")->outcome(), v1::OUTCOME_KEEP);
  EXPECT_THAT(State("garbage-open/id").tensors.Keys(), ElementsAre("w"));
  garbage.reset();
  auto shape =
      Rogue({"--name=shape-open", "--mode=wrong-shape", "--fail_open"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse s,
      client_->BuildModule(BuildRequest(
          "garbage-open/shape", R"({"type": "Linear", "args": [3, 2]})")));
  EXPECT_EQ(Report(s, "", "weight")->outcome(), v1::OUTCOME_KEEP);
  // The wrong-shaped replacement was not applied.
  EXPECT_EQ(State("garbage-open/shape").tensors.Find("weight")->shape(),
            (std::vector<int64_t>{2, 3}));
}

TEST_F(SubscriptionTest, DryRunIsRecordedButNotEnforced) {
  auto dry = Cli({"--policy", Policy("block_temp_buffer.json"), "--mode",
                  "dry-run", "--name", "dry"});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::BuildModuleResponse r,
                                  client_->BuildModule(BuildRequest(
                                      "dry/net", R"({"type": "Net", "members": [
          {"buffer": {"name": "temp_buffer", "shape": [1]}}]})")));
  EXPECT_EQ(Report(r, "", "temp_buffer")->outcome(), v1::OUTCOME_KEEP);
  EXPECT_THAT(State("dry/net").tensors.Keys(), ElementsAre("temp_buffer"));
  // The answer arrives after the build returned; it is audited when it does.
  bool recorded = false;
  for (int i = 0; i < 200 && !recorded; ++i) {
    for (const auto& a : Audit("answer")) {
      nlohmann::json d = nlohmann::json::parse(a.details_json());
      recorded |= a.outcome() == "reject" && d.value("dry_run", false);
    }
    if (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(recorded);
}

TEST_F(SubscriptionTest, InteractiveAsksAPerson) {
  auto person =
      Cli({"--interactive", "--name", "human", "--kinds", "parameter"});
  std::thread answer([&] {
    // The prompt itself ends without a newline: wait for the event line.
    EXPECT_TRUE(person->WaitForLine("weight: parameter float32[2, 2]"));
    person->WriteLine("r not in my model");
    EXPECT_TRUE(person->WaitForLine("bias: parameter float32[2]"));
    person->WriteLine("freeze");
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(
          BuildRequest("human/lin", R"({"type": "Linear", "args": [2, 2]})")));
  answer.join();
  // Both events were sent at once; the person answered them in order.
  EXPECT_EQ(Report(r, "", "weight")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_EQ(Report(r, "", "weight")->reason(),
            "rejected by human: not in my model");
  EXPECT_EQ(Report(r, "", "bias")->outcome(), v1::OUTCOME_REPLACE);
  EXPECT_FALSE(Report(r, "", "bias")->value().requires_grad());
}

// ---------------------------------------------------------- volume, audit

TEST_F(SubscriptionTest,
       AThousandRegistrationsWithFourInterceptorsLoseNothing) {
  std::vector<std::unique_ptr<BackgroundProcess>> subs;
  for (int i = 0; i < 4; ++i) {
    subs.push_back(Rogue({absl::StrCat("--name=s", i), "--mode=approve",
                          absl::StrCat("--priority=", i)}));
  }
  std::string json = R"({"type": "Big", "members": [)";
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [2]}})");
  }
  json += "]}";
  auto start = std::chrono::steady_clock::now();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      v1::BuildModuleResponse r,
      client_->BuildModule(BuildRequest("volume/big", json)));
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("1000 registrations x 4 interceptors: %.2f s\n", seconds);
  ASSERT_EQ(r.registrations_size(), 1000);
  for (const auto& rep : r.registrations())
    EXPECT_EQ(rep.outcome(), v1::OUTCOME_KEEP);
  EXPECT_EQ(Audit("registration").size(), 1000u);
  EXPECT_EQ(Audit("answer").size(), 4000u);
  EXPECT_EQ(Audit("outcome").size(), 1000u);
  std::vector<v1::AuditRecordProto> all = Audit();
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].seq(), i + 1);
  CommandResult verify = RunCommand({MODELSTATE_CLI_BINARY, "--server",
                                     server_->address(), "audit", "verify"});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("the chain is intact"));
}

TEST_F(SubscriptionTest, AuditVerifyNamesAnEditedRecord) {
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("audit/lin", R"({"type": "Linear",
                                                                "args": [2, 2]})")),
      IsOk());
  std::string path = (server_->data_dir() / "audit.log").string();
  std::vector<std::string> lines;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  ASSERT_GE(lines.size(), 4u);
  // Someone rewrites history: record 2 now says another identity.
  size_t at = lines[1].find("\"identity\":\"");
  ASSERT_NE(at, std::string::npos);
  lines[1].insert(at + 12, "mallory-");
  {
    std::ofstream out(path, std::ios::trunc);
    for (const std::string& line : lines) out << line << "\n";
  }
  CommandResult verify = RunCommand({MODELSTATE_CLI_BINARY, "--server",
                                     server_->address(), "audit", "verify"});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_THAT(verify.out, HasSubstr("BROKEN at record 2 (line 2)"));
  CommandResult local =
      RunCommand({MODELSTATE_CLI_BINARY, "audit", "verify", "--file", path});
  EXPECT_EQ(local.exit_code, 1);
  EXPECT_THAT(local.out, HasSubstr("BROKEN at record 2"));
}

TEST_F(SubscriptionTest, AuditQueryAndTailFromTheCli) {
  auto tail = std::make_unique<BackgroundProcess>(std::vector<std::string>{
      MODELSTATE_CLI_BINARY, "--server", server_->address(), "audit", "tail",
      "--type", "build"});
  ASSERT_THAT(
      client_->BuildModule(BuildRequest("audit/a", R"({"type": "ReLU"})")),
      IsOk());
  EXPECT_TRUE(tail->WaitForLine("audit/a"));
  CommandResult q =
      RunCommand({MODELSTATE_CLI_BINARY, "--server", server_->address(),
                  "audit", "query", "--module", "a", "--type", "build"});
  EXPECT_EQ(q.exit_code, 0) << q.err;
  EXPECT_THAT(q.out, HasSubstr("build"));
  EXPECT_THAT(q.out, HasSubstr("audit/a"));
  tail->Kill(SIGTERM);
  EXPECT_EQ(tail->Wait(), 0);
}

// ------------------------------------------------- subscribing, audit health

v1::HookAnswer Answer(const v1::HookEventProto& e,
                      v1::HookAnswer::Verdict verdict) {
  v1::HookAnswer a;
  a.set_event_id(e.event_id());
  a.set_verdict(verdict);
  return a;
}

TEST_F(SubscriptionTest, SubscribeAndUnsubscribeTakeEffectBeforeTheAck) {
  // No sleeps: each build runs right after the acknowledgement, from
  // another client. A subscriber not yet attached would let the weight
  // through; one not yet detached would block it (its stream is gone).
  v1::Subscription s;
  s.set_name("gate");
  s.set_timeout_ms(60000);
  std::unique_ptr<client::ModelStateClient> other = server_->NewClient();
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<client::Subscriber> gate,
        client::Subscriber::Start(*client_, s, [](const v1::HookEventProto& e) {
          return Answer(e, v1::HookAnswer::REJECT);
        }));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        v1::BuildModuleResponse seen,
        other->BuildModule(
            BuildRequest(absl::StrCat("gate/on", round),
                         R"({"type": "Linear", "args": [2, 2]})")));
    EXPECT_EQ(Report(seen, "", "weight")->outcome(), v1::OUTCOME_BLOCK);
    ASSERT_THAT(gate->Unsubscribe(), IsOk());
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        v1::BuildModuleResponse unseen,
        other->BuildModule(
            BuildRequest(absl::StrCat("gate/off", round),
                         R"({"type": "Linear", "args": [2, 2]})")));
    EXPECT_EQ(Report(unseen, "", "weight")->outcome(), v1::OUTCOME_KEEP)
        << Report(unseen, "", "weight")->reason();
  }
}

// An interceptor holds a build's event and a second stream subscribes under
// its name in DRY_RUN mode (a 1 h timeout), approving everything. Nothing
// waits for a dry-run subscriber, so it takes over no held event: the
// interceptor's policy decides at once. Before, the event moved to the
// dry-run stream, whose approvals never counted, and the build waited for
// its hour.
TEST_F(SubscriptionTest, ReconnectingInDryRunModeTakesOverNoHeldEvent) {
  auto gate = Rogue({"--name=gate", "--mode=silent", "--timeout_ms=60000"});
  std::unique_ptr<client::ModelStateClient> other = server_->NewClient();
  auto build = std::async(std::launch::async, [&] {
    return other->BuildModule(
        BuildRequest("gate/held", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  });
  ASSERT_TRUE(gate->WaitForLine("event")) << "the gate never got the event";
  v1::Subscription s;
  s.set_name("gate");
  s.set_mode(v1::Subscription::MODE_DRY_RUN);
  s.set_timeout_ms(3600 * 1000);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<client::Subscriber> dry,
      client::Subscriber::Start(*client_, s, [](const v1::HookEventProto& e) {
        return Answer(e, v1::HookAnswer::APPROVE);
      }));
  const bool decided =
      build.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(decided) << "the build waits on the dry-run gate";
  if (!decided) dry->Stop();  // lets the build end
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::BuildModuleResponse r, build.get());
  ASSERT_NE(Report(r, "", "w"), nullptr);
  EXPECT_EQ(Report(r, "", "w")->outcome(), v1::OUTCOME_BLOCK);
  EXPECT_THAT(
      Report(r, "", "w")->reason(),
      HasSubstr("gate reconnected as a dry-run subscriber (fail-closed)"));
  grpc::ClientContext context;
  v1::ListSubscribersResponse list;
  ASSERT_TRUE(
      client_->stub()
          .ListSubscribers(&context, v1::ListSubscribersRequest(), &list)
          .ok());
  ASSERT_EQ(list.subscribers_size(), 1);
  EXPECT_EQ(list.subscribers(0).subscription().mode(),
            v1::Subscription::MODE_DRY_RUN);
  EXPECT_EQ(list.subscribers(0).pending_events(), 0u);
}

TEST_F(SubscriptionTest, MaxDataBytesIsCappedByTheMessageSize) {
  // The default server allows 64 MiB messages: events may carry 63 MiB.
  v1::Subscription s;
  s.set_name("data");
  s.set_include_data(true);
  s.set_max_data_bytes((uint64_t{63} << 20) + 1);
  auto approve = [](const v1::HookEventProto& e) {
    return Answer(e, v1::HookAnswer::APPROVE);
  };
  EXPECT_THAT(
      client::Subscriber::Start(*client_, s, approve).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("max_data_bytes: 66060289 is more than this "
                         "server's largest message minus 1 MiB (66060288)")));
  s.set_max_data_bytes(uint64_t{63} << 20);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<client::Subscriber> ok,
      client::Subscriber::Start(*client_, s, approve));
  EXPECT_THAT(ok->Unsubscribe(), IsOk());
}

TEST(AuditFailureTest, AFailedAuditAppendRefusesEveryLaterChange) {
  // The audit log may not grow past 64 KiB: the append that would, fails.
  TestServer server;
  server.set_max_file_bytes(64 << 10);
  ASSERT_THAT(server.Start(), IsOk());
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  absl::Status failed;
  int built = 0;
  for (; built < 500; ++built) {
    absl::StatusOr<v1::BuildModuleResponse> r =
        c->BuildModule(BuildRequest(absl::StrCat("full/m", built),
                                    R"({"type": "Linear", "args": [2, 2]})"));
    if (!r.ok()) {
      failed = r.status();
      break;
    }
  }
  ASSERT_FALSE(failed.ok()) << "the audit log never filled up";
  EXPECT_THAT(failed,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("audit log")));
  // Every later change is refused up front, naming the audit log, and
  // nothing changes.
  const std::string audit_path = (server.data_dir() / "audit.log").string();
  EXPECT_THAT(c->BuildModule(BuildRequest(
                  "full/after", R"({"type": "Linear", "args": [2, 2]})")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(audit_path)));
  v1::GetModuleRequest get;
  get.set_module("full/after");
  EXPECT_THAT(c->GetModule(get), StatusIs(absl::StatusCode::kNotFound));
  v1::RegisterTensorRequest extra;
  extra.set_module("full/m0");
  extra.set_name("extra");
  extra.mutable_init()->add_shape(1);
  EXPECT_THAT(c->RegisterBuffer(extra),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(audit_path)));
  v1::Subscription s;
  s.set_name("late");
  EXPECT_THAT(client::Subscriber::Start(*c, s,
                                        [](const v1::HookEventProto& e) {
                                          return Answer(
                                              e, v1::HookAnswer::APPROVE);
                                        })
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(audit_path)));
  // Reads go on, and the server is still up.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict m0, c->GetStateDict("full/m0"));
  EXPECT_EQ(m0.tensors.Keys(), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_THAT(c->Health(), IsOk());
  // What was written is still a valid chain.
  CommandResult verify = RunCommand(
      {MODELSTATE_CLI_BINARY, "audit", "verify", "--file", audit_path});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

// ------------------------------------------------------------------ README

// What may differ between runs of a command: times, peer addresses, and
// the alignment of columns.
std::string Normalise(const std::string& text) {
  static const std::regex kTime(R"(\d{4}-\d\d-\d\dT[0-9:.]+Z)");
  static const std::regex kPeer(R"(ipv[46]:\S+)");
  static const std::regex kSpaces(R"([ \t]+)");
  std::string out = std::regex_replace(text, kTime, "TIME");
  out = std::regex_replace(out, kPeer, "PEER");
  return std::regex_replace(out, kSpaces, " ");
}

TEST_F(SubscriptionTest, TheReadmeHookWalkThroughRunsAsShown) {
  // The README's walk-through, command by command, as written there: each
  // command's output must contain what the README shows after it.
  std::ifstream in(std::string(MODELSTATE_SOURCE_DIR) + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), {});
  size_t start = readme.find("A walk-through. Start three policy subscribers");
  ASSERT_NE(start, std::string::npos);
  size_t open = readme.find("```\n", start);
  ASSERT_NE(open, std::string::npos);
  open += 4;
  size_t close = readme.find("```", open);
  ASSERT_NE(close, std::string::npos);
  struct Step {
    std::string command;
    std::vector<std::string> shown;
  };
  std::vector<Step> steps;
  for (absl::string_view line : absl::StrSplit(
           readme.substr(open, close - open), '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "$ ")) {
      steps.push_back({std::string(line.substr(2)), {}});
    } else {
      ASSERT_FALSE(steps.empty()) << line;
      steps.back().shown.emplace_back(line);
    }
  }
  ASSERT_EQ(steps.size(), 8u);
  const std::filesystem::path dir = server_->dir();
  std::vector<std::unique_ptr<BackgroundProcess>> subscribers;
  for (const Step& step : steps) {
    SCOPED_TRACE(step.command);
    std::vector<std::string> argv =
        absl::StrSplit(step.command, ' ', absl::SkipEmpty());
    if (argv[0] == "cat") {
      std::ofstream(dir / argv[1]) << absl::StrJoin(step.shown, "\n") << "\n";
      continue;
    }
    ASSERT_EQ(argv[0], "modelstatectl");
    argv[0] = MODELSTATE_CLI_BINARY;
    for (std::string& arg : argv) {
      if (absl::StartsWith(arg, "deploy/")) {
        arg = absl::StrCat(MODELSTATE_SOURCE_DIR, "/", arg);
      } else if (absl::EndsWith(arg, ".json")) {
        arg = (dir / arg).string();
      }
    }
    if (argv.back() == "&") {
      argv.pop_back();
      argv.insert(argv.begin() + 1, {"--server", server_->address()});
      subscribers.push_back(std::make_unique<BackgroundProcess>(argv));
      for (const std::string& shown : step.shown) {
        EXPECT_TRUE(subscribers.back()->WaitForLine(shown)) << shown;
      }
      continue;
    }
    CommandResult r =
        RunCommand(argv, {"MODELSTATE_SERVER=" + server_->address()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string out = Normalise(r.out);
    // The subscribers print to the same terminal: collect their lines.
    for (auto& sub : subscribers) {
      sub->WaitForLine("\x01", std::chrono::milliseconds(300));
    }
    for (const std::string& shown : step.shown) {
      if (absl::StrContains(shown, " -> ")) {
        bool printed = false;
        for (auto& sub : subscribers) {
          for (const std::string& line : sub->lines()) {
            printed |= line == shown;
          }
        }
        EXPECT_TRUE(printed) << "no subscriber printed: " << shown;
      } else {
        EXPECT_THAT(out, HasSubstr(Normalise(shown))) << r.out;
      }
    }
  }
}

class SlowReaderTest : public SubscriptionTest {
 protected:
  SlowReaderTest() {
    configure_ = [](server::ServerConfig& config) {
      config.limits.max_queued_events = 4;
    };
  }
};

TEST_F(SlowReaderTest, ASubscriberThatStopsReadingIsDroppedNotBuffered) {
  auto stuck = Rogue(
      {"--name=stuck", "--mode=silent", "--timeout_ms=60000", "--fail_open"});
  std::string json = R"({"type": "Big", "members": [)";
  for (int i = 0; i < 3000; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [1]}})");
  }
  json += "]}";
  auto start = std::chrono::steady_clock::now();
  ASSERT_THAT(client_->BuildModule(BuildRequest("slow/big", json)), IsOk());
  // Dropped long before its 60 s timeout; fail-open keeps everything.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  grpc::ClientContext context;
  v1::ListSubscribersResponse list;
  ASSERT_TRUE(client_->stub().ListSubscribers(&context, {}, &list).ok());
  EXPECT_EQ(list.subscribers_size(), 0);
  EXPECT_EQ(State("slow/big").tensors.size(), 3000u);
}

// An observer with data that reads only its ack: the events waiting for it
// are bounded in bytes (here 4 MiB: four 1 MiB tensors), not only in
// number, and it is dropped with RESOURCE_EXHAUSTED naming the limit.
TEST(SlowReaderBytesTest, AQueueOfTensorDataIsBoundedInBytes) {
  InProcessServer server([](server::ServerConfig& config) {
    config.limits.max_subscriber_queue_bytes = 4 << 20;
  });
  ASSERT_THAT(server.Start(), IsOk());
  // Over TCP, so that a client that does not read holds the server back.
  auto stub = v1::ModelStateService::NewStub(grpc::CreateChannel(
      server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  auto stream = stub->Subscribe(&context);
  v1::SubscribeRequest subscribe;
  subscribe.mutable_subscription()->set_name("stalled");
  subscribe.mutable_subscription()->set_mode(v1::Subscription::MODE_OBSERVE);
  subscribe.mutable_subscription()->set_include_data(true);
  subscribe.mutable_subscription()->set_max_data_bytes(2 << 20);
  ASSERT_TRUE(stream->Write(subscribe));
  v1::SubscribeResponse ack;
  ASSERT_TRUE(stream->Read(&ack));
  ASSERT_TRUE(ack.has_ack());
  // 48 parameters of 1 MiB: far more than the socket buffers hold.
  std::string json = R"({"type": "Big", "members": [)";
  for (int i = 0; i < 48; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [262144]}})");
  }
  json += "]}";
  std::unique_ptr<client::ModelStateClient> c = server.NewClient();
  ASSERT_THAT(c->BuildModule(BuildRequest("slow/big", json)), IsOk());
  int events = 0;
  v1::SubscribeResponse event;
  while (stream->Read(&event)) ++events;
  grpc::Status status = stream->Finish();
  EXPECT_LT(events, 48);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--max_subscriber_queue_mib"));
}

// Writes completing while four builds queue events from their own threads
// and the queue overflows: the stream must never write a freed message or
// write after Finish. A stress test (20 rounds), for the ASan pass above
// all; a broken stream takes the server down.
TEST_F(SlowReaderTest, OverflowsRacingWithWritesLeaveTheServerUp) {
  std::string json = R"({"type": "Net", "members": [)";
  for (int i = 0; i < 50; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [1]}})");
  }
  json += "]}";
  int dropped = 0;
  for (int round = 0; round < 20; ++round) {
    auto slow =
        Rogue({"--name=slow", "--mode=approve", "--delay_ms=1", "--fail_open"});
    std::vector<std::thread> builders;
    for (int t = 0; t < 4; ++t) {
      builders.emplace_back([&, t] {
        std::unique_ptr<client::ModelStateClient> c = server_->NewClient();
        EXPECT_THAT(c->BuildModule(BuildRequest(
                        absl::StrCat("race/r", round, "t", t), json)),
                    IsOk());
      });
    }
    for (std::thread& b : builders) b.join();
    ASSERT_THAT(client_->Health(), IsOk()) << "round " << round;
    grpc::ClientContext context;
    v1::ListSubscribersResponse list;
    ASSERT_TRUE(client_->stub().ListSubscribers(&context, {}, &list).ok());
    if (list.subscribers_size() == 0) ++dropped;
  }
  // The queue did overflow (the subscriber was dropped) in some rounds.
  EXPECT_GT(dropped, 0);
  std::cout << "rounds where the slow subscriber was dropped: " << dropped
            << " of 20\n";
}

}  // namespace
}  // namespace modelstate
