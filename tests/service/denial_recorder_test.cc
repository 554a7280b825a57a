// DenialRecorder: refused calls are audited once per key and interval, the
// rest counted; the table of keys is bounded; request ids are capped.
#include "service/denial_recorder.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "service/audit_aggregator.h"
#include "service/audit_log.h"
#include "service/authenticator.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using Json = nlohmann::json;

class DenialRecorderTest : public ::testing::Test {
 protected:
  DenialRecorderTest() {
    path_ = ::testing::TempDir() + "/denials_" + std::to_string(getpid()) +
            "_" + std::to_string(counter_++) + ".log";
    std::filesystem::remove(path_);
    log_ = *AuditLog::Open(path_);
  }
  ~DenialRecorderTest() override { std::filesystem::remove(path_); }

  std::vector<AuditRecord> All() {
    AuditQuery q;
    q.limit = AuditQuery::kMaxLimit;
    return *log_->Query(q);
  }

  static OperationContext Ctx(const std::string& identity) {
    OperationContext ctx;
    ctx.identity = identity;
    ctx.correlation_id = "req";
    return ctx;
  }

  static inline int counter_ = 0;
  std::string path_;
  std::unique_ptr<AuditLog> log_;
};

const absl::Status kBadToken =
    absl::UnauthenticatedError("authorization: the bearer token is not valid");

TEST_F(DenialRecorderTest, TheFirstOfAKeyIsRecordedAtOnceTheRestCounted) {
  DenialRecorder denials(log_.get(), absl::Hours(1), 8);
  for (int i = 0; i < 1000; ++i) {
    // Each call from its own port: one client, one key.
    denials.Record(Ctx(""), absl::StrCat("ipv4:10.0.0.7:", 40000 + i),
                   "GetModule", ModuleName{}, kBadToken);
  }
  std::vector<AuditRecord> records = All();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(Json::parse(records[0].details_json)["peer"],
            "ipv4:10.0.0.7:40000");
  EXPECT_EQ(records[0].correlation_id, "req");
  denials.Flush();
  records = All();
  ASSERT_EQ(records.size(), 2u);
  Json counted = Json::parse(records[1].details_json);
  EXPECT_EQ(records[1].type, "denied");
  EXPECT_EQ(records[1].correlation_id, "");
  EXPECT_EQ(counted["count"], 999);
  EXPECT_EQ(counted["aggregated"], true);
  EXPECT_EQ(counted["peer"], "ipv4:10.0.0.7");
  EXPECT_EQ(counted["rpc"], "GetModule");
  EXPECT_EQ(counted["error"]["code"], "UNAUTHENTICATED");
  EXPECT_LE(counted["first"].get<std::string>(),
            counted["last"].get<std::string>());
  // A new interval: the key's first refusal is recorded at once again.
  denials.Record(Ctx(""), "ipv4:10.0.0.7:1", "GetModule", ModuleName{},
                 kBadToken);
  EXPECT_EQ(All().size(), 3u);
  denials.Flush();
  EXPECT_EQ(All().size(), 3u);  // nothing was counted
}

TEST_F(DenialRecorderTest, ARefusalInANamespaceIsCountedInIt) {
  DenialRecorder denials(log_.get(), absl::Hours(1), 8);
  const absl::Status no = absl::PermissionDeniedError("'rita' may not");
  for (int i = 0; i < 5; ++i) {
    denials.Record(Ctx("rita"), "ipv4:10.0.0.8:1", "DeleteModule",
                   ModuleName{"team-a", "base"}, no);
  }
  denials.Stop();
  std::vector<AuditRecord> records = All();
  ASSERT_EQ(records.size(), 2u);
  for (const AuditRecord& r : records) {
    EXPECT_EQ(r.ns, "team-a");
    EXPECT_EQ(r.module, "base");
    EXPECT_EQ(r.identity, "rita");
  }
  EXPECT_EQ(Json::parse(records[1].details_json)["count"], 4);
}

TEST_F(DenialRecorderTest, KeysBeyondTheBoundShareOneOtherKey) {
  DenialRecorder denials(log_.get(), absl::Hours(1), 3);
  for (int i = 0; i < 100; ++i) {
    for (int repeat = 0; repeat < 2; ++repeat) {
      denials.Record(Ctx(""), absl::StrCat("ipv4:10.1.0.", i, ":5"),
                     "GetModule", ModuleName{}, kBadToken);
    }
  }
  // Three keys and the other key: each one record at once, one counted.
  EXPECT_EQ(All().size(), 4u);
  denials.Flush();
  std::vector<AuditRecord> records = All();
  ASSERT_EQ(records.size(), 8u);
  uint64_t total = 4;  // the four recorded at once
  bool other = false;
  for (size_t i = 4; i < records.size(); ++i) {
    Json d = Json::parse(records[i].details_json);
    total += d["count"].get<uint64_t>();
    if (d["peer"] == "*") {
      other = true;
      EXPECT_EQ(d["count"], 2 * 97 - 1);
      EXPECT_EQ(records[i].ns, "");
      EXPECT_EQ(d["error"]["code"], "RESOURCE_EXHAUSTED");
    }
  }
  EXPECT_TRUE(other);
  EXPECT_EQ(total, 200u);
}

TEST_F(DenialRecorderTest, IntervalsEndOnTheirOwn) {
  DenialRecorder denials(log_.get(), absl::Milliseconds(100), 8);
  for (int i = 0; i < 3; ++i) {
    denials.Record(Ctx(""), "ipv4:10.0.0.7:1", "GetModule", ModuleName{},
                   kBadToken);
  }
  for (int i = 0; i < 100 && All().size() < 2; ++i) usleep(20'000);
  std::vector<AuditRecord> records = All();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(Json::parse(records[1].details_json)["count"], 2);
}

TEST_F(DenialRecorderTest, IntervalZeroRecordsEveryRefusal) {
  DenialRecorder denials(log_.get(), absl::ZeroDuration(), 8);
  for (int i = 0; i < 5; ++i) {
    denials.Record(Ctx(""), "ipv4:10.0.0.7:1", "GetModule", ModuleName{},
                   kBadToken);
  }
  denials.Stop();
  EXPECT_EQ(All().size(), 5u);
}

// The counting DenialRecorder and the hub's stray answers share: several
// own records per key, a flushed key keeps what it used of the interval,
// and kinds are bounded.
TEST_F(DenialRecorderTest, AggregatorKeepsABudgetPerKeyAndBoundsKinds) {
  AuditAggregator counts(
      log_.get(), absl::Hours(1), 4, 3, [](const AuditTally& t) {
        AuditRecord r;
        r.type = "denied";
        r.outcome = "overflow";
        r.details_json = absl::StrCat("{\"count\":", t.count, "}");
        return r;
      });
  auto record = [&](const std::string& key, const std::string& kind,
                    uint64_t id) {
    return counts.Record(
        {.key = key, .kind = kind, .id = id},
        [&] {
          AuditRecord r;
          r.type = "denied";
          r.outcome = "own";
          r.details_json = absl::StrCat("{\"id\":", id, "}");
          return r;
        },
        [&]() -> AuditAggregator::Summarise {
          return [key](const AuditTally& t) {
            AuditRecord r;
            r.type = "denied";
            r.outcome = "summary";
            Json kinds = Json::object();
            for (const auto& [k, n] : t.kinds) kinds[k] = n;
            r.details_json = Json{
                {"key", key},
                {"count", t.count},
                {"first_id", t.first_id},
                {"last_id", t.last_id},
                {"kinds", kinds}}.dump();
            return r;
          };
        });
  };
  for (uint64_t i = 1; i <= 40; ++i) {
    EXPECT_EQ(record("a", absl::StrCat("kind", i), i), i <= 3) << i;
  }
  EXPECT_EQ(All().size(), 3u);
  counts.FlushKey("a");
  std::vector<AuditRecord> all = All();
  ASSERT_EQ(all.size(), 4u);
  Json summary = Json::parse(all.back().details_json);
  EXPECT_EQ(summary["count"], 37);
  EXPECT_EQ(summary["first_id"], 4);
  EXPECT_EQ(summary["last_id"], 40);
  EXPECT_EQ(summary["kinds"].size(), AuditTally::kMaxKinds + 1);
  EXPECT_EQ(summary["kinds"]["other"], 37 - AuditTally::kMaxKinds);
  // Back after the flush, in the same interval: counted at once.
  EXPECT_FALSE(record("a", "again", 41));
  counts.FlushKey("a");
  ASSERT_EQ(All().size(), 5u);
  EXPECT_EQ(Json::parse(All().back().details_json)["count"], 1);
  // Keys beyond the bound share the overflow key, which has its own
  // records first, then its summary.
  for (int k = 0; k < 10; ++k) record(absl::StrCat("k", k), "", 0);
  counts.Stop();
  all = All();
  size_t overflow = 0;
  for (const AuditRecord& r : all) overflow += r.outcome == "overflow";
  EXPECT_EQ(overflow, 1u);
  EXPECT_EQ(Json::parse(all.back().details_json)["count"], 4);
}

TEST(PeerAddressTest, DropsThePortOnly) {
  EXPECT_EQ(PeerAddress("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(PeerAddress("ipv6:[::1]"), "ipv6:[::1]");
  EXPECT_EQ(PeerAddress("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(PeerAddress("inproc"), "inproc");
}

TEST(CappedRequestIdTest, LongIdsAreCutWithAMarker) {
  EXPECT_EQ(CappedRequestId("req-7"), "req-7");
  const std::string fits(kMaxRequestIdBytes, 'x');
  EXPECT_EQ(CappedRequestId(fits), fits);
  const std::string capped = CappedRequestId(std::string(7000, 'y'));
  EXPECT_LE(capped.size(), kMaxRequestIdBytes);
  EXPECT_TRUE(absl::StartsWith(capped, "yyyy"));
  EXPECT_TRUE(absl::EndsWith(capped, "...[7000 bytes]")) << capped;
  // Never cut inside a UTF-8 character ("é" is 2 bytes).
  std::string accents;
  while (accents.size() < 300) accents += "\xc3\xa9";
  const std::string cut = CappedRequestId(accents);
  const size_t body = cut.find("...[");
  ASSERT_NE(body, std::string::npos);
  EXPECT_EQ(body % 2, 0u);
}

}  // namespace
}  // namespace modelstate
