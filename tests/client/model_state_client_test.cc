// The client library's audit and subscriber calls against the real server:
// QueryAudit's pages, VerifyAudit, the WatchAudit stream (replay, live
// records, Cancel from another thread, deadline, Finish before the end) and
// ListSubscribers.
#include "client/model_state_client.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "client/subscriber.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::SharedServerTest;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

constexpr char kRelu[] = R"({"type": "ReLU"})";

class ModelStateClientTest : public SharedServerTest {
 protected:
  void Build(const std::string& module) {
    ASSERT_THAT(client_->BuildModule(BuildRequest(module, kRelu)), IsOk());
  }
};

std::vector<std::string> Modules(const v1::QueryAuditResponse& response) {
  std::vector<std::string> modules;
  for (const v1::AuditRecordProto& r : response.records()) {
    modules.push_back(r.namespace_() + "/" + r.module());
  }
  return modules;
}

TEST_F(ModelStateClientTest, QueryAuditPagesThroughTheMatchingRecords) {
  Build("pages/a");
  Build("pages/b");
  Build("pages/c");
  v1::QueryAuditRequest request;
  request.mutable_filter()->set_namespace_("pages");
  request.mutable_filter()->set_type("build");
  request.set_limit(2);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::QueryAuditResponse first,
                                  client_->QueryAudit(request));
  EXPECT_THAT(Modules(first), ElementsAre("pages/a", "pages/b"));
  ASSERT_NE(first.next_after_seq(), 0u);
  EXPECT_LT(first.records(0).seq(), first.records(1).seq());

  request.set_after_seq(first.next_after_seq());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::QueryAuditResponse second,
                                  client_->QueryAudit(request));
  EXPECT_THAT(Modules(second), ElementsAre("pages/c"));
  EXPECT_EQ(second.next_after_seq(), 0u);
}

// TypeModule is torch's module.type(dtype): integer buffers convert too
// (to() leaves them), and the audit record says which call it was.
TEST_F(ModelStateClientTest, TypeModuleConvertsEveryTensor) {
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  "typed/bn", R"({"type": "BatchNorm1d", "args": [2]})")),
              IsOk());
  absl::StatusOr<v1::MoveModuleResponse> typed =
      client_->TypeModule("typed/bn", "float64");
  ASSERT_THAT(typed, IsOk());
  ASSERT_EQ(typed->info().buffers_size(), 3);
  for (const v1::EntryInfo& e : typed->info().buffers()) {
    EXPECT_EQ(e.tensor().dtype(), v1::DTYPE_FLOAT64) << e.name();
  }
  for (const v1::EntryInfo& e : typed->info().parameters()) {
    EXPECT_EQ(e.tensor().dtype(), v1::DTYPE_FLOAT64) << e.name();
  }
  ASSERT_EQ(typed->audit_seqs_size(), 1);
  v1::QueryAuditRequest query;
  query.set_after_seq(typed->audit_seqs(0) - 1);
  query.set_limit(1);
  absl::StatusOr<v1::QueryAuditResponse> record = client_->QueryAudit(query);
  ASSERT_THAT(record, IsOk());
  ASSERT_EQ(record->records_size(), 1);
  EXPECT_EQ(record->records(0).type(), "move");
  EXPECT_THAT(record->records(0).details_json(), HasSubstr("convert_all"));

  // An integer dtype while a parameter requires grad is torch's error; an
  // unknown dtype the server's INVALID_ARGUMENT.
  EXPECT_THAT(client_->TypeModule("typed/bn", "int32"),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("requires gradients must be floating")));
  EXPECT_THAT(client_->TypeModule("typed/bn", "float17"),
              StatusIs(Code::kInvalidArgument, HasSubstr("float17")));
}

TEST_F(ModelStateClientTest, QueryAuditNamesABadFilterField) {
  v1::QueryAuditRequest request;
  request.mutable_filter()->set_since("yesterday");
  EXPECT_THAT(client_->QueryAudit(request),
              StatusIs(Code::kInvalidArgument, HasSubstr("filter.since")));
}

TEST_F(ModelStateClientTest, VerifyAuditReportsAnIntactChain) {
  Build("verify/relu");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::VerifyAuditResponse verified,
                                  client_->VerifyAudit());
  EXPECT_TRUE(verified.ok()) << verified.problem();
  EXPECT_GT(verified.records(), 0u);
  EXPECT_EQ(verified.broken_seq(), 0u);
}

v1::WatchAuditRequest WatchBuilds(const std::string& ns) {
  v1::WatchAuditRequest request;
  request.mutable_filter()->set_namespace_(ns);
  request.mutable_filter()->set_type("build");
  return request;
}

TEST_F(ModelStateClientTest, WatchAuditReplaysThenFollowsUntilCancelled) {
  Build("watch/old");
  std::unique_ptr<client::AuditWatch> watch =
      client_->WatchAudit(WatchBuilds("watch"), absl::Seconds(60));
  v1::AuditRecordProto record;
  ASSERT_TRUE(watch->Next(&record));
  EXPECT_EQ(record.module(), "old");
  // A record written while the stream is open comes as it is written.
  Build("watch/new");
  ASSERT_TRUE(watch->Next(&record));
  EXPECT_EQ(record.module(), "new");
  EXPECT_EQ(record.type(), "build");

  // Cancel() from another thread ends a Next() that waits for more.
  std::thread canceller([&watch] { watch->Cancel(); });
  EXPECT_FALSE(watch->Next(&record));
  canceller.join();
  EXPECT_THAT(watch->Finish(), StatusIs(Code::kCancelled));
  // Finished is finished: the same status, and no more records.
  EXPECT_THAT(watch->Finish(), StatusIs(Code::kCancelled));
  EXPECT_FALSE(watch->Next(&record));
}

TEST_F(ModelStateClientTest, WatchAuditEndsAtItsDeadline) {
  std::unique_ptr<client::AuditWatch> watch =
      client_->WatchAudit(WatchBuilds("nothing-here"), absl::Milliseconds(300));
  v1::AuditRecordProto record;
  EXPECT_FALSE(watch->Next(&record));
  EXPECT_THAT(watch->Finish(), StatusIs(Code::kDeadlineExceeded));
}

TEST_F(ModelStateClientTest, WatchAuditFinishBeforeTheEndCancels) {
  // No deadline: without the cancel in Finish() this would wait forever.
  std::unique_ptr<client::AuditWatch> watch =
      client_->WatchAudit(WatchBuilds("nothing-here"));
  EXPECT_THAT(watch->Finish(), StatusIs(Code::kCancelled));
  // The destructor of a watch never read does not wait either.
  watch = client_->WatchAudit(WatchBuilds("nothing-here"));
  watch.reset();
}

TEST_F(ModelStateClientTest, WatchAuditNamesABadFilterField) {
  v1::WatchAuditRequest request;
  request.mutable_filter()->set_until("soon");
  std::unique_ptr<client::AuditWatch> watch =
      client_->WatchAudit(request, absl::Seconds(30));
  v1::AuditRecordProto record;
  EXPECT_FALSE(watch->Next(&record));
  EXPECT_THAT(watch->Finish(),
              StatusIs(Code::kInvalidArgument, HasSubstr("filter.until")));
}

bool Lists(const v1::ListSubscribersResponse& response, const std::string& name,
           uint64_t id) {
  for (const v1::SubscriberInfoProto& s : response.subscribers()) {
    if (s.subscription().name() == name && s.subscriber_id() == id) {
      return true;
    }
  }
  return false;
}

TEST_F(ModelStateClientTest, ListSubscribersShowsARunningSubscriber) {
  v1::Subscription subscription;
  subscription.set_name("lister");
  subscription.set_mode(v1::Subscription::MODE_OBSERVE);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<client::Subscriber> subscriber,
      client::Subscriber::Start(
          *client_, subscription,
          [](const v1::HookEventProto&) { return v1::HookAnswer(); }));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(v1::ListSubscribersResponse listed,
                                  client_->ListSubscribers());
  EXPECT_TRUE(Lists(listed, "lister", subscriber->id()));

  ASSERT_THAT(subscriber->Unsubscribe(), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(listed, client_->ListSubscribers());
  EXPECT_FALSE(Lists(listed, "lister", subscriber->id()));
}

}  // namespace
}  // namespace modelstate
