// The subscriber hub with simulated remote subscribers (each answers from
// its own thread, as a network peer would).
#include "service/subscriber_hub.h"

#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/metrics.h"
#include "core/generator.h"
#include "core/init.h"
#include "core/storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/module_spec.h"
#include "service/limits.h"
#include "service/model_store.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::IsOkAndHolds;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// nullopt: never answer.
using AnswerFn =
    std::function<std::optional<SubscriberAnswer>(const HookEvent&)>;

SubscriberAnswer Verdict_(const HookEvent& e, Verdict v,
                          std::string reason = "") {
  SubscriberAnswer a;
  a.event_id = e.event_id;
  a.verdict = v;
  a.reason = std::move(reason);
  return a;
}

// A remote subscriber: events arrive through Send, a worker thread answers.
class FakeSubscriber : public SubscriberChannel,
                       public std::enable_shared_from_this<FakeSubscriber> {
 public:
  FakeSubscriber(SubscriberHub* hub, AnswerFn fn)
      : hub_(hub), fn_(std::move(fn)) {}
  ~FakeSubscriber() override { StopWorker(); }

  absl::Status Attach(SubscriptionSpec spec) {
    absl::StatusOr<uint64_t> id =
        hub_->Attach(std::move(spec), shared_from_this(), {});
    if (!id.ok()) return id.status();
    id_ = *id;
    worker_ = std::thread([this] { Work(); });
    return absl::OkStatus();
  }
  void Detach() { hub_->Detach(id_, {}); }

  void Send(std::shared_ptr<const HookEvent> event) override {
    MutexLock lock(&mu_);
    // Seen on arrival, so that a test that waited for its events finds
    // them here whether or not the worker has taken them yet (it used to
    // read events()[0] of an empty list now and then, and crash).
    seen_.push_back(*event);
    queue_.push_back(std::move(event));
    ++received_;
    max_outstanding_ = std::max(max_outstanding_, received_ - answered_);
    cv_.SignalAll();
  }
  void Close(absl::Status status) override {
    MutexLock lock(&mu_);
    closed_ = status;
  }

  std::vector<HookEvent> events() {
    MutexLock lock(&mu_);
    return seen_;
  }
  int max_outstanding() {
    MutexLock lock(&mu_);
    return max_outstanding_;
  }
  // Waits until `n` events have arrived or `timeout` passed; returns the count.
  int WaitUntilReceived(int n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + timeout;
    while (received_ < n && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    return received_;
  }
  absl::Status closed() {
    MutexLock lock(&mu_);
    return closed_;
  }
  uint64_t id() const { return id_; }
  void StopWorker() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    if (worker_.joinable()) worker_.join();
  }

 private:
  void Work() {
    while (true) {
      std::shared_ptr<const HookEvent> e;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stop_) cv_.Wait(&mu_);
        if (stop_) return;
        e = queue_.front();
        queue_.pop_front();
      }
      std::optional<SubscriberAnswer> a = fn_(*e);
      {
        MutexLock lock(&mu_);
        ++answered_;
      }
      if (a.has_value()) hub_->Answer(id_, *a);
    }
  }

  SubscriberHub* hub_;
  AnswerFn fn_;
  uint64_t id_ = 0;
  std::thread worker_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<const HookEvent>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<HookEvent> seen_ ABSL_GUARDED_BY(mu_);
  int received_ ABSL_GUARDED_BY(mu_) = 0;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int max_outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

SubscriptionSpec Spec(std::string name,
                      SubscriberMode mode = SubscriberMode::kIntercept,
                      int priority = 0) {
  SubscriptionSpec s;
  s.name = std::move(name);
  s.mode = mode;
  s.priority = priority;
  s.timeout = absl::Seconds(20);
  return s;
}

class HubTest : public ::testing::Test {
 protected:
  HubTest() { store_.set_decider(&hub_); }
  ~HubTest() override {
    for (auto& s : subscribers_) s->StopWorker();
  }

  std::shared_ptr<FakeSubscriber> Add(SubscriptionSpec spec, AnswerFn fn) {
    auto s = std::make_shared<FakeSubscriber>(&hub_, std::move(fn));
    EXPECT_THAT(s->Attach(std::move(spec)), IsOk());
    subscribers_.push_back(s);
    return s;
  }

  absl::StatusOr<BuildOutcome> Build(const std::string& name,
                                     const std::string& json,
                                     bool all_or_nothing = false) {
    BuildOptions o;
    o.hooks = nullptr;
    return store_.Build({"alice", "req-1"}, *ParseModuleName(name),
                        SpecFromJson(json), o, all_or_nothing);
  }

  StateDict State(const std::string& name) {
    return store_.Snapshot(*ParseModuleName(name), {})->state;
  }

  SubscriberHub hub_;
  ModelStore store_;
  std::vector<std::shared_ptr<FakeSubscriber>> subscribers_;
};

constexpr char kNet[] = R"({"type": "Net", "members": [
    {"module": {"name": "fc", "spec": {"type": "Linear", "args": [3, 2]}}},
    {"buffer": {"name": "temp_buffer", "shape": [1]}},
    {"parameter": {"name": "_scale", "shape": [1], "dtype": "float64",
                   "init": {"kind": "ones"}}}]})";

TEST_F(HubTest, WithoutSubscribersTheInProcessDecisionStands) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/net", kNet));
  ASSERT_EQ(b.registrations.size(), 5u);
  for (const auto& r : b.registrations)
    EXPECT_EQ(r.final.kind, HookResult::Kind::kKeep);
}

TEST_F(HubTest, InterceptorsApproveRejectAndModify) {
  Add(Spec("policy"),
      [](const HookEvent& e) -> std::optional<SubscriberAnswer> {
        if (e.name == "temp_buffer")
          return Verdict_(e, Verdict::kReject, "Blocking temporary buffer");
        if (e.name == "_scale") {
          SubscriberAnswer a = Verdict_(e, Verdict::kModify);
          a.transform = Transform{DType::kFloat32, std::nullopt, false,
                                  std::nullopt, std::nullopt};
          return a;
        }
        return Verdict_(e, Verdict::kApprove);
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/net", kNet));
  StateDict sd = State("t/net");
  EXPECT_THAT(sd.tensors.Keys(), ElementsAre("_scale", "fc.weight", "fc.bias"));
  const RegistrationResult& temp = b.registrations[3];
  EXPECT_TRUE(temp.final.blocked());
  EXPECT_EQ(temp.final.reason, "rejected by policy: Blocking temporary buffer");
  const RegistrationResult& scale = b.registrations[4];
  EXPECT_EQ(scale.final.kind, HookResult::Kind::kReplace);
  EXPECT_EQ(scale.final.value.tensor.dtype(), DType::kFloat32);
  EXPECT_FALSE(scale.final.value.tensor.requires_grad());
  EXPECT_EQ(sd.tensors.Find("_scale")->dtype(), DType::kFloat32);
}

TEST_F(HubTest, ChainRunsInPriorityThenSubscriptionOrderAndSeesEarlierSteps) {
  std::vector<std::string> calls;
  Mutex calls_mu;
  auto record = [&](const std::string& who, Verdict v) {
    return [&, who, v](const HookEvent& e) -> std::optional<SubscriberAnswer> {
      {
        MutexLock lock(&calls_mu);
        calls.push_back(absl::StrCat(who, ":", e.name, ":", e.chain.size()));
      }
      SubscriberAnswer a = Verdict_(e, v);
      if (v == Verdict::kModify) {
        a.transform = Transform{DType::kFloat64, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt};
      }
      return a;
    };
  };
  Add(Spec("b", SubscriberMode::kIntercept, 5), record("b", Verdict::kApprove));
  Add(Spec("a", SubscriberMode::kIntercept, 1), record("a", Verdict::kModify));
  auto c = Add(Spec("c", SubscriberMode::kIntercept, 5),
               record("c", Verdict::kApprove));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b,
                                  Build("t/one", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  EXPECT_THAT(calls, ElementsAre("a:w:0", "b:w:1", "c:w:2"));
  // Later interceptors see the modified value and what came before.
  std::vector<HookEvent> seen = c->events();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].value.tensor.dtype(), DType::kFloat64);
  EXPECT_EQ(seen[0].chain[0].subscriber, "a");
  EXPECT_EQ(seen[0].chain[0].verdict, "modify");
  EXPECT_EQ(b.registrations[0].final.value.tensor.dtype(), DType::kFloat64);
}

TEST_F(HubTest, TimeoutsApplyTheFailurePolicy) {
  SubscriptionSpec closed = Spec("silent-closed");
  closed.timeout = absl::Milliseconds(50);
  Add(closed,
      [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  auto start = absl::Now();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/closed", kNet));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& r : b.registrations) {
    EXPECT_TRUE(r.final.blocked());
    EXPECT_THAT(r.final.reason,
                AllOf(HasSubstr("silent-closed timed out after 50ms"),
                      HasSubstr("(fail-closed)")));
  }
  // Blocked everywhere: the module holds nothing.
  EXPECT_TRUE(State("t/closed").tensors.empty());
}

// A subscription that leaves its timeout 0 gets the hub's default, which
// is Limits' unless the hub is given another.
TEST(HubDefaultsTest, ASubscriptionWithoutATimeoutGetsTheHubsDefault) {
  auto silent = [](const HookEvent&) {
    return std::optional<SubscriberAnswer>();
  };
  SubscriptionSpec spec = Spec("silent");
  spec.timeout = absl::ZeroDuration();
  {
    SubscriberHub hub;
    auto s = std::make_shared<FakeSubscriber>(&hub, silent);
    ASSERT_THAT(s->Attach(spec), IsOk());
    ASSERT_EQ(hub.List().size(), 1u);
    EXPECT_EQ(hub.List()[0].spec.timeout, Limits().subscriber_timeout);
    EXPECT_EQ(Limits().subscriber_timeout, absl::Seconds(10));
    s->StopWorker();
  }
  SubscriberHub hub(nullptr, absl::Milliseconds(40));
  ModelStore store;
  store.set_decider(&hub);
  auto s = std::make_shared<FakeSubscriber>(&hub, silent);
  ASSERT_THAT(s->Attach(spec), IsOk());
  EXPECT_EQ(hub.List()[0].spec.timeout, absl::Milliseconds(40));
  BuildOptions options;
  options.hooks = nullptr;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, store.Build({"alice", "req-1"}, *ParseModuleName("t/d"),
                                  SpecFromJson(kNet), options, false));
  ASSERT_FALSE(b.registrations.empty());
  for (const auto& r : b.registrations) {
    EXPECT_THAT(r.final.reason, HasSubstr("silent timed out after 40ms"));
  }
  s->StopWorker();
}

TEST_F(HubTest, FailOpenApprovesAndTheChainGoesOn) {
  SubscriptionSpec open = Spec("silent-open");
  open.timeout = absl::Milliseconds(50);
  open.failure_policy = FailurePolicy::kFailOpen;
  Add(open, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  auto next =
      Add(Spec("next", SubscriberMode::kIntercept, 1),
          [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/open", kNet));
  for (const auto& r : b.registrations) EXPECT_FALSE(r.final.blocked());
  ASSERT_FALSE(next->events().empty());
  EXPECT_EQ(next->events()[0].chain[0].verdict, "failed-open");
}

// What operators see (server/metrics.h): each answer's round trip and each
// timeout, by subscriber name.
TEST_F(HubTest, MetricsCountRoundTripsAndTimeoutsBySubscriber) {
  metrics::Registry registry;
  metrics::Family<metrics::Histogram>& round_trip = registry.AddHistogram(
      "rt_seconds", "Round trips.", {"subscriber"}, metrics::LatencyBuckets());
  metrics::Family<metrics::Counter>& timeouts =
      registry.AddCounter("timeouts_total", "Timeouts.", {"subscriber"});
  hub_.set_metrics(&round_trip, &timeouts);
  SubscriptionSpec open = Spec("silent-open");
  open.timeout = absl::Milliseconds(50);
  open.failure_policy = FailurePolicy::kFailOpen;
  Add(open, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  Add(Spec("quick", SubscriberMode::kIntercept, 1),
      [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/metrics", kNet));
  ASSERT_EQ(b.registrations.size(), 5u);
  // Every event was answered by "quick" once "silent-open" let it pass.
  EXPECT_EQ(round_trip.Labels({"quick"}).Take().count, 5u);
  EXPECT_EQ(round_trip.Labels({"silent-open"}).Take().count, 0u);
  // The five events were pipelined: the oldest timed out and the rest
  // failed with it, one timeout.
  EXPECT_EQ(timeouts.Labels({"silent-open"}).value(), 1u);
  EXPECT_EQ(timeouts.Labels({"quick"}).value(), 0u);
}

TEST_F(HubTest, ADisconnectMidEventAppliesThePolicy) {
  std::atomic<bool> got{false};
  auto s = Add(Spec("leaver"), [&](const HookEvent&) {
    got = true;
    return std::optional<SubscriberAnswer>();
  });
  std::thread leaving([&] {
    while (!got) std::this_thread::yield();
    s->Detach();
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/leave", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  leaving.join();
  ASSERT_EQ(b.registrations.size(), 1u);
  EXPECT_TRUE(b.registrations[0].final.blocked());
  EXPECT_THAT(b.registrations[0].final.reason,
              HasSubstr("leaver disconnected"));
}

TEST_F(HubTest, InvalidAnswersCountAsFailures) {
  // A replacement of the wrong shape for a built-in layer.
  Add(Spec("bad-shape"),
      [](const HookEvent& e) -> std::optional<SubscriberAnswer> {
        SubscriberAnswer a = Verdict_(e, Verdict::kModify);
        a.replacement = *Tensor::Zeros(DType::kFloat32, {7});
        return a;
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b,
      Build("t/shape", R"({"type": "Linear", "args": [3, 2]})"));
  EXPECT_TRUE(b.registrations[0].final.blocked());
  EXPECT_THAT(b.registrations[0].final.reason,
              HasSubstr("sent an invalid answer: shape must stay [2, 3]"));
}

TEST_F(HubTest, AnAnswerForAnUnknownEventFailsWhatTheSubscriberHolds) {
  SubscriptionSpec spec = Spec("garbage");
  spec.failure_policy = FailurePolicy::kFailOpen;
  Add(spec, [](const HookEvent& e) -> std::optional<SubscriberAnswer> {
    SubscriberAnswer a = Verdict_(e, Verdict::kReject);
    a.event_id = e.event_id + 1000000;
    return a;
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/garbage", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  EXPECT_FALSE(b.registrations[0].final.blocked());  // fail-open
  // The reject for a wrong id was not applied.
  EXPECT_THAT(State("t/garbage").tensors.Keys(), ElementsAre("w"));
}

TEST_F(HubTest, DryRunIsRecordedButNeitherEnforcedNorAwaited) {
  Add(Spec("dry", SubscriberMode::kDryRun), [](const HookEvent& e) {
    return Verdict_(e, Verdict::kReject, "would block");
  });
  auto never =
      Add(Spec("dry-silent", SubscriberMode::kDryRun),
          [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  auto start = absl::Now();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/dry", kNet));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& r : b.registrations) EXPECT_FALSE(r.final.blocked());
  EXPECT_EQ(State("t/dry").tensors.size(), 4u);
}

TEST_F(HubTest, ObserversReceiveFinalOutcomes) {
  Add(Spec("blocker"), [](const HookEvent& e) {
    return Verdict_(e, e.name == "bias" ? Verdict::kReject : Verdict::kApprove,
                    "no bias");
  });
  auto watcher =
      Add(Spec("watcher", SubscriberMode::kObserve),
          [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  ASSERT_THAT(Build("t/obs", R"({"type": "Linear", "args": [3, 2]})"), IsOk());
  // Observers are never awaited: wait for the worker to have seen both.
  for (int i = 0; i < 1000 && watcher->events().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<HookEvent> seen = watcher->events();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].is_outcome);
  EXPECT_EQ(seen[0].outcome, HookResult::Kind::kKeep);
  EXPECT_EQ(seen[1].outcome, HookResult::Kind::kBlock);
  EXPECT_EQ(seen[1].outcome_reason, "rejected by blocker: no bias");
}

// A chain names an earlier interceptor, and gives its reason, only to a
// subscriber that ListSubscribers would show it to (MayLearnOf): a team's
// reviewer learns that an admin's subscriber rejected or modified, not who
// it is nor why.
TEST_F(HubTest, AChainNamesOnlySubscribersTheRecipientMayLearnOf) {
  auto team = [](std::string name, SubscriberMode mode, int priority) {
    SubscriptionSpec spec = Spec(std::move(name), mode, priority);
    spec.visible_namespaces = {"t"};
    spec.learns_of = {"t"};
    return spec;
  };
  // An admin's: sees every namespace (learns_of stays "*").
  Add(Spec("admin-policy", SubscriberMode::kIntercept, 0),
      [](const HookEvent& e) {
        if (e.name == "bias") {
          return Verdict_(e, Verdict::kReject, "admin secret: no biases");
        }
        SubscriberAnswer a = Verdict_(e, Verdict::kModify, "admin cast");
        a.transform = Transform{DType::kFloat64, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt};
        return a;
      });
  // The team's own, which the team may learn of.
  Add(team("team-first", SubscriberMode::kIntercept, 1),
      [](const HookEvent& e) {
        return Verdict_(e, Verdict::kApprove, "team reason");
      });
  auto gate =
      Add(team("team-gate", SubscriberMode::kIntercept, 2),
          [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  auto no_answer = [](const HookEvent&) {
    return std::optional<SubscriberAnswer>();
  };
  auto team_watch =
      Add(team("team-watch", SubscriberMode::kObserve, 0), no_answer);
  auto admin_watch =
      Add(Spec("admin-watch", SubscriberMode::kObserve), no_answer);
  ASSERT_THAT(Build("t/hidden", R"({"type": "Linear", "args": [3, 2]})"),
              IsOk());

  std::vector<HookEvent> gated = gate->events();
  ASSERT_EQ(gated.size(), 1u);  // the bias was rejected before its turn
  EXPECT_EQ(gated[0].name, "weight");
  ASSERT_EQ(gated[0].chain.size(), 2u);
  EXPECT_EQ(gated[0].chain[0].subscriber, kHiddenSubscriber);
  EXPECT_EQ(gated[0].chain[0].verdict, "modify");
  EXPECT_EQ(gated[0].chain[0].reason, "");
  EXPECT_EQ(gated[0].chain[1].subscriber, "team-first");
  EXPECT_EQ(gated[0].chain[1].reason, "team reason");
  // What the admin's subscriber did is still done.
  EXPECT_EQ(gated[0].value.tensor.dtype(), DType::kFloat64);

  for (int i = 0; i < 1000 && (team_watch->events().size() < 2 ||
                               admin_watch->events().size() < 2);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<HookEvent> team_seen = team_watch->events();
  ASSERT_EQ(team_seen.size(), 2u);
  EXPECT_EQ(team_seen[0].name, "weight");
  EXPECT_EQ(team_seen[0].outcome_reason, "modified by (hidden)");
  ASSERT_EQ(team_seen[0].chain.size(), 3u);
  EXPECT_EQ(team_seen[0].chain[0].subscriber, kHiddenSubscriber);
  EXPECT_EQ(team_seen[0].chain[2].subscriber, "team-gate");
  EXPECT_EQ(team_seen[1].name, "bias");
  EXPECT_EQ(team_seen[1].outcome, HookResult::Kind::kBlock);
  EXPECT_EQ(team_seen[1].outcome_reason, "rejected by (hidden)");
  ASSERT_EQ(team_seen[1].chain.size(), 1u);
  EXPECT_EQ(team_seen[1].chain[0].subscriber, kHiddenSubscriber);
  EXPECT_EQ(team_seen[1].chain[0].verdict, "reject");
  EXPECT_EQ(team_seen[1].chain[0].reason, "");

  // Whoever may learn of every subscriber sees the chain in full.
  std::vector<HookEvent> admin_seen = admin_watch->events();
  ASSERT_EQ(admin_seen.size(), 2u);
  EXPECT_EQ(admin_seen[0].outcome_reason, "modified by admin-policy");
  EXPECT_EQ(admin_seen[0].chain[0].subscriber, "admin-policy");
  EXPECT_EQ(admin_seen[0].chain[0].reason, "admin cast");
  EXPECT_EQ(admin_seen[1].outcome_reason,
            "rejected by admin-policy: admin secret: no biases");
  EXPECT_EQ(admin_seen[1].chain[0].reason, "admin secret: no biases");
}

// A name bound to another identity is refused with the field named; its
// owner is named only to a caller that may learn of the subscriber under
// it (as ListSubscribers would list it), or, with none connected, of every
// subscriber. Otherwise trying names would tell who watches what.
TEST_F(HubTest, ATakenNameNamesItsOwnerOnlyToWhoMayLearnOfIt) {
  auto approve = [](const HookEvent& e) {
    return Verdict_(e, Verdict::kApprove);
  };
  SubscriptionSpec owned = Spec("guard");
  owned.owner_identity = "root";
  owned.filter.namespaces = {"t"};
  auto guard = Add(owned, approve);
  auto attach = [&](const std::string& identity,
                    std::vector<std::string> learns_of) {
    SubscriptionSpec spec = Spec("guard");
    spec.owner_identity = identity;
    spec.learns_of = std::move(learns_of);
    auto s = std::make_shared<FakeSubscriber>(&hub_, approve);
    subscribers_.push_back(s);
    return s->Attach(std::move(spec));
  };
  const auto hidden =
      StatusIs(absl::StatusCode::kPermissionDenied,
               AllOf(HasSubstr("name: subscriber 'guard' is taken by another "
                               "identity; 'bob' may not take its place"),
                     Not(HasSubstr("root"))));
  const auto named =
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("name: subscriber 'guard' belongs to 'root'"));
  // Another team's reviewer may not learn of a subscriber that sees t.
  EXPECT_THAT(attach("bob", {"u"}), hidden);
  // t's own reviewer may, as its chains and ListSubscribers name it.
  EXPECT_THAT(attach("rev", {"t"}), named);
  EXPECT_THAT(attach("adm", {"*"}), named);
  // Bound with nobody connected: only who may learn of everything.
  guard->Detach();
  EXPECT_THAT(attach("bob", {"t"}), hidden);
  EXPECT_THAT(attach("adm", {"*"}), named);
  // The owner still takes it back.
  EXPECT_THAT(attach("root", {"*"}), IsOk());
}

// A failure names the subscriber in its reason: hidden alike.
TEST_F(HubTest, AHiddenSubscribersFailureIsNotNamedToTheTeam) {
  SubscriptionSpec silent = Spec("admin-silent");
  silent.timeout = absl::Milliseconds(50);
  silent.failure_policy = FailurePolicy::kFailOpen;
  Add(silent,
      [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  SubscriptionSpec gate_spec = Spec("team-gate", SubscriberMode::kIntercept, 1);
  gate_spec.visible_namespaces = {"t"};
  gate_spec.learns_of = {"t"};
  auto gate = Add(gate_spec, [](const HookEvent& e) {
    return Verdict_(e, Verdict::kApprove);
  });
  ASSERT_THAT(Build("t/failed", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"),
              IsOk());
  std::vector<HookEvent> seen = gate->events();
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_EQ(seen[0].chain.size(), 1u);
  EXPECT_EQ(seen[0].chain[0].subscriber, kHiddenSubscriber);
  EXPECT_EQ(seen[0].chain[0].verdict, "failed-open");
  EXPECT_EQ(seen[0].chain[0].reason, "");
}

// ListSubscribers' rule, which chains share.
TEST(MayLearnOfTest, TheCallerMustCoverEveryNamespaceTheSubscriberSees) {
  SubscriptionSpec everywhere;
  EXPECT_EQ(NamespacesSeenBy(everywhere), std::vector<std::string>{"*"});
  SubscriptionSpec team;
  team.visible_namespaces = {"a", "b"};
  team.filter.namespaces = {"b", "c"};  // "c" is never sent to it
  EXPECT_EQ(NamespacesSeenBy(team), std::vector<std::string>{"b"});
  team.filter.namespaces.clear();
  EXPECT_EQ(NamespacesSeenBy(team), (std::vector<std::string>{"a", "b"}));
  SubscriptionSpec filtered;
  filtered.filter.namespaces = {"b"};
  EXPECT_EQ(NamespacesSeenBy(filtered), std::vector<std::string>{"b"});

  EXPECT_TRUE(MayLearnOf({"*"}, {"*"}));
  EXPECT_FALSE(MayLearnOf({"a", "b"}, {"*"}));
  EXPECT_TRUE(MayLearnOf({"a", "b"}, {"a", "b"}));
  EXPECT_FALSE(MayLearnOf({"a"}, {"a", "b"}));
  EXPECT_TRUE(MayLearnOf({"b"}, {"b"}));
}

TEST_F(HubTest, FiltersSelectEvents) {
  SubscriptionSpec spec = Spec("picky");
  spec.filter.kinds = {EntryKind::kBuffer};
  spec.filter.name_glob = "temp_*";
  spec.filter.namespaces = {"t"};
  auto picky = Add(
      spec, [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  SubscriptionSpec other_ns = Spec("elsewhere");
  other_ns.filter.namespaces = {"other"};
  auto elsewhere = Add(other_ns, [](const HookEvent& e) {
    return Verdict_(e, Verdict::kReject);
  });
  SubscriptionSpec types = Spec("linear-only");
  types.filter.module_type_glob = "Lin*";
  types.filter.actions = {RegistrationAction::kRegister};
  auto linear = Add(
      types, [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  ASSERT_THAT(Build("t/filters", kNet), IsOk());
  ASSERT_EQ(picky->events().size(), 1u);
  EXPECT_EQ(picky->events()[0].name, "temp_buffer");
  EXPECT_TRUE(elsewhere->events().empty());
  EXPECT_EQ(linear->events().size(), 2u);  // fc.weight, fc.bias
}

TEST_F(HubTest, EventsCarryMetadataHashAndOptionalData) {
  SubscriptionSpec spec = Spec("data");
  spec.include_data = true;
  spec.max_data_bytes = 16;
  auto s = Add(
      spec, [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  ASSERT_THAT(Build("t/data", R"({"type": "Linear", "args": [3, 2]})"), IsOk());
  std::vector<HookEvent> seen = s->events();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].identity, "alice");
  EXPECT_EQ(seen[0].correlation_id, "req-1");
  EXPECT_EQ(seen[0].ns, "t");
  EXPECT_EQ(seen[0].module, "data");
  EXPECT_EQ(seen[0].module_type, "Linear");
  EXPECT_FALSE(seen[0].data_included);  // 24 bytes > 16
  EXPECT_TRUE(seen[1].data_included);   // 8 bytes
  EXPECT_EQ(seen[1].value_sha256, ContentHash(seen[1].value.tensor));
  EXPECT_EQ(seen[1].value_sha256.size(), 64u);
}

TEST_F(HubTest, ReconnectingUnderTheSameNameKeepsThePlaceAndThePendingEvents) {
  std::atomic<int> first_seen{0};
  auto first =
      Add(Spec("same", SubscriberMode::kIntercept, 0), [&](const HookEvent&) {
        ++first_seen;
        return std::optional<SubscriberAnswer>();  // never answers
      });
  auto later =
      Add(Spec("later", SubscriberMode::kIntercept, 0),
          [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  std::thread reconnect([&] {
    while (first_seen == 0) std::this_thread::yield();
    Add(Spec("same", SubscriberMode::kIntercept, 0), [](const HookEvent& e) {
      return Verdict_(e, Verdict::kApprove, "second connection");
    });
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/reconnect", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  reconnect.join();
  EXPECT_FALSE(b.registrations[0].final.blocked());
  EXPECT_THAT(first->closed(), StatusIs(absl::StatusCode::kAborted));
  // "same" kept its place ahead of "later".
  ASSERT_EQ(later->events().size(), 1u);
  EXPECT_EQ(later->events()[0].chain[0].subscriber, "same");
  EXPECT_EQ(later->events()[0].chain[0].reason, "second connection");
}

// A build on a thread of its own, so that a test can act while the hub
// waits for its subscribers.
class BuildInBackground {
 public:
  explicit BuildInBackground(std::function<absl::StatusOr<BuildOutcome>()> fn)
      : thread_([this, fn = std::move(fn)] {
          result_ = fn();
          done_.Notify();
        }) {}
  ~BuildInBackground() {
    if (thread_.joinable()) thread_.join();
  }
  bool WaitFor(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout);
  }
  // Waits for the build to end.
  absl::StatusOr<BuildOutcome> Result() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  absl::Notification done_;
  absl::StatusOr<BuildOutcome> result_;
  std::thread thread_;
};

constexpr char kOneParameter[] = R"({"type": "Net", "members": [
    {"parameter": {"name": "w", "shape": [2]}}]})";

struct ReconnectCase {
  SubscriberMode mode;
  FailurePolicy policy;
  std::string reason;  // of the block; "" when the event is kept
};

void PrintTo(const ReconnectCase& c, std::ostream* os) {
  *os << (c.mode == SubscriberMode::kDryRun ? "dry-run" : "observe") << ", "
      << (c.policy == FailurePolicy::kFailOpen ? "fail-open" : "fail-closed");
}

class HubReconnectInAnotherModeTest
    : public HubTest,
      public ::testing::WithParamInterface<ReconnectCase> {};

// An interceptor's name reconnecting as a dry-run subscriber or an observer
// takes over none of its held events (that connection is never awaited, and
// its answers are not the interceptor's): they fail by the interceptor's
// policy at once. Before, they moved to the new connection, which held the
// build for its own timeout (here an hour) whatever it answered.
TEST_P(HubReconnectInAnotherModeTest, HeldEventsFailByThePolicyAtOnce) {
  const ReconnectCase& c = GetParam();
  SubscriptionSpec gate = Spec("gate");
  gate.failure_policy = c.policy;
  auto first = Add(gate, [](const HookEvent&) {
    return std::optional<SubscriberAnswer>();  // never answers
  });
  BuildInBackground build([&] { return Build("t/gate", kOneParameter); });
  ASSERT_EQ(first->WaitUntilReceived(1, absl::Seconds(10)), 1);
  SubscriptionSpec back = Spec("gate", c.mode);
  back.timeout = absl::Hours(1);
  auto second = Add(back, [](const HookEvent& e) {
    return Verdict_(e, Verdict::kApprove, "from the new connection");
  });
  const bool decided = build.WaitFor(absl::Seconds(10));
  EXPECT_TRUE(decided) << "the build waits on the reconnected gate";
  if (!decided) hub_.Detach(second->id(), {});  // lets the build end
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, build.Result());
  ASSERT_EQ(b.registrations.size(), 1u);
  const HookDecision& w = b.registrations[0].final;
  if (c.reason.empty()) {
    EXPECT_EQ(w.kind, HookResult::Kind::kKeep) << w.reason;
  } else {
    EXPECT_TRUE(w.blocked());
    EXPECT_EQ(w.reason, c.reason);
  }
  EXPECT_THAT(first->closed(), StatusIs(absl::StatusCode::kAborted));
  std::vector<SubscriberInfo> list = hub_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].spec.mode, c.mode);
  EXPECT_EQ(list[0].pending, 0u);
  // Nothing was handed to the new connection to answer (an observer gets
  // the outcome).
  for (const HookEvent& e : second->events()) EXPECT_TRUE(e.is_outcome);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, HubReconnectInAnotherModeTest,
    ::testing::Values(
        ReconnectCase{SubscriberMode::kDryRun, FailurePolicy::kFailClosed,
                      "subscriber gate reconnected as a dry-run subscriber "
                      "(fail-closed)"},
        ReconnectCase{SubscriberMode::kObserve, FailurePolicy::kFailClosed,
                      "subscriber gate reconnected as an observer "
                      "(fail-closed)"},
        ReconnectCase{SubscriberMode::kDryRun, FailurePolicy::kFailOpen, ""}),
    [](const ::testing::TestParamInfo<ReconnectCase>& info) {
      return absl::StrCat(
          info.param.mode == SubscriberMode::kDryRun ? "DryRun" : "Observe",
          info.param.policy == FailurePolicy::kFailOpen ? "FailOpen"
                                                        : "FailClosed");
    });

// An event whose chain has yet to reach the interceptor when its name comes
// back in dry-run mode is not sent to that connection either.
TEST_F(HubTest, AChainDoesNotWaitForANameThatCameBackInDryRunMode) {
  std::atomic<bool> go{false};
  auto first = Add(Spec("first", SubscriberMode::kIntercept, 0),
                   [&](const HookEvent& e) {
                     absl::Time deadline = absl::Now() + absl::Seconds(20);
                     while (!go && absl::Now() < deadline)
                       absl::SleepFor(absl::Milliseconds(1));
                     return Verdict_(e, Verdict::kApprove);
                   });
  Add(Spec("gate", SubscriberMode::kIntercept, 1),
      [](const HookEvent& e) { return Verdict_(e, Verdict::kApprove); });
  BuildInBackground build([&] { return Build("t/later", kOneParameter); });
  ASSERT_EQ(first->WaitUntilReceived(1, absl::Seconds(10)), 1);
  SubscriptionSpec back = Spec("gate", SubscriberMode::kDryRun);
  back.timeout = absl::Hours(1);
  auto dry = Add(back, [](const HookEvent& e) {
    return Verdict_(e, Verdict::kApprove, "from the dry run");
  });
  go = true;
  const bool decided = build.WaitFor(absl::Seconds(10));
  EXPECT_TRUE(decided) << "the chain waits on the dry-run gate";
  if (!decided) hub_.Detach(dry->id(), {});  // lets the build end
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, build.Result());
  ASSERT_EQ(b.registrations.size(), 1u);
  EXPECT_TRUE(b.registrations[0].final.blocked());
  EXPECT_EQ(b.registrations[0].final.reason,
            "subscriber gate reconnected as a dry-run subscriber "
            "(fail-closed)");
  EXPECT_TRUE(dry->events().empty());
}

TEST_F(HubTest, ChainsOfManyEventsArePipelined) {
  // The subscriber holds its first answer until all 150 events have arrived
  // (or 10 s passed): only a pipelining hub sends them all before an answer,
  // however slowly the build runs (TSan slows it more than any sleep covers).
  constexpr int kEvents = 150;
  std::shared_ptr<FakeSubscriber> s;
  std::atomic<bool> first{true};
  s = Add(Spec("holds-first"), [&](const HookEvent& e) {
    if (first.exchange(false)) s->WaitUntilReceived(kEvents, absl::Seconds(10));
    return Verdict_(e, Verdict::kApprove);
  });
  std::string json = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < kEvents / 3; ++i) {
    absl::StrAppend(&json, i ? "," : "",
                    R"({"spec": {"type": "Linear", "args": [2, 2]}})");
  }
  json += "]}";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/pipeline", json));
  EXPECT_EQ(b.registrations.size(), static_cast<size_t>(kEvents));
  // Every event was sent before the first answer came back.
  EXPECT_EQ(s->max_outstanding(), kEvents);
}

TEST_F(HubTest, PipelinedOutcomesEqualOneAtATimeOutcomes) {
  // Four interceptors answering pseudo-randomly (but deterministically per
  // event name and subscriber).
  auto make = [](int who) {
    return [who](const HookEvent& e) -> std::optional<SubscriberAnswer> {
      size_t h =
          std::hash<std::string>()(absl::StrCat(e.path, ".", e.name, who));
      switch (h % 5) {
        case 0:
          return Verdict_(e, Verdict::kReject, absl::StrCat("by ", who));
        case 1: {
          SubscriberAnswer a = Verdict_(e, Verdict::kModify);
          InitSpec init;
          init.kind = InitSpec::Kind::kConstant;
          init.a = who;
          a.transform = Transform{std::nullopt, std::nullopt, std::nullopt,
                                  std::nullopt, init};
          return a;
        }
        default:
          return Verdict_(e, Verdict::kApprove);
      }
    };
  };
  for (int i = 0; i < 4; ++i)
    Add(Spec(absl::StrCat("s", i), SubscriberMode::kIntercept, i), make(i));
  std::string json = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < 30; ++i) {
    absl::StrAppend(&json, i ? "," : "",
                    R"({"spec": {"type": "BatchNorm1d", "args": [2]}})");
  }
  json += "]}";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome all, Build("t/all", json));
  // One at a time: the same build, one registration per Decide call.
  BuildOptions o;
  o.hooks = nullptr;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildResult built,
                                  BuildModule(SpecFromJson(json), o));
  std::vector<HookDecision> finals;
  for (const RegistrationRecord& r : built.records) {
    std::vector<HookDecision> one =
        hub_.Decide({"alice", "req-1"}, *ParseModuleName("t/all"),
                    absl::MakeConstSpan(&r, 1));
    finals.push_back(one[0]);
  }
  ASSERT_EQ(finals.size(), all.registrations.size());
  for (size_t i = 0; i < finals.size(); ++i) {
    EXPECT_EQ(finals[i].kind, all.registrations[i].final.kind) << i;
    EXPECT_EQ(finals[i].reason, all.registrations[i].final.reason) << i;
    if (!finals[i].blocked() && finals[i].value.tensor.defined()) {
      EXPECT_TRUE(TensorsEqual(finals[i].value.tensor,
                               all.registrations[i].final.value.tensor))
          << i;
    }
  }
}

TEST_F(HubTest, AllOrNothingBuildsStoreNothingWhenBlocked) {
  Add(Spec("no-bias"), [](const HookEvent& e) {
    return Verdict_(e, e.name == "bias" ? Verdict::kReject : Verdict::kApprove,
                    "no bias here");
  });
  EXPECT_THAT(
      Build("t/aon", R"({"type": "Linear", "args": [3, 2]})", true),
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          HasSubstr("registration of parameter 'bias' in the root module was "
                    "blocked: rejected by no-bias: no bias here")));
  EXPECT_EQ(store_.size(), 0u);
}

TEST_F(HubTest, SingleRegistrationsAreDecidedBeforeAnyReaderSeesThem) {
  ASSERT_THAT(Build("t/single", R"({"type": "Linear", "args": [3, 2]})"),
              IsOk());
  Add(Spec("frozen"), [](const HookEvent& e) {
    return Verdict_(e, e.name == "extra" ? Verdict::kReject : Verdict::kApprove,
                    "frozen");
  });
  RegistrationRequest r;
  r.name = "extra";
  r.kind = EntryKind::kBuffer;
  r.value.tensor = *Tensor::Zeros(DType::kFloat32, {1});
  EXPECT_THAT(store_.Register({}, *ParseModuleName("t/single"), r),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rejected by frozen: frozen")));
  EXPECT_EQ(State("t/single").tensors.size(), 2u);
}

TEST_F(HubTest, LoadWithAssignAndRemovalReachTheInterceptors) {
  ASSERT_THAT(Build("t/paths", R"({"type": "Linear", "args": [3, 2]})"),
              IsOk());
  const StateDict built = State("t/paths");
  auto guard = Add(Spec("guard"), [](const HookEvent& e) {
    const bool keep =
        e.name == "weight" && e.action == RegistrationAction::kRegister;
    return Verdict_(e, keep ? Verdict::kApprove : Verdict::kReject, "guarded");
  });
  // load_state_dict(assign=True) installs through the chain: the weight is
  // approved, the bias rejected (it keeps its built values).
  StateDict offered;
  offered.tensors.Set("weight", *Tensor::Zeros(DType::kFloat32, {2, 3}));
  offered.tensors.Set("bias", *Tensor::Zeros(DType::kFloat32, {2}));
  LoadOptions assign;
  assign.assign = true;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      LoadResult loaded,
      store_.Load({"alice", "req-2"}, *ParseModuleName("t/paths"), offered,
                  assign));
  (void)loaded;
  StateDict after = State("t/paths");
  EXPECT_TRUE(TensorsEqual(*after.tensors.Find("weight"),
                           *offered.tensors.Find("weight")));
  EXPECT_TRUE(
      TensorsEqual(*after.tensors.Find("bias"), *built.tensors.Find("bias")));
  // RemoveEntry is an unregister event; rejected, the weight stays.
  RegistrationRequest removal;
  removal.name = "weight";
  removal.kind = EntryKind::kParameter;
  removal.removal = true;
  EXPECT_THAT(store_.Register({}, *ParseModuleName("t/paths"), removal),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rejected by guard: guarded")));
  EXPECT_EQ(State("t/paths").tensors.size(), 2u);
  std::vector<std::string> seen;
  for (const HookEvent& e : guard->events()) {
    seen.push_back(absl::StrCat(RegistrationActionName(e.action), " ", e.name));
  }
  EXPECT_THAT(seen, ElementsAre("register weight", "register bias",
                                "unregister weight"));
}

TEST_F(HubTest, TheTimeoutClockStartsWhenAnEventBecomesTheOldest) {
  // Answers one event at a time, 150 ms each: 12 pipelined events take
  // 1.8 s in all, but none waits more than 150 ms once it is the oldest,
  // well within the 1 s timeout.
  SubscriptionSpec spec = Spec("slow-but-steady");
  spec.timeout = absl::Seconds(1);
  Add(spec, [](const HookEvent& e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return Verdict_(e, Verdict::kApprove);
  });
  std::string json = R"({"type": "Net", "members": [)";
  for (int i = 0; i < 12; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [1]}})");
  }
  json += "]}";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/steady", json));
  ASSERT_EQ(b.registrations.size(), 12u);
  for (const auto& r : b.registrations) {
    EXPECT_FALSE(r.final.blocked()) << r.final.reason;
  }
}

TEST_F(HubTest, ASilentSubscriberHoldsARequestForOneTimeoutNotOnePerEvent) {
  // 20 pipelined events: the oldest times out after 300 ms, and the 19 the
  // subscriber held with it fail then too, instead of 20 timeouts in turn.
  SubscriptionSpec spec = Spec("silent");
  spec.timeout = absl::Milliseconds(300);
  Add(spec, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  std::string json = R"({"type": "Net", "members": [)";
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"parameter": {"name": "p)", i,
                    R"(", "shape": [1]}})");
  }
  json += "]}";
  const absl::Time start = absl::Now();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/held", json));
  // One timeout, with room for a slow machine; one per event would be 6 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(b.registrations.size(), 20u);
  EXPECT_EQ(b.registrations[0].final.reason,
            "subscriber silent timed out after 300ms (fail-closed)");
  for (size_t i = 1; i < b.registrations.size(); ++i) {
    EXPECT_EQ(b.registrations[i].final.reason,
              "subscriber silent timed out after 300ms on an earlier event "
              "(fail-closed)")
        << i;
  }
  // A later request's first event gets its own whole timeout again.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome again, Build("t/held-again", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [1]}}]})"));
  ASSERT_EQ(again.registrations.size(), 1u);
  EXPECT_EQ(again.registrations[0].final.reason,
            "subscriber silent timed out after 300ms (fail-closed)");
}

TEST_F(HubTest, ATimeoutStillFailsEachEventOfASilentSubscriber) {
  SubscriptionSpec spec = Spec("silent");
  spec.timeout = absl::Milliseconds(40);
  Add(spec, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/silent", kNet));
  ASSERT_EQ(b.registrations.size(), 5u);
  for (const auto& r : b.registrations) {
    EXPECT_THAT(r.final.reason, HasSubstr("silent timed out after 40ms"));
  }
}

TEST_F(HubTest, AReplacementWithoutRequiresGradKeepsTheParametersFlag) {
  Add(Spec("replacer"), [](const HookEvent& e) {
    SubscriberAnswer a = Verdict_(e, Verdict::kModify);
    a.replacement = *Tensor::Zeros(DType::kFloat32, e.value.tensor.shape());
    if (e.name == "bias") a.replacement_requires_grad = false;
    return std::optional<SubscriberAnswer>(a);
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/rg", R"({"type": "Linear", "args": [3, 2]})"));
  ASSERT_EQ(b.registrations.size(), 2u);
  EXPECT_EQ(b.registrations[0].final.kind, HookResult::Kind::kReplace);
  // Not said: a parameter's default, requires_grad.
  EXPECT_TRUE(b.registrations[0].final.value.tensor.requires_grad());
  // Said false: frozen.
  EXPECT_FALSE(b.registrations[1].final.value.tensor.requires_grad());
}

// A MODIFY re-initialising fc.weight uniformly, without a seed.
std::optional<SubscriberAnswer> ReinitWithoutSeed(const HookEvent& e) {
  if (e.name != "weight") return Verdict_(e, Verdict::kApprove);
  SubscriberAnswer a = Verdict_(e, Verdict::kModify);
  Transform t;
  InitSpec init;
  init.kind = InitSpec::Kind::kUniform;
  init.a = -0.05;
  init.b = 0.05;
  t.reinit = init;
  a.transform = t;
  return a;
}

// requires_grad asked for on an integer parameter is an invalid answer, as
// torch refuses it; it used to be dropped quietly and recorded as a
// successful MODIFY.
TEST_F(HubTest, RequiresGradOnAnIntegerParameterIsAnInvalidAnswer) {
  for (bool transform : {true, false}) {
    SCOPED_TRACE(transform ? "transform" : "replacement");
    subscribers_.clear();
    auto s = Add(Spec(transform ? "t" : "r"), [&](const HookEvent& e) {
      SubscriberAnswer a = Verdict_(e, Verdict::kModify);
      if (transform) {
        a.transform = Transform{std::nullopt, std::nullopt, true, std::nullopt,
                                std::nullopt};
      } else {
        a.replacement = *Tensor::Zeros(DType::kInt64, {2});
        a.replacement_requires_grad = true;
      }
      return std::optional<SubscriberAnswer>(a);
    });
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        BuildOutcome b,
        Build(transform ? "t/int-t" : "t/int-r",
              R"({"type": "Net", "members": [{"parameter": {"name": "i",
                  "shape": [2], "dtype": "int64", "requires_grad": false}}]})"));
    ASSERT_EQ(b.registrations.size(), 1u);
    EXPECT_TRUE(b.registrations[0].final.blocked());
    EXPECT_THAT(b.registrations[0].final.reason,
                HasSubstr("needs a floating point dtype, not int64"));
    s->StopWorker();
    s->Detach();
  }
}

TEST_F(HubTest, ReinitWithoutASeedDerivesItFromTheRequestSeedAndPath) {
  Add(Spec("reinit"), ReinitWithoutSeed);
  constexpr char kSeq[] = R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [4, 3]}}]})";
  auto weight = [&](const std::string& module, uint64_t seed) {
    BuildOptions o;
    o.hooks = nullptr;
    o.seed = seed;
    EXPECT_THAT(store_.Build({"alice", "req"}, *ParseModuleName(module),
                             SpecFromJson(kSeq), o, false),
                IsOk());
    return *State(module).tensors.Find("0.weight");
  };
  Tensor a = weight("t/a", 7);
  Tensor again = weight("t/again", 7);
  Tensor other = weight("t/other", 8);
  EXPECT_TRUE(TensorsEqual(a, again));
  EXPECT_FALSE(TensorsEqual(a, other));
  // The documented derivation.
  Tensor expected = *Tensor::Zeros(DType::kFloat32, {3, 4});
  Generator gen(ReinitSeed(7, "0.weight"));
  ASSERT_THAT(UniformInit(expected, -0.05, 0.05, gen), IsOk());
  EXPECT_TRUE(TensorsEqual(a, expected));
  EXPECT_NE(ReinitSeed(7, "0.weight"), ReinitSeed(7, "1.weight"));
}

// The hub with an audit log, for what is only visible there.
class AuditedHubTest : public ::testing::Test {
 protected:
  AuditedHubTest() {
    path_ = ::testing::TempDir() + "/audited_hub_" + std::to_string(getpid()) +
            "_" + std::to_string(counter_++) + ".log";
    std::filesystem::remove(path_);
    log_ = *AuditLog::Open(path_);
    hub_ = std::make_unique<SubscriberHub>(log_.get());
    store_.set_decider(hub_.get());
    store_.set_audit_log(log_.get());
  }
  ~AuditedHubTest() override {
    for (auto& s : subscribers_) s->StopWorker();
    std::filesystem::remove(path_);  // unlinked while open: fine on POSIX
  }

  std::shared_ptr<FakeSubscriber> Add(SubscriptionSpec spec, AnswerFn fn) {
    auto s = std::make_shared<FakeSubscriber>(hub_.get(), std::move(fn));
    EXPECT_THAT(s->Attach(std::move(spec)), IsOk());
    subscribers_.push_back(s);
    return s;
  }
  absl::StatusOr<BuildOutcome> Build(const std::string& name,
                                     const std::string& json) {
    BuildOptions o;
    o.hooks = nullptr;
    return store_.Build({"alice", "req-1"}, *ParseModuleName(name),
                        SpecFromJson(json), o, false);
  }
  // The "answer" records, once there are at least `n` (waits up to 20 s:
  // answers that are not awaited arrive after the build).
  std::vector<AuditRecord> Answers(size_t n) {
    absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::vector<AuditRecord> answers;
    while (true) {
      answers.clear();
      AuditQuery q;
      q.type = "answer";
      q.limit = 10000;
      absl::StatusOr<std::vector<AuditRecord>> found = log_->Query(q);
      EXPECT_THAT(found.status(), IsOk());
      if (found.ok()) answers = *std::move(found);
      if (answers.size() >= n || absl::Now() > deadline) return answers;
      log_->WaitForRecords(log_->last_seq(), absl::Now() + absl::Seconds(1), 1)
          .IgnoreError();
    }
  }

  static inline int counter_ = 0;
  std::string path_;
  std::unique_ptr<AuditLog> log_;
  std::unique_ptr<SubscriberHub> hub_;
  ModelStore store_;
  std::vector<std::shared_ptr<FakeSubscriber>> subscribers_;
};

TEST_F(AuditedHubTest, DuplicateAnswersAreRecordedButIgnored) {
  // Approves, then says REJECT for the same event: the second answer must
  // neither block the event nor count as garbage that fails the events it
  // still holds (fail-closed would block them all).
  SubscriberHub* hub = hub_.get();
  std::shared_ptr<FakeSubscriber> self;
  self = Add(Spec("stutter"), [&](const HookEvent& e) {
    hub->Answer(self->id(), Verdict_(e, Verdict::kApprove));
    return std::optional<SubscriberAnswer>(
        Verdict_(e, Verdict::kReject, "second thoughts"));
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome b, Build("t/dup", kNet));
  ASSERT_EQ(b.registrations.size(), 5u);
  for (const auto& r : b.registrations) {
    EXPECT_FALSE(r.final.blocked()) << r.final.reason;
  }
  std::vector<AuditRecord> answers = Answers(10);
  int ignored = 0;
  for (const AuditRecord& r : answers) {
    if (r.outcome != "ignored") continue;
    ++ignored;
    nlohmann::json details = nlohmann::json::parse(r.details_json);
    EXPECT_EQ(details["subscriber"], "stutter");
    EXPECT_EQ(details["reason"], "second thoughts");
    EXPECT_THAT(details["problem"].get<std::string>(),
                HasSubstr("late or duplicate"));
  }
  EXPECT_EQ(ignored, 5);
}

TEST_F(AuditedHubTest, LateAnswersAreRecordedButIgnored) {
  // Answers REJECT after its timeout: fail-open already approved, and the
  // late reject changes nothing.
  SubscriptionSpec spec = Spec("late");
  spec.timeout = absl::Milliseconds(30);
  spec.failure_policy = FailurePolicy::kFailOpen;
  // It answers once the other two answers are in the log, not after a fixed
  // sleep: on a loaded machine "after" may take longer than any sleep.
  Add(spec, [this](const HookEvent& e) {
    Answers(2);
    return std::optional<SubscriberAnswer>(
        Verdict_(e, Verdict::kReject, "too late"));
  });
  // A second, prompt interceptor still sees every event after the late one
  // failed open (the late answer did not make it fail the rest).
  auto after =
      Add(Spec("after", SubscriberMode::kIntercept, 1), [](const HookEvent& e) {
        return std::optional<SubscriberAnswer>(Verdict_(e, Verdict::kApprove));
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/late", R"({"type": "Net", "members": [
          {"parameter": {"name": "w", "shape": [2]}}]})"));
  ASSERT_EQ(b.registrations.size(), 1u);
  EXPECT_FALSE(b.registrations[0].final.blocked());
  std::vector<AuditRecord> answers = Answers(3);
  std::vector<std::string> outcomes;
  for (const AuditRecord& r : answers) outcomes.push_back(r.outcome);
  EXPECT_THAT(outcomes, ElementsAre("failed-open", "approve", "ignored"));
  EXPECT_EQ(
      store_.Snapshot(*ParseModuleName("t/late"), {})->state.tensors.size(),
      1u);
}

TEST_F(AuditedHubTest, DryRunAnswersAreValidatedAndRecordedNotEnforced) {
  Add(Spec("dry", SubscriberMode::kDryRun),
      [](const HookEvent& e) -> std::optional<SubscriberAnswer> {
        SubscriberAnswer a = Verdict_(e, Verdict::kModify);
        // The weight gets a wrong shape (invalid for a Linear), the bias a
        // valid replacement.
        a.replacement = *Tensor::Zeros(
            DType::kFloat32, e.name == "weight" ? std::vector<int64_t>{7}
                                                : e.value.tensor.shape());
        return a;
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/dry", R"({"type": "Linear", "args": [3, 2]})"));
  for (const auto& r : b.registrations) {
    EXPECT_EQ(r.final.kind, HookResult::Kind::kKeep);
  }
  std::vector<AuditRecord> answers = Answers(2);
  ASSERT_EQ(answers.size(), 2u);
  std::map<std::string, std::string> outcome_by_event;
  for (const AuditRecord& r : answers) {
    nlohmann::json details = nlohmann::json::parse(r.details_json);
    EXPECT_EQ(details["dry_run"], true);
    outcome_by_event[r.outcome] = details.value("problem", "");
  }
  ASSERT_TRUE(outcome_by_event.contains("invalid"));
  EXPECT_THAT(outcome_by_event["invalid"], HasSubstr("shape must stay [2, 3]"));
  EXPECT_TRUE(outcome_by_event.contains("modify"));
  // Not enforced: the weight keeps its built values.
  StateDict sd = store_.Snapshot(*ParseModuleName("t/dry"), {})->state;
  EXPECT_EQ(sd.tensors.Find("weight")->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(TensorsEqual(*sd.tensors.Find("bias"),
                            *Tensor::Zeros(DType::kFloat32, {2})));
}

// A dry run is forgotten once every dry-run subscriber it went to has
// answered (or gone): it holds the module registered into, which a deleted
// module used to leave in memory for ten minutes (and until the next
// build) whenever a dry-run subscriber was connected. A second answer is
// still a duplicate, not garbage.
TEST_F(AuditedHubTest, AnsweredDryRunsDoNotKeepADeletedModuleAlive) {
  SubscriberHub* hub = hub_.get();
  std::shared_ptr<FakeSubscriber> self;
  self = Add(Spec("dry", SubscriberMode::kDryRun), [&](const HookEvent& e) {
    hub->Answer(self->id(), Verdict_(e, Verdict::kApprove));
    return std::optional<SubscriberAnswer>(Verdict_(e, Verdict::kReject));
  });
  std::weak_ptr<Module> module;
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        BuildOutcome b,
        Build("t/gone", R"({"type": "Linear", "args": [3, 2]})"));
    ASSERT_FALSE(b.registrations.empty());
    module = b.registrations[0].record.owner;
  }
  std::vector<AuditRecord> answers = Answers(4);
  std::vector<std::string> outcomes;
  for (const AuditRecord& r : answers) outcomes.push_back(r.outcome);
  EXPECT_THAT(outcomes,
              ElementsAre("approve", "ignored", "approve", "ignored"));
  ASSERT_THAT(store_.Delete({"alice", "req-2"}, *ParseModuleName("t/gone")),
              IsOk());
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!module.expired() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(module.expired()) << "the hub still holds the deleted module";
}

// A flood of stray answers (duplicates of an answered event, ids never
// sent) changes nothing and leaves the subscriber connected (ending its
// stream would let later builds skip it), but each used to write its own
// record of about 500 bytes to the log, which keeps records for good:
// 20,000 answers added 9 MB. Now the first few of an interval are recorded
// one by one, the rest in one summary, written when the subscriber leaves
// (or the interval ends, or the server stops).
TEST_F(AuditedHubTest, AFloodOfStrayAnswersIsSummarisedNotRecordedEach) {
  metrics::Registry registry;
  metrics::Family<metrics::Counter>& stray = registry.AddCounter(
      "stray_answers_total", "stray answers", {"subscriber"});
  hub_->set_stray_answers_metric(&stray);
  std::shared_ptr<FakeSubscriber> flood =
      Add(Spec("flood"), [](const HookEvent& e) {
        return std::optional<SubscriberAnswer>(Verdict_(e, Verdict::kApprove));
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b,
      Build("t/flood", R"({"type": "Linear", "args": [3, 2]})"));
  ASSERT_EQ(b.registrations.size(), 2u);
  const uint64_t answered = flood->events().at(0).event_id;
  const uintmax_t size_before = std::filesystem::file_size(path_);
  constexpr int kAnswers = 20000;
  constexpr uint64_t kUnknown = uint64_t{1} << 40;
  for (int i = 0; i < kAnswers; ++i) {
    SubscriberAnswer a;
    a.event_id = i % 2 == 0 ? answered : kUnknown + i;
    a.reason = "flood";
    hub_->Answer(flood->id(), a);
  }
  // Still connected, and nothing it held failed.
  ASSERT_EQ(hub_->List().size(), 1u);
  EXPECT_THAT(flood->closed(), IsOk());
  EXPECT_EQ(stray.Labels({"flood"}).value(), uint64_t{kAnswers});
  // The first few are there with their event ids, the rest not yet.
  std::vector<AuditRecord> answers = Answers(2);
  std::vector<uint64_t> ids;
  for (const AuditRecord& r : answers) {
    nlohmann::json details = nlohmann::json::parse(r.details_json);
    if (r.outcome == "approve") continue;
    ids.push_back(details["event_id"].get<uint64_t>());
  }
  EXPECT_THAT(ids, ElementsAre(answered, kUnknown + 1, answered, kUnknown + 3,
                               answered, kUnknown + 5, answered, kUnknown + 7));
  EXPECT_LT(std::filesystem::file_size(path_) - size_before, 8u << 10);
  // Leaving writes the summary.
  flood->Detach();
  answers = Answers(11);
  ASSERT_EQ(answers.size(), 11u);
  const AuditRecord& summary = answers.back();
  EXPECT_EQ(summary.outcome, "ignored");
  nlohmann::json details = nlohmann::json::parse(summary.details_json);
  EXPECT_EQ(details["subscriber"], "flood");
  EXPECT_EQ(details["aggregated"], true);
  EXPECT_EQ(details["count"], kAnswers - 8);
  EXPECT_EQ(details["first_event_id"], answered);
  EXPECT_EQ(details["last_event_id"], kUnknown + kAnswers - 1);
  EXPECT_EQ(details["kinds"].size(), 2u);
  for (const auto& [kind, count] : details["kinds"].items()) {
    EXPECT_EQ(count, (kAnswers - 8) / 2) << kind;
  }
  EXPECT_EQ(details["kinds"].value("no event with this id was sent to this "
                                   "subscriber",
                                   0),
            (kAnswers - 8) / 2);
  // The log is one record per line of a sound chain, and small.
  ASSERT_THAT(log_->Sync(log_->last_seq()), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditVerification verified,
                                  AuditLog::Verify(path_));
  EXPECT_TRUE(verified.ok) << verified.problem;
  EXPECT_LT(std::filesystem::file_size(path_) - size_before, 12u << 10);
}

// What is counted when the server stops is written then; a dry-run
// subscriber's duplicates and unknown ids are counted the same way.
TEST_F(AuditedHubTest, StrayAnswersCountedAtShutdownAreWritten) {
  std::shared_ptr<FakeSubscriber> dry =
      Add(Spec("dry", SubscriberMode::kDryRun), [](const HookEvent& e) {
        return std::optional<SubscriberAnswer>(Verdict_(e, Verdict::kApprove));
      });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b, Build("t/dry", R"({"type": "Linear", "args": [3, 2]})"));
  ASSERT_EQ(Answers(2).size(), 2u);
  const uint64_t answered = dry->events().at(0).event_id;
  for (int i = 0; i < 100; ++i) {
    SubscriberAnswer a;
    a.event_id = i % 2 == 0 ? answered : 999999;
    hub_->Answer(dry->id(), a);
  }
  EXPECT_EQ(Answers(10).size(), 10u);
  hub_->StopStrayAnswers();
  std::vector<AuditRecord> answers = Answers(11);
  ASSERT_EQ(answers.size(), 11u);
  nlohmann::json details = nlohmann::json::parse(answers.back().details_json);
  EXPECT_EQ(details["count"], 92);
  EXPECT_EQ(details["kinds"]["duplicate answer"], 46);
  EXPECT_EQ(details["kinds"]["unknown event id"], 46);
  // Later ones start a new interval: nothing is lost.
  SubscriberAnswer late;
  late.event_id = answered;
  hub_->Answer(dry->id(), late);
  dry->Detach();
  answers = Answers(12);
  ASSERT_EQ(answers.size(), 12u);
  EXPECT_EQ(answers.back().outcome, "ignored");
  details = nlohmann::json::parse(answers.back().details_json);
  EXPECT_EQ(details["event_id"], answered);
}

// A channel that drops what it is sent: a subscriber that reads its events
// and never answers.
class SilentChannel : public SubscriberChannel {
 public:
  void Send(std::shared_ptr<const HookEvent>) override {}
  void Close(absl::Status) override {}
};

// A dry-run subscriber that never answers used to keep each event's module
// and tensors for ten minutes, even after the module was deleted: building
// and deleting 1 GB modules in a loop held them all. Its unanswered runs
// now hold at most max_dry_run_bytes of tensor data (the oldest are
// forgotten first) and never the module.
TEST_F(AuditedHubTest, ASilentDryRunSubscriberHoldsBoundedBytes) {
  hub_->set_max_dry_run_bytes(1000);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      uint64_t id, hub_->Attach(Spec("mute", SubscriberMode::kDryRun),
                                std::make_shared<SilentChannel>(), {}));
  std::weak_ptr<Module> module;
  std::vector<std::weak_ptr<Storage>> storages;
  std::vector<uint64_t> event_ids;
  {
    // Four parameters of 400 bytes: only the last two fit in 1000 bytes.
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        BuildOutcome b, Build("t/mute", R"({"type": "Net", "members": [
            {"parameter": {"name": "a", "shape": [100]}},
            {"parameter": {"name": "b", "shape": [100]}},
            {"parameter": {"name": "c", "shape": [100]}},
            {"parameter": {"name": "d", "shape": [100]}}]})"));
    ASSERT_EQ(b.registrations.size(), 4u);
    module = b.registrations[0].record.owner;
    for (const auto& r : b.registrations) {
      storages.push_back(r.final.value.tensor.storage());
    }
  }
  std::vector<AuditRecord> registrations;
  {
    AuditQuery q;
    q.type = "registration";
    registrations = *log_->Query(q);
  }
  ASSERT_EQ(registrations.size(), 4u);
  ASSERT_THAT(store_.Delete({"alice", "req-2"}, *ParseModuleName("t/mute")),
              IsOk());
  EXPECT_TRUE(module.expired()) << "a dry run keeps the deleted module";
  EXPECT_TRUE(storages[0].expired());
  EXPECT_TRUE(storages[1].expired());
  EXPECT_FALSE(storages[2].expired());
  EXPECT_FALSE(storages[3].expired());
  // The two it may still answer are answered; the forgotten ones are
  // unknown to it.
  for (const AuditRecord& r : registrations) {
    SubscriberAnswer a;
    a.event_id = nlohmann::json::parse(r.details_json)["event_id"];
    hub_->Answer(id, a);
  }
  std::vector<std::string> outcomes;
  for (const AuditRecord& r : Answers(4)) outcomes.push_back(r.outcome);
  EXPECT_THAT(outcomes,
              ElementsAre("invalid", "invalid", "approve", "approve"));
  EXPECT_TRUE(storages[2].expired());
  EXPECT_TRUE(storages[3].expired());
  hub_->Detach(id, {});
}

// The bound is on every dry run together: four silent dry-run subscribers
// of one client, each filtering another parameter (so that their runs
// differ), held 400 bytes each, 1600 in all, over a bound of 1000; a client
// holds what one subscriber may, however many names it subscribes under.
TEST_F(AuditedHubTest, SilentDryRunSubscribersTogetherHoldBoundedBytes) {
  hub_->set_max_dry_run_bytes(1000);
  std::vector<uint64_t> ids;
  for (const char* name : {"a", "b", "c", "d"}) {
    SubscriptionSpec spec =
        Spec(absl::StrCat("mute-", name), SubscriberMode::kDryRun);
    spec.filter.name_glob = name;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        uint64_t id, hub_->Attach(spec, std::make_shared<SilentChannel>(), {}));
    ids.push_back(id);
  }
  std::vector<std::weak_ptr<Storage>> storages;
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        BuildOutcome b, Build("t/mute", R"({"type": "Net", "members": [
            {"parameter": {"name": "a", "shape": [100]}},
            {"parameter": {"name": "b", "shape": [100]}},
            {"parameter": {"name": "c", "shape": [100]}},
            {"parameter": {"name": "d", "shape": [100]}}]})"));
    ASSERT_EQ(b.registrations.size(), 4u);
    for (const auto& r : b.registrations) {
      storages.push_back(r.final.value.tensor.storage());
    }
  }
  AuditQuery q;
  q.type = "registration";
  std::vector<AuditRecord> registrations = *log_->Query(q);
  ASSERT_EQ(registrations.size(), 4u);
  ASSERT_THAT(store_.Delete({"alice", "req-2"}, *ParseModuleName("t/mute")),
              IsOk());
  EXPECT_TRUE(storages[0].expired());
  EXPECT_TRUE(storages[1].expired());
  EXPECT_FALSE(storages[2].expired());
  EXPECT_FALSE(storages[3].expired());
  // Each subscriber answers its own event: the forgotten ones are unknown.
  for (size_t i = 0; i < registrations.size(); ++i) {
    SubscriberAnswer a;
    a.event_id =
        nlohmann::json::parse(registrations[i].details_json)["event_id"];
    hub_->Answer(ids[i], a);
  }
  std::vector<std::string> outcomes;
  for (const AuditRecord& r : Answers(4)) outcomes.push_back(r.outcome);
  EXPECT_THAT(outcomes,
              ElementsAre("invalid", "invalid", "approve", "approve"));
  EXPECT_TRUE(storages[2].expired());
  EXPECT_TRUE(storages[3].expired());
  for (uint64_t id : ids) hub_->Detach(id, {});
}

// The bound forgets older runs, never the newest: a tensor larger than the
// bound alone is still answered (it used to be forgotten as it was sent).
TEST_F(AuditedHubTest, ADryRunOfATensorOverTheBoundIsStillAnswered) {
  hub_->set_max_dry_run_bytes(1000);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      uint64_t id, hub_->Attach(Spec("mute", SubscriberMode::kDryRun),
                                std::make_shared<SilentChannel>(), {}));
  ASSERT_THAT(Build("t/big", R"({"type": "Net", "members": [
                  {"parameter": {"name": "w", "shape": [1000]}}]})")
                  .status(),
              IsOk());
  AuditQuery q;
  q.type = "registration";
  std::vector<AuditRecord> registrations = *log_->Query(q);
  ASSERT_EQ(registrations.size(), 1u);
  SubscriberAnswer a;
  a.event_id = nlohmann::json::parse(registrations[0].details_json)["event_id"];
  hub_->Answer(id, a);
  std::vector<AuditRecord> answers = Answers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].outcome, "approve") << answers[0].details_json;
  hub_->Detach(id, {});
}

// A subscriber's reason is kept up to 1 KiB: the log keeps its records for
// good, and each reason used to be copied whole into the answer's and the
// outcome's records (3 MiB reasons grew the log by 15 MiB for one Linear).
TEST_F(AuditedHubTest, ALongReasonIsCutBeforeItIsRecorded) {
  const std::string reason(100 << 10, 'x');
  Add(Spec("verbose"), [&](const HookEvent& e) {
    return std::optional<SubscriberAnswer>(
        Verdict_(e, Verdict::kReject, reason));
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b,
      Build("t/verbose", R"({"type": "Linear", "args": [3, 2]})"));
  for (const auto& r : b.registrations) {
    EXPECT_TRUE(r.final.blocked());
    EXPECT_LE(r.final.reason.size(), 1100u);
    EXPECT_THAT(r.final.reason, HasSubstr("...[102400 bytes]"));
  }
  AuditQuery q;
  q.limit = 100;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> records,
                                  log_->Query(q));
  for (const AuditRecord& r : records) {
    EXPECT_LT(r.details_json.size(), 2048u) << r.type;
  }
}

// A dry-run subscriber's answer counts only for an event it was sent: one
// of another namespace, sent to another dry-run subscriber, used to be
// recorded against that namespace's module as if it had reviewed it.
TEST_F(AuditedHubTest, ADryRunAnswerForAnotherSubscribersEventIsInvalid) {
  SubscriptionSpec b = Spec("dry-b", SubscriberMode::kDryRun);
  b.filter.namespaces = {"team-b"};
  auto sb = Add(b, [](const HookEvent&) {
    return std::optional<SubscriberAnswer>();  // never answers
  });
  SubscriptionSpec a = Spec("dry-a", SubscriberMode::kDryRun);
  a.filter.namespaces = {"team-a"};
  auto sa = Add(
      a, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  ASSERT_THAT(
      Build("team-b/secret", R"({"type": "Linear", "args": [3, 2]})").status(),
      IsOk());
  ASSERT_EQ(sb->WaitUntilReceived(2, absl::Seconds(10)), 2);
  SubscriberAnswer meddle;
  meddle.event_id = sb->events()[0].event_id;
  meddle.verdict = Verdict::kReject;
  hub_->Answer(sa->id(), meddle);
  std::vector<AuditRecord> answers = Answers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].outcome, "invalid");
  EXPECT_EQ(answers[0].module, "");
  EXPECT_EQ(sa->events().size(), 0u);
}

// A dry-run subscriber's undecodable answer to an event it was sent is
// recorded under that event too, with its decoding problem; one for an
// event it was never sent is an unknown event id.
TEST_F(AuditedHubTest, ADryRunsUndecodableAnswerIsRecordedUnderItsEvent) {
  auto dry = Add(Spec("dry", SubscriberMode::kDryRun), [](const HookEvent&) {
    return std::optional<SubscriberAnswer>();
  });
  ASSERT_THAT(Build("t/dry", R"({"type": "Linear", "args": [3, 2]})").status(),
              IsOk());
  ASSERT_EQ(dry->WaitUntilReceived(2, absl::Seconds(10)), 2);
  SubscriberAnswer bad;
  bad.event_id = dry->events()[0].event_id;
  bad.verdict = Verdict::kModify;
  bad.invalid = "answer.replacement.data: has 1 bytes but needs 24";
  hub_->Answer(dry->id(), bad);
  bad.event_id = 999999;
  hub_->Answer(dry->id(), bad);
  std::vector<AuditRecord> answers = Answers(2);
  ASSERT_EQ(answers.size(), 2u);
  nlohmann::json first = nlohmann::json::parse(answers[0].details_json);
  EXPECT_EQ(answers[0].outcome, "invalid");
  EXPECT_EQ(answers[0].module, "dry");
  EXPECT_EQ(first["event_id"], dry->events()[0].event_id);
  EXPECT_THAT(first["problem"].get<std::string>(), HasSubstr("has 1 bytes"));
  nlohmann::json second = nlohmann::json::parse(answers[1].details_json);
  EXPECT_EQ(answers[1].outcome, "invalid");
  EXPECT_EQ(second["problem"], "unknown event id");
}

// The subscribe record says what the subscriber selects and whether it is
// sent tensor values: the log used to give neither.
TEST_F(AuditedHubTest, TheSubscribeRecordGivesFiltersAndData) {
  SubscriptionSpec spec = Spec("watcher", SubscriberMode::kObserve);
  spec.filter.kinds = {EntryKind::kBuffer};
  spec.filter.namespaces = {"team-a"};
  spec.filter.name_glob = "running_*";
  spec.visible_namespaces = {"team-a", "team-b"};
  spec.include_data = true;
  spec.max_data_bytes = 4096;
  Add(spec, [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  Add(Spec("plain"),
      [](const HookEvent&) { return std::optional<SubscriberAnswer>(); });
  AuditQuery q;
  q.type = "subscribe";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> records,
                                  log_->Query(q));
  ASSERT_EQ(records.size(), 2u);
  nlohmann::json d = nlohmann::json::parse(records[0].details_json);
  EXPECT_EQ(d["filter"]["kinds"], nlohmann::json::array({"buffer"}));
  EXPECT_EQ(d["filter"]["namespaces"], nlohmann::json::array({"team-a"}));
  EXPECT_EQ(d["filter"]["name_glob"], "running_*");
  EXPECT_EQ(d["visible_namespaces"],
            nlohmann::json::array({"team-a", "team-b"}));
  EXPECT_EQ(d["max_data_bytes"], 4096);
  nlohmann::json plain = nlohmann::json::parse(records[1].details_json);
  EXPECT_FALSE(plain.contains("filter"));
  EXPECT_FALSE(plain.contains("max_data_bytes"));
  EXPECT_FALSE(plain.contains("visible_namespaces"));
}

TEST(HubAuditTest, EventsAnswersAndOutcomesAreAudited) {
  std::string path =
      ::testing::TempDir() + "/hub_audit_" + std::to_string(getpid()) + ".log";
  std::filesystem::remove(path);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log,
                                  AuditLog::Open(path));
  SubscriberHub hub(log.get());
  ModelStore store;
  store.set_decider(&hub);
  store.set_audit_log(log.get());
  auto s = std::make_shared<FakeSubscriber>(&hub, [](const HookEvent& e) {
    return Verdict_(e, e.name == "bias" ? Verdict::kReject : Verdict::kApprove,
                    "no bias");
  });
  ASSERT_THAT(s->Attach(Spec("auditor")), IsOk());
  BuildOptions o;
  o.hooks = nullptr;
  ASSERT_THAT(store.Build({"bob", "req-9"}, *ParseModuleName("team/lin"),
                          SpecFromJson(R"({"type": "Linear", "args": [3, 2]})"),
                          o, false),
              IsOk());
  s->StopWorker();
  AuditQuery q;
  q.limit = 100;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> records,
                                  log->Query(q));
  std::vector<std::string> types;
  for (const AuditRecord& r : records)
    types.push_back(r.type + ":" + r.outcome);
  EXPECT_THAT(types,
              ElementsAre("subscribe:ok", "registration:", "registration:",
                          "answer:approve", "answer:reject", "outcome:keep",
                          "outcome:block", "build:ok"));
  const AuditRecord& answer = records[4];
  EXPECT_EQ(answer.identity, "bob");
  EXPECT_EQ(answer.correlation_id, "req-9");
  EXPECT_EQ(answer.ns, "team");
  EXPECT_EQ(answer.module, "lin");
  nlohmann::json details = nlohmann::json::parse(answer.details_json);
  EXPECT_EQ(details["subscriber"], "auditor");
  EXPECT_TRUE(details.contains("latency_ms"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditVerification v, AuditLog::Verify(path));
  EXPECT_TRUE(v.ok) << v.problem;
  EXPECT_EQ(v.records, records.size());
  std::filesystem::remove(path);
}

// An answer whose event id was read but whose rest could not be decoded
// (here: replacement bytes that do not match their shape, as the transport
// reports them) is an invalid answer for that event: it alone fails, and
// its record names it. It used to count as garbage, failing every other
// event the subscriber held, and was recorded under event 0.
TEST_F(AuditedHubTest, AnUndecodableAnswerFailsOnlyTheEventItNames) {
  Add(Spec("sloppy"), [](const HookEvent& e) {
    SubscriberAnswer a = Verdict_(e, Verdict::kApprove);
    if (e.name == "weight") {
      a.verdict = Verdict::kModify;
      a.invalid = "answer.replacement.data: has 1 bytes but needs 24";
    }
    return std::optional<SubscriberAnswer>(a);
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildOutcome b,
      Build("t/sloppy", R"({"type": "Linear", "args": [3, 2]})"));
  ASSERT_EQ(b.registrations.size(), 2u);
  EXPECT_TRUE(b.registrations[0].final.blocked());
  EXPECT_THAT(b.registrations[0].final.reason,
              HasSubstr("sent an invalid answer: answer.replacement.data"));
  EXPECT_FALSE(b.registrations[1].final.blocked())
      << b.registrations[1].final.reason;
  std::vector<AuditRecord> answers = Answers(3);
  uint64_t weight_event = 0;
  int invalid = 0;
  for (const AuditRecord& r : answers) {
    nlohmann::json details = nlohmann::json::parse(r.details_json);
    if (r.outcome == "failed-closed") weight_event = details["event_id"];
    if (r.outcome != "invalid") continue;
    ++invalid;
    EXPECT_EQ(r.module, "sloppy");
    EXPECT_THAT(details["problem"].get<std::string>(),
                HasSubstr("has 1 bytes"));
  }
  EXPECT_EQ(invalid, 1);
  for (const AuditRecord& r : answers) {
    nlohmann::json details = nlohmann::json::parse(r.details_json);
    if (r.outcome == "invalid") {
      EXPECT_EQ(details["event_id"], weight_event);
    }
  }
  EXPECT_NE(weight_event, 0u);
}

TEST_F(AuditedHubTest, NameOwnersOutliveTheHubThroughTheAuditLog) {
  auto approve = [](const HookEvent& e) {
    return Verdict_(e, Verdict::kApprove);
  };
  SubscriptionSpec owned = Spec("rev-guard");
  owned.owner_identity = "rev";
  SubscriptionSpec open = Spec("anyone");  // no owner: no authentication
  Add(owned, approve)->Detach();
  Add(open, approve)->Detach();
  for (auto& s : subscribers_) s->StopWorker();

  // A new hub on the same log, as after a restart.
  SubscriberHub restarted(log_.get());
  EXPECT_THAT(restarted.RestoreNameOwners(), IsOkAndHolds(1u));
  auto attach = [&](SubscriptionSpec spec) {
    auto s = std::make_shared<FakeSubscriber>(&restarted, approve);
    absl::Status status = s->Attach(std::move(spec));
    if (status.ok()) {
      s->Detach();
      s->StopWorker();
    }
    return status;
  };
  SubscriptionSpec thief = owned;
  thief.owner_identity = "root";
  EXPECT_THAT(attach(thief),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("subscriber 'rev-guard' belongs to 'rev'")));
  EXPECT_THAT(attach(owned), IsOk());
  SubscriptionSpec first_claim = open;
  first_claim.owner_identity = "root";
  EXPECT_THAT(attach(first_claim), IsOk());
}

}  // namespace
}  // namespace modelstate
